"""The cost of the first call at a new sequence length, for ``kernels.gpu.check``.

Triton's autotuner keys on the exact lengths, so without help every new N re-times every
configuration of the three autotuned kernels (forward, dK/dV, dQ): 16-39 s forward + backward
on an H100. With the ``tune_by_bucket`` speed-up (:class:`kernels.attention.Speedups`) only
the first length of a power-of-two bucket is tuned; a later one only compiles, and not even
that when it has the same specialisation as one already compiled (no length here is a multiple
of 16, like the warm-up's, so each kernel is the one compiled already).

:func:`first_calls`: in one process, one warm-up length of the bucket (tuned: every
configuration compiled and timed), then three new lengths of that bucket with the switch on
and three with it off; the wall time of each first forward + backward (bf16, causal), with
the device synchronised before and after. The whole measurement uses a fresh, empty Triton
cache folder, so autotuning results stored on disk by an earlier run (``cache_results``)
cannot hide the cost of tuning, and every run measures the same thing. The warm-up compiles
its configurations in parallel threads (``"parallel_compile"``, the default); it is timed once
more as if in a fresh process with that switch off, one configuration at a time.

Then the first calls in *new buckets* (``NEAREST``) with ``"nearest_bucket"`` on: each borrows
the tuned bucket's configuration, so it compiles at most. Triton specialises a length argument
on whether it is a multiple of 16, so 2,001 (like the warm-up's 1,000) can reuse the compiled
kernels where 2,000 needs its own, which 4,000, another multiple of 16 in a third bucket, then
reuses.

Last, the first calls in *families this process never tuned* (``STORED``: another dtype,
another head dim, full attention) with ``"stored_tuning"`` on: each compiles the configuration
the stored GPU benchmark chose (``results/perf_tuning.json``) if that ran on a GPU of this
architecture (an H100's picks serve an H200), and tunes otherwise (the record says which).
Each family is timed twice, as if in a fresh process: the backward's two kernels compiled in
parallel, and one after the other.
"""

from __future__ import annotations

import contextlib
import tempfile

import torch
from triton import knobs

from kernels import timing
from kernels.attention import (
    clear_plans,
    flash_attention,
    forget_compiled,
    n_bucket,
    speedups,
    stored_table,
)

SHAPE = (1, 4, 64)  # (B, H, D)
WARM_UP = 1000  # tunes bucket 1024
LENGTHS = {"on": (1004, 1010, 1020), "off": (1006, 1012, 1022)}  # new, all in bucket 1024
NEAREST = (2001, 2000, 4000)  # buckets 2048 and 4096, not tuned: they borrow bucket 1024's pick
# (dtype, causal, N, D): families the warm-up did not tune, each in a bucket chapter 10's
# benchmark tuned (so its pick is stored) at a length it did not time
STORED = (("fp16", True, 3000, 64), ("bf16", False, 1500, 64), ("bf16", True, 6000, 128))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def first_call_seconds(n, shape=SHAPE, device="cuda", dtype="bf16", causal=True) -> float:
    """Wall time of one forward + backward at length ``n``, synchronised."""
    batch, heads, d = shape
    q, k, v, grad = timing.inputs((batch, heads, n, d), DTYPES[dtype], device=device, seed=None)
    attn = lambda *qkv: flash_attention(*qkv, causal=causal)  # noqa: E731
    _, wall_us = timing.host_and_wall_us(timing.step(attn, q, k, v, grad, "fwd+bwd"), calls=1)
    return wall_us / 1e6


def first_calls(
    warm_up=WARM_UP,
    lengths=LENGTHS,
    shape=SHAPE,
    device="cuda",
    log=print,
    nearest=NEAREST,
    stored=STORED,
):
    """The warm-up's and each new length's first-call seconds, with ``tune_by_bucket`` on and
    off, then each ``nearest`` length's in its new bucket, then each ``stored`` family's (see
    the module docstring). Every plan and tuned bucket of the process is forgotten first, so
    the warm-up tunes."""
    report = dict(shape=list(shape), dtype="bf16", causal=True, bucket=n_bucket(warm_up))
    if any(n_bucket(n) != report["bucket"] for ns in lengths.values() for n in ns):
        raise ValueError(f"every length must share the warm-up's bucket {report['bucket']}")
    if any(n_bucket(n) == report["bucket"] for n in nearest):
        raise ValueError(f"the nearest lengths must lie outside bucket {report['bucket']}")
    clear_plans()
    with (
        tempfile.TemporaryDirectory() as folder,
        knobs.cache.scope(),
        speedups(stored_tuning=False),
    ):
        knobs.cache.dir = folder
        with speedups(tune_by_bucket=True, nearest_bucket=False):
            report["warm_up"] = dict(n=warm_up, seconds=first_call_seconds(warm_up, shape, device))
        log(f"first call N={warm_up} (tunes the bucket): {report['warm_up']['seconds']:.2f} s")
        with (
            _as_if_new_process(),
            speedups(tune_by_bucket=True, nearest_bucket=False, parallel_compile=False),
        ):
            seconds = first_call_seconds(warm_up, shape, device)
        report["warm_up_serial"] = dict(n=warm_up, seconds=seconds)
        log(f"the same, compiling one configuration at a time: {seconds:.2f} s")
        for switch in ("on", "off"):
            with speedups(tune_by_bucket=switch == "on", nearest_bucket=False):
                report[switch] = [
                    dict(n=n, seconds=first_call_seconds(n, shape, device)) for n in lengths[switch]
                ]
            shown = ", ".join(f"N={r['n']} {r['seconds']:.2f} s" for r in report[switch])
            log(f"first call, tune_by_bucket {switch}: {shown}")
        with speedups(tune_by_bucket=True, nearest_bucket=True):
            report["nearest"] = [
                dict(n=n, bucket=n_bucket(n), seconds=first_call_seconds(n, shape, device))
                for n in nearest
            ]
        shown = ", ".join(
            f"N={r['n']} (bucket {r['bucket']}) {r['seconds']:.2f} s" for r in report["nearest"]
        )
        log(f"first call in a new bucket, borrowing the nearest tuned one: {shown}")
        report["stored"] = []
        for parallel in (True, False):
            with _as_if_new_process():
                for dtype, causal, n, d in stored:
                    with speedups(
                        tune_by_bucket=True,
                        nearest_bucket=True,
                        stored_tuning=True,
                        parallel_compile=parallel,
                    ):
                        table = stored_table(torch.device(device))
                        seconds = first_call_seconds(
                            n, (shape[0], shape[1], d), device, dtype, causal
                        )
                    report["stored"].append(
                        dict(
                            dtype=dtype,
                            causal=causal,
                            n=n,
                            d=d,
                            seconds=seconds,
                            stored=bool(table),
                            parallel=parallel,
                        )
                    )
            shown = ", ".join(
                f"{r['dtype']} {'causal' if r['causal'] else 'full'} N={r['n']} D={r['d']} "
                f"{r['seconds']:.2f} s" + ("" if r["stored"] else " (tuned: no stored picks)")
                for r in report["stored"]
                if r["parallel"] == parallel
            )
            how = "in parallel" if parallel else "one at a time"
            log(f"first call in a family never tuned here, stored picks, compiled {how}: {shown}")
    return report


@contextlib.contextmanager
def _as_if_new_process():
    """Inside: no plan, no tuned bucket, no compiled kernel in memory and an empty Triton
    cache folder, so every first call compiles (and tunes) as in a fresh process."""
    clear_plans()
    forget_compiled()
    with tempfile.TemporaryDirectory() as folder, knobs.cache.scope():
        knobs.cache.dir = folder
        yield
