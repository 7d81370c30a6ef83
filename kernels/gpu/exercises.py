"""Checks of chapter 10's exercises (rules: :mod:`kernels.exercise_rules`).

* ``ch10-intensity`` :func:`check_flop_per_byte`: the roofline model's arithmetic intensity of
  grouped-query attention
* ``ch10-stream`` :func:`check_stream_tflops`: the speed of a stream of calls, host against GPU
* ``ch10-bits`` :func:`check_bit_changes`: which changes to an attention call can change a bit of O
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


# Exercise ``ch10-intensity``: Arithmetic intensity of grouped-query attention
def _gqa_intensity(n: int, d: int, itemsize: int, groups: int) -> float:
    """FLOP per byte of the fused forward for one K/V head shared by ``groups`` query heads, in
    section 1's model: each query head does its two N×N×d matmuls (4N²d FLOPs) and reads its Q
    and writes its O once; K and V are read once for the whole group."""
    flops = 4.0 * n * n * d * groups
    values = 2 * n * d * groups + 2 * n * d
    return flops / (values * itemsize)


def check_flop_per_byte(fn, thorough: bool = False) -> None:
    """Exercise ``ch10-intensity``: ``fn(n, d, itemsize, groups) -> FLOP per byte`` of the fused
    forward of grouped-query attention in the chapter's model (:func:`_gqa_intensity`; one group
    is the chapter's ``intensity(n, d)``), for fresh lengths, head sizes, formats and groups."""
    ck.need_function(fn, "flop_per_byte")
    ck.forbid(fn, "ch10-intensity")
    rng = ck.fresh_rng()
    cases = 200 if thorough else 20
    for i in range(cases):
        n = int(rng.integers(16, 65_536))
        d = int(rng.choice([16, 32, 64, 96, 128, 256]))
        itemsize = int(rng.choice([1, 2, 4]))
        groups = 1 if i == 0 else int(rng.choice([2, 3, 4, 6, 8, 16]))
        got = _number(ck.call(fn, "flop_per_byte", n, d, itemsize, groups), "flop_per_byte")
        want = _gqa_intensity(n, d, itemsize, groups)
        if _close(got, want):
            continue
        where = f"at n = {n}, d = {d}, itemsize = {itemsize}, groups = {groups}"
        if groups == 1:
            ck.fail(f"wrong {where}: one group is section 1's fused kernel")
        if itemsize > 1 and _close(got, want * itemsize):
            ck.fail(f"too large {where}: the traffic is counted in values, not bytes")
        if _close(got, intensity(n, d, "fused", itemsize)):
            ck.fail(f"too small {where}: K and V are read once for the whole group")
        if _close(got * groups, want):
            ck.fail(f"too small {where}: every query head does its own two matmuls")
        if _close(got, want / 2) or _close(got, want * 2):
            ck.fail(
                f"off by a factor of two {where}: how many FLOPs does one multiply-add "
                "take, and how many N×N matmuls are there per query head?"
            )
        ck.fail(
            f"not the model's intensity {where}: FLOPs of every query head's two matmuls "
            "divided by the bytes that go through HBM"
        )
    ck.correct(f"{cases} fresh shapes, formats and group sizes")


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
CHANGES = ("query tile", "key tile", "batch neighbours", "prefix", "key order")


# The check's inputs are seeded (deterministic grading): with fresh inputs the right answer was
# once rejected in 4 of 160 draws, draws in which a change that can move bits moved none on the
# GPU. The check takes BIT_DRAWS draws from BIT_SEED and a change counts if it moves a bit in
# any of them (the question is which changes *can* move a bit); the changes that keep every sum's
# terms, their order and their rounding never move one, in any draw.
BIT_SEED = 20261128
BIT_DRAWS = 4


def _bit_changes_expected(gen=None, rng=None, draws: int = 1) -> set:
    """Which of :data:`CHANGES` change a bit of O on bf16 inputs (fresh unless ``gen`` and
    ``rng`` are seeded), against the book's kernel, causal, with 64-query and 32-key tiles:
    32-query tiles; 64-key tiles; the same heads in a batch of four; the first ``cut`` queries
    computed from the first ``cut`` keys alone; and, without a mask, keys and values in reverse
    order (the same attention, mathematically)."""
    import torch

    from ..attention import flash_attention
    from ..timing import on_gpu

    gen = gen or ck.fresh_generator()
    rng = rng or ck.fresh_rng()
    device = "cuda" if on_gpu() else "cpu"

    def run(q, k, v, causal=True, block_m=64, block_n=32):
        return flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)

    changed = set()
    for _ in range(draws):
        n, d = int(rng.integers(96, 200)), int(rng.choice([16, 32]))
        q, k, v = (torch.randn(1, 2, n, d, generator=gen).bfloat16().to(device) for _ in range(3))
        base = run(q, k, v)
        batch = [torch.randn(3, 2, n, d, generator=gen).bfloat16().to(device) for _ in range(3)]
        batch = [torch.cat([b[:1], x, b[1:]]) for b, x in zip(batch, (q, k, v))]
        cut = n - int(rng.integers(1, 60))
        prefix = run(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut])
        outputs = {
            "query tile": run(q, k, v, block_m=32),
            "key tile": run(q, k, v, block_n=64),
            "batch neighbours": run(*batch)[1:2],
            "prefix": torch.cat([prefix, base[:, :, cut:]], dim=2),
        }
        changed |= {name for name, out in outputs.items() if not torch.equal(out, base)}
        reversed_keys = run(q, k.flip(2), v.flip(2), causal=False)
        if not torch.equal(reversed_keys, run(q, k, v, causal=False)):
            changed.add("key order")
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
    given = ck.need_names(answer, "changes_bits", CHANGES, '{"prefix"}')
    want = _seeded_expected()
    if given == want:
        return ck.correct(f"the changes that move bits of O, compared on {BIT_DRAWS} draws")
    if given - want:
        ck.fail(
            "a change in your set leaves every bit of O as it was: does it change which "
            "numbers are added, in which order, or how they are rounded?"
        )
    ck.fail(
        "a change that moves bits of O is missing: which ones change the order of the sums "
        "or the rounding of an intermediate?"
    )
