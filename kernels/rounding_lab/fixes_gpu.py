"""The bias chapters' GPU measurements, in one command:
``python -m kernels.rounding_lab.fixes_gpu``.

1. ``bias_sources``: the rows of the bias chapters (k tied maxima, the rest 15.6 below, tied V
   around vmax, the rest around vrest) through every GPU kernel (SDPA flash, cuDNN,
   memory-efficient, the book's Triton kernel) and the fixes in the Triton kernel; for each the
   output statistics against the ideal bf16(O_exact) and δ = rowsum(dO ∘ O) against δ_exact;
2. ``fix_speed``: what each fix costs in time, forward and forward+backward, at the GPT-2
   shape and a long-sequence shape, next to SDPA flash and cuDNN;
3. the chapter-5 sweep again (``python -m kernels.rounding_lab.gpu``) with the current emulator.

Inputs are built on the CPU from fixed seeds and moved to the GPU, so every machine sees the same
numbers. ``--small`` runs a tiny version on the CPU (Triton interpreter) to test the script.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .. import results
from ..attention import backward_pass, flash_attention, registry, tune_every_bucket
from ..attention.options import DELTA_SOURCES
from ..attention.registry import BIAS_SOURCES
from ..numerics.rounding import round_to_dtype
from . import gpu as sweep_gpu
from .cases import Case, VDist, build, reference
from .fixes import CAP, FIXES, delta_stats, output_stats, upstream_gradient
from .implementations import run_case

SETTINGS = [
    (2, -1.0, 0.0),
    (4, -1.0, 0.0),
    (2, -1.0, -1.0),
    (4, -1.0, -1.0),
    (1, -1.0, 0.0),
    (2, 0.0, -1.0),
]  # (ties, vmax, vrest), as in the chapters' tables
SDPA = tuple(n for n in registry.group("lab-gpu") if registry.get(n).kind == "sdpa")
SPEED_SHAPES = [(8, 12, 1024, 64), (4, 16, 4096, 64)]
SPEED_VARIANTS = {
    "FA2 (book kernel)": {},
    "β rule per tile": dict(stable="tile"),
    "β rule across tiles": dict(stable="cross"),
    "β rule, offset capped": dict(stable="cross", offset_cap=CAP),
    "β rule, ℓ from rounded P̄": dict(stable="cross", ell_rounded=True),
    "δ from rowsum(dP ∘ P)": dict(delta_source="dp"),
    "δ from an fp32 O": dict(delta_source="o_fp32"),
}


def case_for(ties, vmax, vrest, small=False) -> Case:
    case = Case(
        n_keys=1024,
        ties=ties,
        gap=15.6,
        batch=64,
        v_tied=VDist("normal", vmax, 0.3),
        v_rest=VDist("normal", vrest, 0.3),
    )
    return replace(case, n_keys=128, batch=2, head_dim=16, block_n=32) if small else case


def _kernel_inputs(built):
    return [t.to(torch.bfloat16).unsqueeze(1).contiguous() for t in (built.q, built.k, built.v)]


def _triton_rows(built, d_out, block_n):
    """The book's kernel with each forward fix (δ from its O), and with each δ source."""
    q, k, v = _kernel_inputs(built)
    common = dict(causal=False, scale=1.0, block_m=min(64, q.shape[-2]), block_n=block_n)
    rows = {}
    for key, fix in FIXES.items():
        opts = dict(common, **fix.forward)
        out = flash_attention(q, k, v, **opts).squeeze(1).float()
        if fix.delta in DELTA_SOURCES and fix.delta != "o":  # the kernel's own
            delta = backward_pass(
                q, k, v, d_out.unsqueeze(1).to(torch.bfloat16), delta_source=fix.delta, **opts
            ).delta.squeeze(1)
        elif fix.delta == "o_hilo":
            o32 = _fp32_output(q, k, v, opts).squeeze(1)  # O_hi + O_lo carries O to ~2^-16
            o_hi = round_to_dtype(o32, torch.bfloat16)
            o_lo = round_to_dtype(o32 - o_hi, torch.bfloat16)
            delta = (d_out.float() * o_hi).sum(-1) + (d_out.float() * o_lo).sum(-1)
        else:
            delta = (d_out.float() * out).sum(-1)
        rows[f"triton/{key}"] = (out, delta)
    return rows


def _fp32_output(q, k, v, opts):
    """The kernel's O before its final rounding (the forward pass with round_out=False)."""
    from ..attention.flash_fwd import flash_forward

    out, _, _ = flash_forward(q, k, v, round_out=False, **opts)
    return out.float()


def bias_sources(small=False, device="cuda") -> list[dict]:
    records = []
    for ties, vmax, vrest in SETTINGS[:2] if small else SETTINGS:
        case = case_for(ties, vmax, vrest, small)
        built = build(case, 0, device)
        o_exact = reference(built)
        d_out = upstream_gradient(built, -0.5, 0)
        delta_exact = (d_out * o_exact).sum(-1)
        outputs = {BIAS_SOURCES["ideal"]: round_to_dtype(o_exact, torch.bfloat16).float()}
        outputs[BIAS_SOURCES["fa2"]] = run_case("fa2", built, block_n=case.block_n).out
        outputs[BIAS_SOURCES["paper-untiled"]] = run_case("paper-untiled", built).out
        if device == "cuda":
            outputs.update({name: run_case(name, built).out for name in SDPA})
        rows = {name: (out, (d_out.float() * out).sum(-1)) for name, out in outputs.items()}
        rows.update(_triton_rows(built, d_out, case.block_n))
        for name, (out, delta) in rows.items():
            records.append(
                dict(
                    ties=ties,
                    vmax=vmax,
                    vrest=vrest,
                    gap=case.gap,
                    impl=name,
                    out=output_stats(out.double(), o_exact),
                    delta=delta_stats(delta.double(), delta_exact),
                )
            )
    return records


def fix_speed() -> list[dict]:
    from ..attention.registry import FIX_SPEED, runner
    from ..timing import measure_speed

    rows = []
    for shape in SPEED_SHAPES:
        for mode in ("fwd", "fwd+bwd"):
            for name, opts in SPEED_VARIANTS.items():
                if mode == "fwd" and "delta_source" in opts:
                    continue  # the δ source changes only the backward pass
                rows.append(measure_speed(name, runner("triton", causal=True, **opts), shape, mode))
            for sdpa, stored in FIX_SPEED.items():
                rows.append(measure_speed(stored, runner(sdpa, causal=True), shape, mode))
            print(f"speed {shape} {mode} done", flush=True)
    return rows


@tune_every_bucket()  # each timed shape runs the configuration tuned for it
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes on the CPU (a test)")
    parser.add_argument("--out", default=None, help="directory for the JSON (default results/)")
    parser.add_argument("--speed-only", action="store_true", help="only the timings (GPU)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out_dir = Path(args.out) if args.out else None
    command = "python -m kernels.rounding_lab.fixes_gpu" + (" --small" if args.small else "")
    if args.speed_only:
        results.save("fix_speed", {"rows": fix_speed()}, command + " --speed-only", out_dir)
        return
    start = time.time()
    records = bias_sources(args.small, device)
    results.save(
        "bias_sources_gpu",
        {"records": records, "device": device, "seconds": time.time() - start},
        command,
        out_dir,
    )
    print(f"bias sources: {len(records)} records in {time.time() - start:.0f} s", flush=True)
    if device == "cuda":
        start = time.time()
        results.save("fix_speed", {"rows": fix_speed()}, command, out_dir)
        print(f"fix speed in {time.time() - start:.0f} s", flush=True)
    sweep_gpu.main((["--small"] if args.small else []) + (["--out", args.out] if args.out else []))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
