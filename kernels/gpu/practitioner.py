"""The practitioner's training step: Hugging Face's GPT-2 trained with SDPA and with the book's
fix (the FlashAttention-2 kernels with δ from rowsum(dP∘P), :mod:`kernels.attention.hf_attention`),
eager and under ``torch.compile``, in steps per second.

A kernel benchmark times the attention alone; a reader's loop also pays Python per call, the
optimizer and everything around it. This module times that loop as a reader writes it: bf16
autocast, AdamW, gradient clipping, one batch of random tokens per step, no dropout (the book's
attention refuses attention dropout, so SDPA runs without it too). Run ::

    python -m kernels.gpu.practitioner --out $OUT

It writes ``practitioner_step.json`` (provenance: GPU, torch, triton, date, command): one row per
model, implementation and mode, with steps/s and ``ratio_to_sdpa`` (the same model and mode with
SDPA). On a CPU it runs too, at :data:`TINY` sizes, which checks the code and measures nothing
worth keeping.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from ..results import save

# (name, layers, width, heads, context, batch, vocabulary)
MODELS = {
    "chapter 7's GPT-2": (4, 256, 4, 256, 32, 256),
    "GPT-2 small": (12, 768, 12, 1024, 8, 50257),
}
TINY = {"tiny GPT-2": (2, 32, 2, 32, 2, 64)}  # for a CPU: checks the code, times nothing real
IMPLEMENTATIONS = ("sdpa", "book, δ from dP∘P")
MODES = ("eager", "compiled")


def _attn_name(implementation: str) -> str:
    from ..attention import hf_attention

    return "sdpa" if implementation == "sdpa" else hf_attention.register()


def build(sizes: tuple, implementation: str, device) -> torch.nn.Module:
    """A freshly initialised ``GPT2LMHeadModel`` of ``sizes`` with ``implementation``."""
    from transformers import GPT2Config, GPT2LMHeadModel, logging as hf_logging

    hf_logging.set_verbosity_error()
    layers, width, heads, context, _, vocab = sizes
    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads,
        n_positions=context,
        vocab_size=vocab,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_implementation=_attn_name(implementation),
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).to(device)


def train_steps(model, sizes: tuple, steps: int, device, compiled: bool = False) -> list:
    """Train ``steps`` steps (a reader's loop) and return the losses as tensors (no host sync
    inside the loop, as a loop that logs every hundredth step would have)."""
    *_, context, batch, vocab = sizes
    step_fn = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
    dtype = torch.bfloat16
    tokens = torch.randint(0, vocab, (steps, batch, context), device=device)
    losses = []
    for step in range(steps):
        with torch.autocast(torch.device(device).type, dtype=dtype):
            loss = step_fn(tokens[step], labels=tokens[step]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def steps_per_second(sizes, implementation, mode, device, steps, warmup) -> dict:
    """One row: warm up (compiling and autotuning happen there), then time ``steps`` steps."""
    model = build(sizes, implementation, device)
    compiled = mode == "compiled"
    losses = train_steps(model, sizes, warmup, device, compiled)
    _sync(device)
    start = time.perf_counter()
    losses += train_steps(model, sizes, steps, device, compiled)
    _sync(device)
    seconds = time.perf_counter() - start
    final = float(losses[-1])
    return {
        "implementation": implementation,
        "mode": mode,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "final_loss": final,
    }


def measure(models: dict, device, steps: int, warmup: int, modes=MODES, log=print) -> list:
    """Every model × implementation × mode, each row with its ratio to SDPA."""
    from tqdm.auto import tqdm

    rows = []
    plan = [(m, i, mode) for m in models for mode in modes for i in IMPLEMENTATIONS]
    for name, implementation, mode in tqdm(plan, desc="practitioner steps"):
        sizes = models[name]
        row = steps_per_second(sizes, implementation, mode, device, steps, warmup)
        layers, width, heads, context, batch, vocab = sizes
        row = {"model": name, "layers": layers, "width": width, "heads": heads,
               "context": context, "batch": batch, "vocab": vocab, **row}  # fmt: skip
        if not math.isfinite(row["final_loss"]):
            raise FloatingPointError(f"{name}, {implementation}, {mode}: the loss is not finite")
        rows.append(row)
        log(f"{name:18s} {implementation:18s} {mode:9s} {row['steps_per_s']:8.1f} steps/s")
    for row in rows:
        sdpa = next(
            r for r in rows
            if (r["model"], r["mode"], r["implementation"]) == (row["model"], row["mode"], "sdpa")
        )  # fmt: skip
        row["ratio_to_sdpa"] = row["steps_per_s"] / sdpa["steps_per_s"]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for practitioner_step.json")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--eager-only", action="store_true", help="skip torch.compile")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = MODELS if device == "cuda" else TINY
    modes = ("eager",) if args.eager_only else MODES
    rows = measure(models, device, args.steps, args.warmup, modes)
    command = "python -m kernels.gpu.practitioner " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    out = Path(args.out) if args.out else None
    print("saved", save("practitioner_step", {"device": device, "rows": rows}, command, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
