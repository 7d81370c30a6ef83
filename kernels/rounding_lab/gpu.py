"""The lab sweep measured on a GPU: ``python -m kernels.rounding_lab.gpu [--small] [--out DIR]``.

Runs the same cells as :func:`kernels.rounding_lab.save_cpu_sweep` (inputs built on the CPU from
the same seeds, so both machines see bit-identical Q, K, V) with

* the emulator (:mod:`kernels.attention.emulator`) on the GPU in torch,
* torch SDPA's flash, cuDNN and memory-efficient backends (``torch.nn.attention.sdpa_kernel``),
* the book's Triton kernel (:mod:`kernels.attention`) when it imports,

and compares SDPA flash (and the Triton kernel) element by element with the emulator's fa2 mode.
Everything that ran, and everything that refused, is recorded in ``lab_sweep_gpu.json``.
``--small`` runs a tiny grid on any device (the test of this script on a CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .. import results, rounding_lab as lab
from ..attention import registry, tune_every_bucket


def _triton_available(device, small) -> tuple[bool, str]:
    if device != "cuda" and not small:
        return False, "no CUDA device (the interpreter is used only with --small)"
    try:
        from ..attention import flash_attention  # noqa: F401
    except Exception as exc:  # the kernel may not exist yet or may fail to compile
        return False, f"{type(exc).__name__}: {exc}"[:300]
    try:  # one tiny call: a kernel that imports but does not run is also 'not available'
        built = lab.build(lab.Case(n_keys=128, batch=1, head_dim=64, ties=1), 0, device)
        lab.run_case("triton", built, stable="off")
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"[:300]
    return True, "ran" + (" (Triton interpreter)" if device != "cuda" else " (native)")


@tune_every_bucket()  # each timed shape runs the configuration tuned for it
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny grid (CPU test)")
    parser.add_argument("--out", default=None, help="directory for the JSON (default results/)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    impls = list(lab.SWEEP_IMPLS)
    ran = {"emulator": True}
    if device == "cuda":
        impls += [n for n in lab.GPU_ONLY if registry.get(n).kind != "book"]  # SDPA, fa2-mma
        ran["sdpa"] = True
    ok, why = _triton_available(device, args.small)
    ran["triton"] = why
    if ok:
        impls += ["triton/off", "triton/tile", "triton/cross", "triton-explicit/off"]
    pairs = [
        ("sdpa-flash", "fa2/off"),
        ("sdpa-cudnn", "fa2/off"),
        ("sdpa-efficient", "fa2/off"),
        ("triton/off", "fa2/off"),
        ("triton/tile", "fa2/tile"),
        ("triton/cross", "fa2/cross"),
        ("triton-explicit/off", "fa2/off"),
        ("sdpa-flash", "fa2-mma"),
        ("triton/off", "fa2-mma"),
        ("sdpa-flash", "triton/off"),
    ]
    grid = dict(ties=lab.SWEEP_TIES, gaps=lab.SWEEP_GAPS, v_means=lab.SWEEP_V)
    base = lab.Case()
    if args.small:
        grid = dict(ties=(1, 2), gaps=(16.0,), v_means=((-1.0, 0.0),))
        base = replace(base, n_keys=128, batch=2, head_dim=16, block_n=32)
    start = time.time()
    records = lab.sweep(
        **grid, impls=impls, base=base, device=device, pairs=pairs, progress=sys.stderr.isatty()
    )
    data = {
        "config": lab.sweep_config(
            base, **grid, impls=impls, beta=2.0, eps=1e-3, seed=0, small=args.small
        ),
        "ran": ran,
        "device": device,
        "seconds": time.time() - start,
        "records": records,
    }
    command = "python -m kernels.rounding_lab.gpu" + (" --small" if args.small else "")
    out_dir = Path(args.out) if args.out else None
    path = results.save("lab_sweep_gpu", data, command, directory=out_dir)
    errors = sorted({r["impl"] + ": " + r["error"][:120] for r in records if "error" in r})
    print(f"{len(records)} records in {data['seconds']:.1f} s -> {path}; triton: {why}")
    print("\n".join(errors[:10]))
    return path


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
