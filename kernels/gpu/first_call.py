"""The cost of the first call at a new sequence length (issue 28), for ``kernels.gpu.check``.

Triton's autotuner keys on the exact lengths, so without help every new N re-times every
configuration of the three autotuned kernels (forward, dK/dV, dQ): 16-39 s forward + backward
on an H100. With :data:`kernels.attention.launch.SPEEDUPS` ``"tune_by_bucket"`` only the first
length of a power-of-two bucket is tuned; a later one only compiles, and not even that when it
has the same specialisation as one already compiled (no length here is a multiple of 16, like
the warm-up's, so each kernel is the one compiled already).

:func:`first_calls`: in one process, one warm-up length of the bucket (tuned: every
configuration compiled and timed), then three new lengths of that bucket with the switch on
and three with it off; the wall time of each first forward + backward (bf16, causal), with
the device synchronised before and after. The whole measurement uses a fresh, empty Triton
cache folder, so autotuning results stored on disk by an earlier run (``cache_results``)
cannot hide the cost of tuning, and every run measures the same thing.

Then the first calls in *new buckets* (``NEAREST``) with ``"nearest_bucket"`` on: each borrows
the tuned bucket's configuration, so it compiles at most. Triton specialises a length argument
on whether it is a multiple of 16, so 2,001 (like the warm-up's 1,000) can reuse the compiled
kernels where 2,000 needs its own, which 4,000, another multiple of 16 in a third bucket, then
reuses.
"""

from __future__ import annotations

import tempfile

from triton import knobs

from kernels import timing
from kernels.attention import flash_attention, launch

SHAPE = (1, 4, 64)  # (B, H, D)
WARM_UP = 1000  # tunes bucket 1024
LENGTHS = {"on": (1004, 1010, 1020), "off": (1006, 1012, 1022)}  # new, all in bucket 1024
NEAREST = (2001, 2000, 4000)  # buckets 2048 and 4096, not tuned: they borrow bucket 1024's pick


def first_call_seconds(n, shape=SHAPE, device="cuda") -> float:
    """Wall time of one forward + backward at length ``n`` (bf16, causal), synchronised."""
    batch, heads, d = shape
    q, k, v, grad = timing.inputs((batch, heads, n, d), device=device, seed=None)
    attn = lambda *qkv: flash_attention(*qkv, causal=True)  # noqa: E731
    _, wall_us = timing.host_and_wall_us(timing.step(attn, q, k, v, grad, "fwd+bwd"), calls=1)
    return wall_us / 1e6


def first_calls(
    warm_up=WARM_UP, lengths=LENGTHS, shape=SHAPE, device="cuda", log=print, nearest=NEAREST
):
    """The warm-up's and each new length's first-call seconds, with ``tune_by_bucket`` on and
    off, then each ``nearest`` length's in its new bucket (see the module docstring). Every
    plan and tuned bucket of the process is forgotten first, so the warm-up tunes."""
    report = dict(shape=list(shape), dtype="bf16", causal=True, bucket=launch.n_bucket(warm_up))
    if any(launch.n_bucket(n) != report["bucket"] for ns in lengths.values() for n in ns):
        raise ValueError(f"every length must share the warm-up's bucket {report['bucket']}")
    if any(launch.n_bucket(n) == report["bucket"] for n in nearest):
        raise ValueError(f"the nearest lengths must lie outside bucket {report['bucket']}")
    launch.clear_plans()
    with tempfile.TemporaryDirectory() as folder, knobs.cache.scope():
        knobs.cache.dir = folder
        with launch.speedups(tune_by_bucket=True, nearest_bucket=False):
            report["warm_up"] = dict(n=warm_up, seconds=first_call_seconds(warm_up, shape, device))
        log(f"first call N={warm_up} (tunes the bucket): {report['warm_up']['seconds']:.2f} s")
        for switch in ("on", "off"):
            with launch.speedups(tune_by_bucket=switch == "on", nearest_bucket=False):
                report[switch] = [
                    dict(n=n, seconds=first_call_seconds(n, shape, device)) for n in lengths[switch]
                ]
            shown = ", ".join(f"N={r['n']} {r['seconds']:.2f} s" for r in report[switch])
            log(f"first call, tune_by_bucket {switch}: {shown}")
        with launch.speedups(tune_by_bucket=True, nearest_bucket=True):
            report["nearest"] = [
                dict(n=n, bucket=launch.n_bucket(n), seconds=first_call_seconds(n, shape, device))
                for n in nearest
            ]
        shown = ", ".join(
            f"N={r['n']} (bucket {r['bucket']}) {r['seconds']:.2f} s" for r in report["nearest"]
        )
        log(f"first call in a new bucket, borrowing the nearest tuned one: {shown}")
    return report
