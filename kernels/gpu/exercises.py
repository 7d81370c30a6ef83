"""Checks of chapter 10's exercises (rules: :mod:`kernels.exercise_rules`).

* ``ch10-intensity`` :func:`check_flop_per_byte`: the roofline model's arithmetic intensity
* ``ch10-stream`` :func:`check_stream_tflops`: the speed of a stream of calls, host against GPU
* ``ch10-bits`` :func:`check_bit_changes`: which speed-ups can change a bit of O
"""

from __future__ import annotations

import math

import numpy as np

from .. import exercise_rules as ck
from .roofline import intensity


def _number(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        ck.fail(f"{name} should return a number, got {type(x).__name__}")
    return float(x)


def _close(a, b, rel=1e-6) -> bool:
    return abs(a - b) <= rel * abs(b)


# Exercise ``ch10-intensity``: Arithmetic intensity
def check_flop_per_byte(fn, thorough: bool = False) -> None:
    """Exercise ``ch10-intensity``: ``fn(n, d, itemsize, fused) -> FLOP per byte`` of one head's
    forward attention in the chapter's model (:func:`intensity`), for fresh lengths, head sizes,
    formats and both implementations."""
    ck.need_function(fn, "flop_per_byte")
    ck.forbid(fn, "ch10-intensity")
    rng = ck.fresh_rng()
    cases = 200 if thorough else 20
    for i in range(cases):
        n = int(rng.integers(16, 65_536))
        d = int(rng.choice([16, 32, 64, 96, 128, 256]))
        itemsize = int(rng.choice([1, 2, 4]))
        fused = bool(i % 2)  # both kinds in every run
        got = _number(ck.call(fn, "flop_per_byte", n, d, itemsize, fused), "flop_per_byte")
        want = intensity(n, d, "fused" if fused else "math", itemsize)
        if _close(got, want):
            continue
        kind = "fused kernel" if fused else "math backend"
        where = f"for the {kind} at n = {n}, d = {d}, itemsize = {itemsize}"
        if itemsize > 1 and _close(got, want * itemsize):
            ck.fail(f"too large {where}: the traffic is counted in values, not bytes")
        if not fused and _close(got, intensity(n, d, "fused", itemsize)):
            ck.fail(
                f"wrong {where}: the math backend also moves the N×N scores and "
                "probabilities through HBM"
            )
        if _close(got, want / 2) or _close(got, want * 2):
            ck.fail(
                f"off by a factor of two {where}: how many FLOPs does one multiply-add "
                "take, and how many N×N matmuls are there?"
            )
        ck.fail(
            f"not the model's intensity {where}: FLOPs of the two matmuls divided by the "
            "bytes that go through HBM"
        )
    ck.correct(f"{cases} fresh shapes and formats, fused and math")


# Exercise ``ch10-stream``: A stream of calls
def _stream_tflops_expected(flops, host_us, kernel_us) -> float:
    """TFLOP/s of a long stream of identical calls: the CPU issues the next call while the
    GPU runs the previous one, so the slower of the two sets the pace."""
    return flops / max(host_us, kernel_us) * 1e-6


def check_stream_tflops(fn, thorough: bool = False) -> None:
    """Exercise ``ch10-stream``: ``fn(flops, host_us, kernel_us) -> TFLOP/s`` of a long stream of
    calls that each do ``flops`` FLOPs, take ``host_us`` µs of CPU time to issue and ``kernel_us``
    µs of GPU time; fresh calls, host-bound and GPU-bound."""
    ck.need_function(fn, "stream_tflops")
    ck.forbid(fn, "ch10-stream")
    rng = ck.fresh_rng()
    cases = 200 if thorough else 20
    for i in range(cases):
        flops = float(10 ** rng.uniform(9, 13))
        fast, slow = sorted(float(x) for x in 10 ** rng.uniform(0.7, 3.7, 2))
        slow = max(slow, 1.3 * fast)
        host_us, kernel_us = (slow, fast) if i % 2 else (fast, slow)
        got = _number(ck.call(fn, "stream_tflops", flops, host_us, kernel_us), "stream_tflops")
        want = _stream_tflops_expected(flops, host_us, kernel_us)
        if _close(got, want, 1e-3):
            continue
        bound = "host-bound" if host_us > kernel_us else "GPU-bound"
        ratio = got / want if want else 0.0
        if (
            ratio > 0
            and abs(math.log10(ratio) - round(math.log10(ratio))) < 1e-3
            and round(math.log10(ratio)) != 0
        ):
            ck.fail(f"off by a power of ten on a {bound} call: FLOPs per µs are not TFLOP/s")
        if _close(got, flops / (host_us + kernel_us) * 1e-6, 1e-3):
            ck.fail(
                f"too slow on a {bound} call: does the CPU wait for the GPU to finish a "
                "call before it issues the next one?"
            )
        if bound == "host-bound" and _close(got, flops / kernel_us * 1e-6, 1e-3):
            ck.fail(
                "too fast on a host-bound call: the GPU cannot run a call before the CPU "
                "has issued it"
            )
        ck.fail(f"wrong on a {bound} call: which of the two times sets the pace of a stream?")
    ck.correct(f"{cases} fresh calls, host-bound and GPU-bound")


# Exercise ``ch10-bits``: Which changes move bits?
CHANGES = ("direct launch", "causal split", "tile shape", "exp2", "max first")


# The check's inputs are seeded (deterministic grading): with fresh inputs the right answer was
# rejected in 4 of 160 draws (a review of the checks found it): draws in which a change that can
# move bits moved none (not reproduced on a CPU: there the tile-shape change moved bits in 160 of
# 160 fresh small draws, so the rejections are the GPU's). Now the small part takes BIT_DRAWS draws
# from BIT_SEED and a change counts if it moves a bit in any of them (the question is which changes
# *can* move a bit); the changes that keep the order of the sums and the rounding never move one, in
# any draw.
BIT_SEED = 20261128
BIT_DRAWS = 4


def _bit_changes_expected(gen=None, rng=None, draws: int = 1) -> set:
    """Which of :data:`CHANGES` change a bit of O on bf16 inputs (fresh unless ``gen`` and
    ``rng`` are seeded): the book's kernel with its direct launches or its causal split
    switched off, with 64-key instead of 32-key tiles (what an autotuner may choose between),
    in each of ``draws`` small draws; and with its exp2 rewrite or its max-first row maximum
    switched off, on one large draw."""
    import torch

    from ..attention import flash_attention, speedups
    from ..timing import on_gpu

    gen = gen or ck.fresh_generator()
    rng = rng or ck.fresh_rng()
    device = "cuda" if on_gpu() else "cpu"
    tiles = dict(block_m=64, block_n=32)

    def run(**switches):
        with speedups(**switches):
            return flash_attention(q, k, v, causal=True, **tiles)

    changed = set()
    for _ in range(draws):
        n, d = int(rng.integers(96, 200)), int(rng.choice([16, 32]))
        q, k, v = (torch.randn(1, 2, n, d, generator=gen).bfloat16().to(device) for _ in range(3))
        tiles = dict(block_m=64, block_n=32)
        base = run(direct_launch=True, causal_split=True)
        outputs = {
            "direct launch": run(direct_launch=False, causal_split=True),
            "causal split": run(direct_launch=True, causal_split=False),
        }
        tiles = dict(block_m=64, block_n=64)
        outputs["tile shape"] = run(direct_launch=True, causal_split=True)
        changed |= {name for name, out in outputs.items() if not torch.equal(out, base)}
    # the rewrite moves fp32 values by a few ulps: a bf16 output flips in about one case in
    # three thousand, so this part uses 65,536 outputs (~20 flips)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=gen).bfloat16().to(device) for _ in range(3))
    tiles = dict(block_m=64, block_n=32)
    if not torch.equal(run(exp2=True), run(exp2=False)):
        changed.add("exp2")
    if not torch.equal(run(max_first=True), run(max_first=False)):
        changed.add("max first")
    return changed


_SEEDED: dict = {}


def _seeded_expected(seed: int = BIT_SEED, draws: int = BIT_DRAWS) -> set:
    """:func:`_bit_changes_expected` on the check's seeded inputs (computed once a process)."""
    import torch

    if (seed, draws) not in _SEEDED:
        gen = torch.Generator().manual_seed(seed)
        _SEEDED[seed, draws] = _bit_changes_expected(gen, np.random.default_rng(seed), draws)
    return set(_SEEDED[seed, draws])


def check_bit_changes(answer) -> None:
    """Exercise ``ch10-bits``: the set of changes (names from :data:`CHANGES`) that can change a bit
    of the kernel's output. The check makes each change on seeded inputs (the same on every run, so
    grading is deterministic) and compares bits."""
    given = ck.need_names(answer, "changes_bits", CHANGES, '{"exp2"}')
    want = _seeded_expected()
    if given == want:
        return ck.correct(
            f"{len(want)} of the {len(CHANGES)} change bits of O on {BIT_DRAWS + 1} draws, "
            "the others none"
        )
    if given - want:
        ck.fail(
            "a change in your set leaves every bit of O as it was: does it change which "
            "numbers are added, in which order, or how they are rounded?"
        )
    ck.fail(
        "a change that moves bits of O is missing: which ones change the order of the sums "
        "or the rounding of an intermediate?"
    )
