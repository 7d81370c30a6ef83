"""The practitioner's training step: Hugging Face's GPT-2 trained with SDPA and with the book's
fix (the FlashAttention-2 kernels with δ from rowsum(dP∘P), :mod:`kernels.attention.hf_attention`),
eager and under ``torch.compile``, in steps per second.

A kernel benchmark times the attention alone; a reader's loop also pays Python per call, the
optimizer and everything around it. This module times that loop as a reader writes it: bf16
autocast, AdamW, gradient clipping, one batch of random tokens per step, no dropout (the book's
attention refuses attention dropout, so SDPA runs without it too). Run ::

    python -m kernels.gpu.practitioner --out $OUT

It writes ``practitioner_step.json`` (``practitioner_step_nanogpt.json`` for ``--loops nanoGPT``
alone; provenance: GPU, torch, triton, date, command): one row per
model, implementation and mode, with steps/s and ``ratio_to_sdpa`` (the same model and mode with
SDPA). On a CPU it runs too, at :data:`TINY` sizes, which checks the code and measures nothing
worth keeping.
"""

from __future__ import annotations

import argparse
import math
import shlex
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
# Hugging Face's GPT2LMHeadModel (the attention registered by name) and nanoGPT's model (its
# one scaled_dot_product_attention call replaced by the book's drop-in, :class:`NanoGPT`)
LOOPS = ("Hugging Face", "nanoGPT")


def _attn_name(implementation: str) -> str:
    from ..attention import hf_attention

    return "sdpa" if implementation == "sdpa" else hf_attention.register()


class NanoBlock(torch.nn.Module):
    """nanoGPT's block: pre-LayerNorm attention and MLP; ``attend`` is the attention call, with
    ``torch.nn.functional.scaled_dot_product_attention``'s signature."""

    def __init__(self, width: int, heads: int, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.c_attn, self.c_proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (t.view(b, n, self.heads, c // self.heads).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, n, c))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(torch.nn.Module):
    """nanoGPT's GPT (tied embedding, learned positions) of ``sizes``; returns (logits, loss)."""

    def __init__(self, sizes: tuple, attend):
        super().__init__()
        layers, width, heads, context, _, vocab = sizes
        self.wte, self.wpe = torch.nn.Embedding(vocab, width), torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(NanoBlock(width, heads, attend) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        """nanoGPT's initialisation: weights from N(0, 0.02²), biases 0 (torch's default
        N(0, 1) embeddings, tied to the output layer, would start the loss far above ln V)."""
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        flat = logits.float().view(-1, logits.shape[-1])
        return logits, torch.nn.functional.cross_entropy(flat, targets.reshape(-1))


def build(sizes: tuple, implementation: str, device, loop: str = "Hugging Face"):
    """A freshly initialised model of ``sizes`` with ``implementation``: Hugging Face's
    ``GPT2LMHeadModel`` or :class:`NanoGPT` (``loop``)."""
    from ..attention import hf_attention

    layers, width, heads, context, _, vocab = sizes
    torch.manual_seed(0)
    if loop == "nanoGPT":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        book = hf_attention.scaled_dot_product_attention  # the drop-in for nanoGPT's one call
        return NanoGPT(sizes, sdpa if implementation == "sdpa" else book).to(device)
    from transformers import GPT2Config, GPT2LMHeadModel, logging as hf_logging

    hf_logging.set_verbosity_error()
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
    return GPT2LMHeadModel(config).to(device)


def _loss(step_fn, tokens, loop: str):
    """The language-model loss of one batch. Hugging Face's model takes the tokens as labels and
    shifts them itself; nanoGPT's takes the next tokens as targets, so its batch holds one token
    more (x = tokens[:, :-1], y = tokens[:, 1:], as nanoGPT's ``get_batch`` cuts them)."""
    if loop == "nanoGPT":
        return step_fn(tokens[:, :-1], tokens[:, 1:])[1]
    return step_fn(tokens, labels=tokens).loss


def train_steps(
    model, sizes: tuple, steps: int, device, compiled: bool = False, loop: str = "Hugging Face"
) -> list:
    """Train ``steps`` steps (a reader's loop) and return the losses as tensors (no host sync
    inside the loop, as a loop that logs every hundredth step would have)."""
    *_, context, batch, vocab = sizes
    step_fn = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
    dtype = torch.bfloat16
    extra = 1 if loop == "nanoGPT" else 0  # nanoGPT's targets are the inputs moved by one
    tokens = torch.randint(0, vocab, (steps, batch, context + extra), device=device)
    losses = []
    for step in range(steps):
        with torch.autocast(torch.device(device).type, dtype=dtype):
            loss = _loss(step_fn, tokens[step], loop)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def steps_per_second(
    sizes, implementation, mode, device, steps, warmup, loop: str = "Hugging Face"
) -> dict:
    """One row: warm up (compiling and autotuning happen there), then time ``steps`` steps."""
    model = build(sizes, implementation, device, loop)
    compiled = mode == "compiled"
    losses = train_steps(model, sizes, warmup, device, compiled, loop)
    _sync(device)
    start = time.perf_counter()
    losses += train_steps(model, sizes, steps, device, compiled, loop)
    _sync(device)
    seconds = time.perf_counter() - start
    final = float(losses[-1])
    return {
        "loop": loop,
        "implementation": implementation,
        "mode": mode,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": steps / seconds,
        "final_loss": final,
    }


def measure(
    models: dict, device, steps: int, warmup: int, modes=MODES, log=print, keep=None,
    loops=LOOPS,
) -> list:  # fmt: skip
    """Every loop × model × implementation × mode, each row with its ratio to SDPA (SDPA's
    row of a loop, model and mode runs first). ``keep(rows)`` is called after every row, so a
    run stopped by a time limit keeps what it measured."""
    from tqdm.auto import tqdm

    rows = []
    plan = [(loop, m, mode, i) for loop in loops for m in models for mode in modes
            for i in IMPLEMENTATIONS]  # fmt: skip
    for loop, name, mode, implementation in tqdm(plan, desc="practitioner steps"):
        sizes = models[name]
        row = steps_per_second(sizes, implementation, mode, device, steps, warmup, loop)
        layers, width, heads, context, batch, vocab = sizes
        row = {"model": name, "layers": layers, "width": width, "heads": heads,
               "context": context, "batch": batch, "vocab": vocab, **row}  # fmt: skip
        where = f"{loop}, {name}, {implementation}, {mode}"
        if not math.isfinite(row["final_loss"]):
            raise FloatingPointError(f"{where}: the loss is not finite")
        sdpa = next(r for r in rows + [row] if _same_setting(r, row) and r["implementation"]
                    == "sdpa")  # fmt: skip
        row["ratio_to_sdpa"] = row["steps_per_s"] / sdpa["steps_per_s"]
        rows.append(row)
        log(f"{where:60s} {row['steps_per_s']:8.1f} steps/s")
        if keep is not None:
            keep(rows)
    return rows


def record_name(loops) -> str:
    """The results file a run of ``loops`` writes: ``practitioner_step`` when Hugging Face's loop
    is among them (the record chapter 10 started from), else ``practitioner_step_nanogpt``, so a
    run of nanoGPT's loop alone does not replace Hugging Face's rows."""
    return "practitioner_step" if LOOPS[0] in loops else "practitioner_step_nanogpt"


RECORDS = ("practitioner_step", "practitioner_step_nanogpt")  # every loop's stored rows


def stored_records(directory=None) -> list:
    """The stored records of :data:`RECORDS` that exist (each with its provenance), the
    Hugging Face one first."""
    from .. import results

    present = set(results.stored_names("practitioner_step", directory))
    return [results.load(name, directory) for name in RECORDS if name in present]


def loop_of(row: dict) -> str:
    """A row's training loop (rows stored before loops were named are Hugging Face's)."""
    return row.get("loop", LOOPS[0])


def _same_setting(a: dict, b: dict) -> bool:
    """Two rows of one loop, model and mode."""
    return _setting(a) == _setting(b)


def plot_steps(rows: list):
    """Steps per second of each loop (a row of panels) and model (a column), SDPA beside the
    book's attention, eager and compiled; the book's ratio to SDPA over its bar."""
    import matplotlib.pyplot as plt

    loops = list(dict.fromkeys(loop_of(row) for row in rows))
    models = list(dict.fromkeys(row["model"] for row in rows))
    fig, axes = plt.subplots(len(loops), len(models), figsize=(6.8, 0.6 + 2.4 * len(loops)),
                             layout="constrained", squeeze=False)  # fmt: skip
    for (loop, model), ax in zip([(lp, m) for lp in loops for m in models], axes.flat):
        mine = [r for r in rows if r["model"] == model and loop_of(r) == loop]
        modes = list(dict.fromkeys(row["mode"] for row in mine))
        for offset, implementation in zip((-0.2, 0.2), IMPLEMENTATIONS):
            here = {r["mode"]: r for r in mine if r["implementation"] == implementation}
            xs = [i + offset for i, mode in enumerate(modes)]
            heights = [here[mode]["steps_per_s"] for mode in modes]
            colour = "0.6" if implementation == "sdpa" else "black"
            book = implementation.replace("book,", "the book's attention,")
            label = "SDPA" if implementation == "sdpa" else book
            ax.bar(xs, heights, width=0.38, color=colour, label=label)
            if implementation != "sdpa":
                for x, mode, height in zip(xs, modes, heights):
                    ratio = here[mode]["ratio_to_sdpa"]
                    ax.text(x, height, f"{ratio:.2f}×", ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(modes)), modes, fontsize=10)
        shape = f"B {mine[0]['batch']}, N {mine[0]['context']}"
        ax.set_title(f"{loop}: {model} ({shape})", fontsize=9.5)
        ax.margins(y=0.15)
    for ax in axes[:, 0]:
        ax.set_ylabel("steps per second", fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=9)
    return fig


def step_numbers(rows: list, prefix: str = "c10_step") -> dict:
    """The ratios to SDPA chapter 10 states: the lowest and highest, eager and compiled, glued
    as ``<prefix>_<mode>_lo`` and ``_hi``, and over both modes as ``<prefix>_all_lo``/``_hi``."""
    numbers = {}
    for mode in MODES:
        ratios = [r["ratio_to_sdpa"] for r in rows if r["mode"] == mode and r["implementation"]
                  != "sdpa"]  # fmt: skip
        numbers[f"{prefix}_{mode}_lo"] = min(ratios)
        numbers[f"{prefix}_{mode}_hi"] = max(ratios)
    numbers[f"{prefix}_all_lo"] = min(numbers[f"{prefix}_{mode}_lo"] for mode in MODES)
    numbers[f"{prefix}_all_hi"] = max(numbers[f"{prefix}_{mode}_hi"] for mode in MODES)
    return numbers


def compile_slowed_sdpa(rows: list) -> dict:
    """Where torch.compile made SDPA's own step slower than eager (loop and model matched):
    how many settings of how many, by how much (percent, lowest and highest) and in which
    models, under chapter 10's glue names (``c10_sdpa_slower*``)."""
    sdpa = {_setting(r): r["steps_per_s"] for r in rows if r["implementation"] == "sdpa"}
    # the (loop, model) settings in which SDPA trained both eager and compiled
    both = sorted(key[:2] for key in sdpa if key[2] == "eager" and (*key[:2], "compiled") in sdpa)
    change = {key: 1 - sdpa[(*key, "compiled")] / sdpa[(*key, "eager")] for key in both}
    slower = {key: 100 * c for key, c in change.items() if c > 0}
    models = sorted({model for _, model in slower})
    return {
        "c10_sdpa_slower": len(slower),
        "c10_sdpa_settings": len(both),
        "c10_sdpa_slower_lo": min(slower.values(), default=0.0),
        "c10_sdpa_slower_hi": max(slower.values(), default=0.0),
        "c10_sdpa_slower_models": " and ".join(models) or "none",
    }


def print_drift(rows: list, earlier: list, before_fix: list) -> dict:
    """Print how the compiled ratios stood before the padding fix and how far the earlier
    sitting of the same settings moved (:func:`sdpa_drift`, :func:`ratio_drift`); return those
    numbers under chapter 10's glue names (``c10_before_*``, ``c10_sdpa_drift`` in percent,
    ``c10_ratio_drift``)."""
    numbers = step_numbers(before_fix, prefix="c10_before")
    numbers["c10_sdpa_drift"] = 100 * sdpa_drift(rows, earlier)
    numbers["c10_ratio_drift"] = ratio_drift(rows, earlier)
    lo, hi = numbers["c10_before_compiled_lo"], numbers["c10_before_compiled_hi"]
    print(f"compiled, before the fix: {lo:.2f}–{hi:.2f} of SDPA's pace")
    print(
        f"from the earlier sitting to this one SDPA's rate moved by up to "
        f"{numbers['c10_sdpa_drift']:.0f} %,\nthe ratio by up to {numbers['c10_ratio_drift']:.2f}"
    )
    return numbers


def _setting(row: dict) -> tuple:
    """A row's loop, model and mode: what two records must share to be compared."""
    return loop_of(row), row["model"], row["mode"]


def _matched(rows: list, earlier: list, sdpa: bool) -> list[tuple[dict, dict]]:
    """(row, earlier row) of the same setting, SDPA's rows (``sdpa``) or the book's."""
    before = {_setting(r): r for r in earlier if (r["implementation"] == "sdpa") == sdpa}
    return [(r, before[_setting(r)]) for r in rows
            if (r["implementation"] == "sdpa") == sdpa and _setting(r) in before]  # fmt: skip


def sdpa_drift(rows: list, earlier: list) -> float:
    """The largest relative change of SDPA's steps/s between two records of the same settings
    (loop, model, mode): how far one 50-step run moves, the spread to read ratios against."""
    pairs = _matched(rows, earlier, sdpa=True)
    if not pairs:
        raise ValueError("the two records share no SDPA setting to compare")
    return max(abs(now["steps_per_s"] / then["steps_per_s"] - 1) for now, then in pairs)


def ratio_drift(rows: list, earlier: list) -> float:
    """The largest change of the book's ratio to SDPA between two records of the same settings
    (loop, model, mode): how far one run's ratio is from another's."""
    pairs = _matched(rows, earlier, sdpa=False)
    if not pairs:
        raise ValueError("the two records share no setting of the book's attention")
    return max(abs(now["ratio_to_sdpa"] - then["ratio_to_sdpa"]) for now, then in pairs)


def target_count(rows: list, target: float = 0.95) -> tuple[int, int]:
    """(rows of the book's attention at or above ``target`` × SDPA's steps/s, such rows)."""
    book = [r["ratio_to_sdpa"] for r in rows if r["implementation"] != "sdpa"]
    return sum(ratio >= target for ratio in book), len(book)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for practitioner_step.json")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--eager-only", action="store_true", help="skip torch.compile")
    parser.add_argument("--loops", default=",".join(LOOPS), help=f"some of {', '.join(LOOPS)}")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    models = MODELS if device == "cuda" else TINY
    modes = ("eager",) if args.eager_only else MODES
    command = "python -m kernels.gpu.practitioner " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    out = Path(args.out) if args.out else None

    loops = tuple(loop.strip() for loop in args.loops.split(","))
    unknown = [loop for loop in loops if loop not in LOOPS]
    if unknown:
        parser.error(f"unknown loop {unknown[0]!r}; choose from {', '.join(LOOPS)}")
    name = record_name(loops)

    def keep(rows):
        return save(name, {"device": device, "rows": rows}, command, out)

    measure(models, device, args.steps, args.warmup, modes, keep=keep, loops=loops)
    print(f"saved {name}.json in", out or "results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
