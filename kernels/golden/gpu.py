"""Chapter 8's GPU measurements in one command: ``python -m kernels.golden.gpu``.

Stages, each bounded in time and saved as soon as it ends
(``results/golden_<stage>.json``):

1. ``precision``  Golden et al.'s Figs. 3–4: every implementation in BF16, FP16, FP32,
   FP64 on Gaussian inputs (N = 4,096, 4 heads) and on sink rows (three settings), plus
   the kernels that run for real on the GPU (the book's Triton kernel, torch SDPA's
   flash backend, torch's math attention);
2. ``seqlen``     their Fig. 5: N = 256 … 16,384 with 64-key tiles, the rescaling
   counts, and each row's error against its count at the largest N;
3. ``tiles``      their Fig. 6: (B_r, B_c) tiles at N = 1,024, and the tile the Triton
   kernel's autotuner picks;
4. ``training``   their Figs. 7–8 at the GPT-2 chapter's model size: the ``golden`` set
   (exact, fused SDPA, all-BF16 flash, another seed, fp32, one weight moved one ulp) and
   the ``failure`` set (the failing path with Ō in 3 bits, its control, the control with
   another seed), trained in lock-step until their time runs out or the failing run's
   loss has exploded.

The whole script takes under 9 minutes on one H100 (``--minutes-*`` bound each stage).
``--small`` runs every stage at tiny sizes on the CPU, to test the script; ``--out DIR``
writes elsewhere; ``--only STAGE`` runs one stage."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from .. import results
from ..numerics.rounding import work_dtype
from . import microbench as mb, training
from .implementations import FORMATS

STAGES = ("precision", "seqlen", "tiles", "training")
# fmt: off
FULL = dict(
    precision_n=4096, precision_heads=4, sink_n=4096, sink_batch=16, sink_dim=64,
    seqlen_ns=(256, 512, 1024, 2048, 4096, 8192, 16384), seqlen_heads=2, rescaling_n=16384,
    tile_n=1024, tile_heads=2,
    tiles=((16, 16), (16, 64), (32, 32), (64, 16), (32, 128), (64, 64), (128, 32), (64, 128),
           (128, 64), (128, 128), (256, 64), (64, 256)),
    autotune_ns=(1024, 4096, 16384), golden_steps=4000, failure_steps=5000, snapshot_every=100,
    early=200, early_every=10, stop_after_explosion=300,
)
SMALL = dict(
    precision_n=128, precision_heads=1, sink_n=128, sink_batch=2, sink_dim=16,
    seqlen_ns=(64, 128, 256), seqlen_heads=1, rescaling_n=256, tile_n=128, tile_heads=1,
    tiles=((16, 16), (16, 64), (64, 16), (32, 32)), autotune_ns=(), golden_steps=6,
    failure_steps=6, snapshot_every=3, early=2, early_every=1, stop_after_explosion=3,
)
# fmt: on
MINUTES = dict(seqlen=1.0, tiles=0.8, golden=1.8, failure=3.2)


def kernel_extras(device: str, block_n=None) -> dict:
    """The implementations that run for real: {name: (fn(q, k, v, low, scale),
    formats)}. On a CPU only the book's Triton kernel (in the interpreter); on a GPU
    also torch SDPA's flash backend and torch's math attention."""
    from ..attention import flash_attention
    from ..attention.reference import standard_attention

    def four_d(t, low):
        t = t.to(low)
        return (t.unsqueeze(1) if t.dim() == 3 else t).contiguous()

    def triton(q, k, v, low, scale):
        blocks = {} if block_n is None else dict(block_m=64, block_n=block_n)
        out = flash_attention(*(four_d(t, low) for t in (q, k, v)), scale=scale, **blocks)
        return out.reshape(q.shape).to(work_dtype(low))

    extras = {"triton": (triton, ("bf16", "fp16", "fp32", "fp64"))}
    if device != "cuda":
        return extras

    def sdpa_flash(q, k, v, low, scale):
        from ..attention import registry

        out = registry.run("sdpa-flash", *(four_d(t, low) for t in (q, k, v)), scale=scale)
        return out.reshape(q.shape).float()

    def torch_math(q, k, v, low, scale):
        return standard_attention(q.to(low), k.to(low), v.to(low), scale=scale).float()

    extras["sdpa_flash"] = (sdpa_flash, ("bf16", "fp16"))
    extras["torch_math"] = (torch_math, ("bf16", "fp16", "fp32"))
    return extras


def precision_stage(sizes, device) -> dict:
    gauss = mb.gaussian_inputs(sizes["precision_n"], 64, sizes["precision_heads"], 0, device)
    records = mb.precision_sweep(gauss, extra=kernel_extras(device))
    for setting in mb.SINK_SETTINGS:
        sink = mb.sink_inputs(
            sizes["sink_n"],
            setting,
            0,
            device,
            batch=sizes["sink_batch"],
            head_dim=sizes["sink_dim"],
        )
        records += mb.precision_sweep(sink, extra=kernel_extras(device))
    return {
        "records": records,
        "n": sizes["precision_n"],
        "heads": sizes["precision_heads"],
        "sink_n": sizes["sink_n"],
        "sink_rows": sizes["sink_batch"] * sizes["sink_dim"],
    }


def seqlen_stage(sizes, device, minutes) -> dict:
    start, records, stopped = time.time(), [], None
    for n in sizes["seqlen_ns"]:
        if time.time() - start > 60 * minutes:
            stopped = f"time limit of {minutes:g} min before N = {n}"
            break
        records += mb.seqlen_sweep(
            [n], heads=sizes["seqlen_heads"], device=device, extra=kernel_extras(device, block_n=64)
        )
        print(f"  seqlen N = {n}: {time.time() - start:.0f} s", flush=True)
    by_count = mb.error_by_rescalings(
        min(sizes["rescaling_n"], records[-1]["n"]), heads=sizes["seqlen_heads"], device=device
    )
    return {
        "records": records,
        "by_count": by_count,
        "stopped": stopped,
        "rescaling_n": min(sizes["rescaling_n"], records[-1]["n"]),
        "heads": sizes["seqlen_heads"],
    }


def autotuned_tiles(ns, device) -> dict:
    """{N: [BLOCK_M, BLOCK_N]} the forward kernel's autotuner picked (bf16, d = 64,
    one head)."""
    if device != "cuda":
        return {}
    from ..attention import flash_attention, flash_fwd, speedups

    picked = {}
    for n in ns:
        q, k, v = (torch.randn(1, 1, n, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
        with speedups(tune_by_bucket=False):  # the pick for exactly this N
            flash_attention(q, k, v)
        torch.cuda.synchronize()
        best = getattr(flash_fwd._flash_fwd_tuned, "best_config", None)
        if best is not None:
            picked[str(n)] = [best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"]]
    return picked


def tiles_stage(sizes, device, minutes) -> dict:
    inputs = mb.gaussian_inputs(sizes["tile_n"], 64, sizes["tile_heads"], 0, device)
    start, records, stopped = time.time(), [], None
    for fmt in FORMATS:
        if time.time() - start > 60 * minutes:
            stopped = f"time limit of {minutes:g} min before {fmt}"
            break
        records += mb.tile_sweep(inputs, sizes["tiles"], formats=(fmt,))
        print(f"  tiles {fmt}: {time.time() - start:.0f} s", flush=True)
    return {
        "stopped": stopped,
        "records": records,
        "n": sizes["tile_n"],
        "heads": sizes["tile_heads"],
        "block_m_identical": {
            f"{f}/{bc}": same for (f, bc), same in mb.block_m_identical(records).items()
        },
        "autotuned": autotuned_tiles(sizes["autotune_ns"], device),
        "interpreter_tile": [64, 64],
    }


def training_stage(sizes, small, device, minutes_golden, minutes_failure) -> dict:
    from ..gpt2 import load_corpus

    base = training.CPU_BASE if small else training.GPU_BASE
    base = dict(base, steps=max(base["steps"], sizes["failure_steps"]))
    corpus = load_corpus("stdlib", max_bytes=base["max_bytes"] or None)
    out = {}
    for name, steps, minutes, stop in (
        ("golden", sizes["golden_steps"], minutes_golden, None),
        ("failure", sizes["failure_steps"], minutes_failure, sizes["stop_after_explosion"]),
    ):
        schedule = training.snapshot_schedule(
            steps, sizes["snapshot_every"], sizes["early"], sizes["early_every"]
        )
        out[name] = training.train_set(
            name,
            base,
            corpus,
            steps,
            schedule,
            minutes=minutes,
            stop_after_explosion=stop,
            progress=not small,
        )
        print(
            f"  training set {name}: {out[name]['steps_done']} steps, "
            f"{out[name]['stopped']}, {out[name]['wall_s']:.0f} s",
            flush=True,
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes on the CPU (a test)")
    parser.add_argument("--out", default=None, help="directory for the JSON (default results/)")
    parser.add_argument(
        "--only", choices=STAGES, action="append", help="run only this stage (repeatable)"
    )
    for key, value in MINUTES.items():
        parser.add_argument(
            f"--minutes-{key}",
            type=float,
            default=value,
            help=f"time limit of the {key} stage (default {value})",
        )
    args = parser.parse_args(argv)
    from ..attention import tune_every_bucket

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    sizes = SMALL if args.small else FULL
    out_dir = Path(args.out) if args.out else None
    command = "python -m kernels.golden.gpu" + (" " + " ".join(argv) if argv else "")
    stages = args.only or STAGES
    begin = time.time()
    with tune_every_bucket():  # each timed shape runs the configuration tuned for it
        for stage in stages:
            start = time.time()
            if stage == "precision":
                data = precision_stage(sizes, device)
            elif stage == "seqlen":
                data = seqlen_stage(sizes, device, args.minutes_seqlen)
            elif stage == "tiles":
                data = tiles_stage(sizes, device, args.minutes_tiles)
            else:
                data = training_stage(
                    sizes, args.small, device, args.minutes_golden, args.minutes_failure
                )
            data.update(
                device=device, seconds=time.time() - start, small=args.small, formats=list(FORMATS)
            )
            path = results.save(f"golden_{stage}", data, command, out_dir)
            print(f"{stage}: {time.time() - start:.0f} s -> {path}", flush=True)
    print(f"all stages: {time.time() - begin:.0f} s", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main(sys.argv[1:])
