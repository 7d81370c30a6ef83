"""Is the fast GPT-2 training step the same step? Bits first, then speed (CUDA GPU only).

    python -m kernels.gpt2.fast_step_check --out $OUT  # gpt2_fastpath.json, fast.env: what to use

Two speed-ups change how the chapter's training step is launched, not what it computes:
the fused elementwise kernels of :mod:`kernels.attention.emulator_fused` and the CUDA graph of
:mod:`.graphed_step`. Before a training run relies on them this script checks, on the GPU it
runs on:

1. ``exp``: libdevice's expf (the fused kernels) against torch's CUDA ``exp``, 16 M values;
2. one attention call at the model's shapes, forward and backward, fused against op by op, for
   each attention of plan ``bf16_real`` (every output and gradient, bit for bit);
3. whole training: the same 60 steps (monitoring every 20, as a run interleaves eager
   monitoring steps with graph replays) op by op twice (is training deterministic at all?),
   fused, and fused in a CUDA graph; every weight compared bit for bit at the end;
4. speed: steps per second of each way alone, and of the fast way with 2, 4 and 6 runs sharing
   the GPU (:func:`kernels.gpt2.profile.sharing`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..attention import OFF_VARIABLE, emulator_fused, off_in_children, speedups
from ..attention.emulator import EmulatedAttention
from .attention import parse_spec
from .plans import VARIANTS
from .profile import sharing, steps_per_s, trainer_for


def _with_fused(on: bool, fn, *args):
    with speedups(fused=on):
        return fn(*args)


def check_exp(n: int = 1 << 24) -> dict:
    """libdevice exp (through the p̄ kernel without rounding) against torch.exp."""
    x = torch.randn(n, device="cuda") * 30
    s = x.view(-1, 1024)
    zero = torch.zeros(s.shape[0], device="cuda")
    # P̄ = rnd(exp(rnd(S − 0))): compare on values that are already bf16, so rnd(S) = S
    s = s.bfloat16().float()
    mine = emulator_fused.p_bar(s, zero)
    theirs = torch.exp(s).bfloat16().float()
    return {"values": n, "mismatches": int((mine != theirs).sum())}


def check_attention(variant: str, shape=(64, 4, 256, 64)) -> dict:
    """One call of the variant's attention, fused and op by op: outputs and gradients."""
    spec = parse_spec(VARIANTS[variant])
    opts = spec.options(shape[-2])
    gen = torch.Generator(device="cuda").manual_seed(torch.seed())
    q, k, v = (
        torch.randn(shape, device="cuda", generator=gen).bfloat16().requires_grad_()
        for _ in range(3)
    )
    d_out = torch.randn(shape, device="cuda", generator=gen).bfloat16()

    def run():
        out = EmulatedAttention.apply(q, k, v, opts)
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        return (out, *grads)

    a, b = _with_fused(True, run), _with_fused(False, run)
    return {name: int((x != y).sum()) for name, x, y in zip(("out", "dq", "dk", "dv"), a, b)}


def train_weights(variant: str, fused_on: bool, graph: bool, steps: int = 60) -> dict:
    """Train ``steps`` steps of the variant (seed 0); returns the final weights."""

    def run():
        trainer = trainer_for(variant, monitor_every=20, steps=steps, cuda_graph=graph)
        for _ in range(steps):
            trainer.train_step()
        torch.cuda.synchronize()
        return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    return _with_fused(fused_on, run)


def differing(a: dict, b: dict) -> int:
    return sum(int((a[k] != b[k]).sum()) for k in a)


def speed(variant: str, fused_on: bool, graph: bool, steps: int) -> float:
    return _with_fused(
        fused_on,
        lambda: steps_per_s(trainer_for(variant, steps=steps + 40, cuda_graph=graph), steps),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="results")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--share", default="2,4,6")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("kernels.gpt2.fast_step_check checks the GPU path: it needs a CUDA GPU")
    from ..results import provenance

    data = {"exp": check_exp()}
    print("exp:", data["exp"], flush=True)
    data["attention"] = {v: check_attention(v) for v in "UFPZ"}
    print("attention, fused vs op by op (differing elements):", data["attention"], flush=True)
    ref = train_weights("U", False, False)
    data["training"] = {
        "op by op, again": differing(ref, train_weights("U", False, False)),
        "fused": differing(ref, train_weights("U", True, False)),
    }
    try:
        data["training"]["fused + CUDA graph"] = differing(ref, train_weights("U", True, True))
    except Exception as err:  # a graph that cannot be recorded: say why
        data["graph_error"] = repr(err)[:500]
    print(
        "training, 60 steps, weights differing from op by op:",
        data["training"],
        data.get("graph_error", ""),
        flush=True,
    )
    deterministic = data["training"]["op by op, again"] == 0
    # where op-by-op training is not even deterministic, no bitwise claim about whole training
    # can be made: the attention calls must then be identical, and the record says so
    calls_same = data["exp"]["mismatches"] == 0 and all(
        n == 0 for r in data["attention"].values() for n in r.values()
    )
    fused_ok = calls_same and (data["training"]["fused"] == 0 or not deterministic)
    graph_ok = (
        fused_ok
        and "graph_error" not in data
        and (data["training"]["fused + CUDA graph"] == 0 or not deterministic)
    )
    data.update(
        training_deterministic=deterministic, fused_same_bits=fused_ok, graph_same_bits=graph_ok
    )
    ways = {"op by op": (False, False)}
    if fused_ok:
        ways["fused"] = (True, False)
    if graph_ok:
        ways["fused + CUDA graph"] = (True, True)
    data["steps_per_s"] = {way: speed("U", f, g, args.steps) for way, (f, g) in ways.items()}
    print("steps/s alone:", {k: round(v, 1) for k, v in data["steps_per_s"].items()}, flush=True)
    if not fused_ok:
        off_in_children("fused")  # the sharing runs' processes
    data["sharing_fast"] = [
        sharing(int(k), args.steps, fast=graph_ok) for k in args.share.split(",") if k
    ]
    for row in data["sharing_fast"]:
        print(
            f"{row['processes']} runs sharing: {row['steps_per_s_total']:.1f} steps/s in all",
            flush=True,
        )
    command = f"python -m kernels.gpt2.fast_step_check --steps {args.steps} --share {args.share}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpt2_fastpath.json").write_text(
        json.dumps({"provenance": provenance(command), "data": data}, indent=1)
    )
    # what the training calls that follow may use, for a shell to `source`
    (out / "fast.env").write_text(
        ("" if fused_ok else f"export {OFF_VARIABLE}=${{{OFF_VARIABLE}:+${OFF_VARIABLE},}}fused\n")
        + f"FAST={'--fast' if graph_ok else ''}\n"
    )
    print(
        f"fused kernels: {'same bits' if fused_ok else 'NOT used'}; CUDA graph: "
        f"{'same bits' if graph_ok else 'NOT used'}"
    )


if __name__ == "__main__":
    main()
