"""Chapter 1's worked example and the checks of its exercises (rules:
:mod:`kernels.exercise_rules`).

* ``ex-bf16-count`` :func:`check_binade_count`: how many BF16 values one binade holds
* ``ex-bf16-round-bits`` :func:`check_round_bits`: round an FP32 bit pattern to BF16 with integers
* ``ex-bf16-which-up`` :func:`check_rounds_away`: which of four sums round away from zero, and why
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..exercise_rules import call, correct, fail, forbid, fresh_rng, need, need_function
from .addition import add_trace
from .formats import get_format

# Qiu & Yao's worked example (§3.3.2): an FP32 accumulator plus a BF16 value, the sum
# rounded to BF16.
PAPER_EXAMPLE = {
    "acc_pattern": "11000000000110100000111000101110",
    "b": -2.296875,
    "acc_fmt": "fp32",
    "b_fmt": "bf16",
    "out_fmt": "bf16",
}

# Exercise ``ex-bf16-which-up``: FP32 accumulator + BF16 value, rounded to BF16. Which
# round away from zero?
# Sums the chapter's text does not trace before the exercise (its examples use other values);
# sum 1 is sum 0 plus a same-signed residual of 2000 FP32 ulps, so its exact sum fits in FP32.
EXERCISE_SUMS = [
    (-2.53125, -2.234375),
    (-2.53125 - 2000 * 2**-21, -2.234375),
    (1.0078125, 1.0),
    (1.5546875, 1.5),
]


def _all_values(fmt) -> np.ndarray:
    f = get_format(fmt)
    codes = np.arange(2**f.total_bits, dtype=np.uint64).astype(f.uint)
    with np.errstate(invalid="ignore"):
        return codes.view(f.dtype).astype(np.float64)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-bf16-count``: One binade
# ----------------------------------------------------------------------------------------------
def _binade_count(e: int) -> int:
    """How many BF16 values lie in [2^e, 2^(e+1)), counted over all 65,536 bit patterns."""
    v = _all_values("bf16")
    return int(np.count_nonzero((v >= 2.0**e) & (v < 2.0 ** (e + 1))))


def check_binade_count(answer) -> None:
    """Exercise ``ex-bf16-count``: the number of BF16 values in one binade [2^e, 2^(e+1)) of normal
    numbers.

    The check counts over all 65,536 BF16 patterns in a binade drawn at random (any normal one:
    the count must not depend on e)."""
    need(answer, "n_per_binade", "an int")
    if not _is_int(answer):
        fail(f"n_per_binade should be an int, got {type(answer).__name__}")
    e = int(fresh_rng().integers(-126, 128))
    want = _binade_count(e)
    if answer == want:
        return correct("n_per_binade matches the count in a fresh binade of normal numbers")
    if answer == 2 * want:
        fail("too many: the leading 1 of a normal number is not stored, so it cannot vary")
    if answer in (want - 1, want + 1):
        fail("off by one: is 2^e itself in the binade, and is 2^(e+1)?")
    fail(
        "not right: every number in the binade has the same sign and exponent field; "
        "which bits are left to vary, and how many patterns do they make?"
    )


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-bf16-round-bits``: Round to nearest even with integers
# ----------------------------------------------------------------------------------------------
_HALF = 0x8000  # the guard bit alone: exactly half a BF16 ulp below the kept bits

# (name of a kind of input, what to say when an answer gets that kind wrong)
_KINDS = {
    "below half": "wrong when the dropped bits are less than half an ulp: those round down",
    "above half": "wrong when the dropped bits are more than half an ulp (is it truncating?)",
    "tie, even": "wrong on exact ties (dropped bits exactly 1000...0) whose kept last bit is 0: "
    "which neighbour does ties-to-even pick?",
    "tie, odd": "wrong on exact ties (dropped bits exactly 1000...0) whose kept last bit is 1: "
    "which neighbour does ties-to-even pick?",
    "carry": "wrong when rounding up carries out of the fraction into the exponent",
    "subnormal or zero": "wrong on zero and subnormal numbers (exponent field 0)",
    "negative": "wrong on negative numbers: rounding is symmetric, the sign bit just stays",
}


def _patterns(rng: np.random.Generator, per_kind: int) -> dict[str, np.ndarray]:
    """FP32 bit patterns (uint32) of each kind; no NaN (exponent field 255 only as ±inf)."""

    def make(sign, exponent, kept_fraction, dropped):
        return (
            (sign.astype(np.uint64) << 31)
            | (exponent.astype(np.uint64) << 23)
            | (kept_fraction.astype(np.uint64) << 16)
            | dropped.astype(np.uint64)
        ).astype(np.uint32)

    n = per_kind
    zero = np.zeros(n, dtype=np.uint64)
    exponent = rng.integers(1, 255, n)  # normal numbers
    kept = rng.integers(0, 128, n)
    even, odd = kept & ~1, kept | 1
    return {
        "below half": make(zero, exponent, kept, rng.integers(0, _HALF, n)),
        "above half": make(zero, exponent, kept, rng.integers(_HALF + 1, 0x10000, n)),
        "tie, even": make(zero, exponent, even, np.full(n, _HALF)),
        "tie, odd": make(zero, exponent, odd, np.full(n, _HALF)),
        "carry": make(
            zero, rng.integers(1, 254, n), np.full(n, 127), rng.integers(_HALF + 1, 0x10000, n)
        ),
        "subnormal or zero": make(zero, zero, kept, rng.integers(0, 0x10000, n)),
        "negative": make(np.ones(n, dtype=np.uint64), exponent, kept, rng.integers(0, 0x10000, n)),
    }


def _round_bits_expected(patterns: np.ndarray) -> np.ndarray:
    """BF16 patterns (uint16) of FP32 patterns (uint32) by the library's cast: RNE, once."""
    values = np.asarray(patterns, dtype=np.uint32).view(np.float32)
    return values.astype(ml_dtypes.bfloat16).view(np.uint16)


def check_round_bits(fn, thorough: bool = False) -> None:
    """Exercise ``ex-bf16-round-bits``: ``fn(bits32: int) -> int`` rounds an FP32 bit pattern to the
    nearest BF16 pattern, ties to even. Fresh patterns of every kind: below, above and exactly at
    half an ulp, carries into the exponent, subnormals, negatives. ``thorough`` (the grader's hidden
    test) tries ten times as many."""
    need_function(fn, "round_bits_to_bf16")
    forbid(fn, "ex-bf16-round-bits")
    rng = fresh_rng()
    kinds = _patterns(rng, 400 if thorough else 40)
    for kind, patterns in kinds.items():
        want = _round_bits_expected(patterns)
        for pattern, w in zip(patterns.tolist(), want.tolist()):
            got = call(fn, "round_bits_to_bf16", pattern)
            if not _is_int(got):
                fail(
                    f"round_bits_to_bf16 should return an int (the 16-bit pattern), "
                    f"got {type(got).__name__}"
                )
            if not 0 <= got < 1 << 16:
                fail(
                    "round_bits_to_bf16 returned a number that is not a 16-bit pattern: keep "
                    "the top 16 bits"
                )
            if got != w:
                fail(f"round_bits_to_bf16 is {_KINDS[kind]}")
    total = sum(p.size for p in kinds.values())
    correct(
        f"{total:,} fresh FP32 patterns of {len(kinds)} kinds rounded exactly as the hardware does"
    )


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-bf16-which-up``: Which sums round away from zero?
# ----------------------------------------------------------------------------------------------
def _rounds_away_expected() -> set[int]:
    """Indices of :data:`EXERCISE_SUMS` whose BF16 sum grows in magnitude (traced exactly)."""
    return {
        i
        for i, (acc, b) in enumerate(EXERCISE_SUMS)
        if add_trace(acc, b, "bf16", a_fmt="fp32").rounded_up
    }


def check_rounds_away(answer) -> None:
    """Exercise ``ex-bf16-which-up``: the set of indices of :data:`EXERCISE_SUMS` that round away
    from zero.

    The check traces the four sums bit by bit. (The question is about these four sums, so its
    input is fixed; the reasoning is what the solution explains.)"""
    need(answer, "rounds_away", "a set of indices such as {0, 2}")
    try:
        given = {int(i) for i in answer}
    except (TypeError, ValueError):
        fail(f"rounds_away should be a set of indices (ints), got {answer!r}")
    if not given <= set(range(len(EXERCISE_SUMS))):
        fail(f"the indices go from 0 to {len(EXERCISE_SUMS) - 1}")
    want = _rounds_away_expected()
    if given == want:
        return correct("exactly the sums that round away from zero, traced bit by bit")
    ties = {
        i for i, (acc, b) in enumerate(EXERCISE_SUMS) if add_trace(acc, b, "bf16", a_fmt="fp32").tie
    }
    if given - want and (given - want) <= ties:
        fail("an exact tie does not always round up: look at the kept last bit")
    if want - given:
        fail(
            "a sum that rounds away is missing: after the carry, look at the guard bit and at "
            "whether any bit below it is set"
        )
    fail("not right: trace each sum (guard, round and sticky bits, and the kept last bit)")
