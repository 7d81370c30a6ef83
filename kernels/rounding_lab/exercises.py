"""Checks of the exercises of chapters 5 and 6 (rules: :mod:`kernels.exercise_rules`).

* ``ex-sources-mirror`` :func:`check_mirror`: the sign of the ideal's bias in the mirrored setting
* ``ex-sources-midpoint`` :func:`check_ideal_error`: predict the ideal output's error from the two
  tied V
* ``ex-fixes-window`` :func:`check_window`: up to which r_m the β rule still gives P̄ = 1 in FP16
* ``ex-fixes-delta`` :func:`check_delta_dp`: δ from P and dP, without O
* ``ex-fixes-offset`` :func:`check_offset`: Algorithm 3's offset m for each row
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import exercise_rules as ck
from ..attention.emulator import offset_rule
from ..numerics.formats import round_to as round_np
from .cases import EXP_ROUNDS_TO_ONE, VDist, small_lab_case
from .implementations import measure


def _number(answer, name: str) -> float:
    ck.need(answer, name, "a number")
    if isinstance(answer, bool) or not isinstance(answer, (int, float, np.integer, np.floating)):
        ck.fail(f"{name} should be a number, got {type(answer).__name__}")
    return float(answer)


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-sources-mirror``: The mirrored setting
# ----------------------------------------------------------------------------------------------
def _mirror_sign(seed: int | None = None) -> int:
    """Sign of the ideal's mean error with tied V ~ N(+1, 0.3), other V ~ N(0, 0.3), k = 2,
    gap 16, on rows built from ``seed`` (fresh if None); 0 if within 4 standard errors of 0."""
    case = small_lab_case(
        ties=2, gap=16.0, v_tied=VDist("normal", 1.0, 0.3), v_rest=VDist("normal", 0.0, 0.3)
    )
    st = measure(case, "ideal", "off", seed=ck.fresh_seed() if seed is None else seed)
    return int(np.sign(st["mean"])) if abs(st["mean"]) > 4 * st["se"] else 0


def check_mirror(answer) -> None:
    """Exercise ``ex-sources-mirror``: +1, -1 or 0, the sign of the ideal output's bias in the
    mirrored setting. The check measures it on freshly built rows."""
    ck.need(answer, "mirror", "+1, -1 or 0")
    if isinstance(answer, bool) or answer not in (1, -1, 0):
        ck.fail(f"mirror should be +1, -1 or 0, got {answer!r}")
    if answer == _mirror_sign():
        return ck.correct("the measurement on fresh rows has that sign")
    ck.fail(
        "not that one: in which direction do the other tokens nudge an output that sits on a "
        "midpoint, and where does the nudged value round to?"
    )


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-sources-midpoint``: Predict the ideal's error
# ----------------------------------------------------------------------------------------------
def _bf16_pairs(rng: np.random.Generator, n: int):
    """``n`` pairs of BF16 values of one sign and one binade, and a pull of ±1 for each."""
    exponent = rng.integers(-3, 3, n).astype(np.float64)
    sign = rng.choice([-1.0, 1.0], n)
    frac_a, frac_b = rng.integers(0, 128, n), rng.integers(0, 128, n)
    va = sign * (1 + frac_a / 128) * 2.0**exponent
    vb = sign * (1 + frac_b / 128) * 2.0**exponent
    pull = rng.choice([-1.0, 1.0], n)
    return va, vb, pull


def _ideal_error_expected(va, vb, pull):
    """Error of bf16(O) - O in ulps of (va + vb)/2 when O = (va + vb)/2 moved a tiny step
    (a thousandth of an ulp) in the direction ``pull``: what the other tokens do to O."""
    va, vb, pull = (np.asarray(t, dtype=np.float64) for t in (va, vb, pull))
    mid = (va + vb) / 2
    unit = np.ldexp(1.0, np.frexp(np.abs(mid))[1] - 1 - 7)
    o = mid + pull * unit * 1e-3
    return (round_np(o, "bf16") - o) / unit


def check_ideal_error(fn, thorough: bool = False) -> None:
    """Exercise ``ex-sources-midpoint``: ``fn(va, vb, pull) -> error`` (NumPy arrays; error in ulps
    to ±0.01).

    Two tied maxima with BF16 values ``va`` and ``vb`` (one sign, one binade); the other tokens
    pull O = (va + vb)/2 by a tiny amount in the direction ``pull`` (±1). Predict bf16(O) - O
    in ulps of O. Fresh pairs."""
    ck.need_function(fn, "ideal_error")
    ck.forbid(fn, "ex-sources-midpoint")
    rng = ck.fresh_rng()
    va, vb, pull = _bf16_pairs(rng, 2000 if thorough else 200)
    want = _ideal_error_expected(va, vb, pull)
    got = ck.call(fn, "ideal_error", va.copy(), vb.copy(), pull.copy())
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        ck.fail(
            f"ideal_error should return one error per pair: shape {want.shape}, got {got.shape}"
        )
    wrong = np.abs(got - want) > 0.01
    if not wrong.any():
        return ck.correct(f"{want.size:,} fresh pairs predicted")
    mid = (va + vb) / 2
    on_midpoint = np.abs(want) > 0.25
    if (wrong & ~on_midpoint).any():
        ck.fail(
            "wrong where (va + vb)/2 is itself a BF16 number: how far can a tiny pull move "
            "it from where it rounds to?"
        )
    if (wrong & on_midpoint & (mid * pull > 0)).any() and (
        wrong & on_midpoint & (mid * pull < 0)
    ).any():
        ck.fail(
            "wrong on midpoints: the rounding there is decided by the pull, not by ties to "
            "even; which way does it go, and what is the sign of the error?"
        )
    ck.fail(
        "wrong on midpoints for one direction of the pull: check the sign of the error "
        "(rounded minus exact)"
    )


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-fixes-window``: The window of the β rule
# ----------------------------------------------------------------------------------------------
def _window_expected(beta: float) -> float:
    """Largest tied row maximum r_m for which e^(-(β-1) r_m) still rounds to 1.0 in FP16: the
    largest FP16 number below 1 is 1 - 2^-11, and the halfway point 1 - 2^-12 rounds (ties to
    even) up to 1.0. The chapter works out BF16's window; the exercise asks for FP16's."""
    return -math.log1p(-(2.0**-12)) / (beta - 1.0)


def check_window(fn, thorough: bool = False) -> None:
    """Exercise ``ex-fixes-window``: ``fn(beta) -> r_max`` within 0.5%, for fresh β between 1.01 and
    8, with P̄ rounded to FP16."""
    ck.need_function(fn, "r_max")
    ck.forbid(fn, "ex-fixes-window")
    rng = ck.fresh_rng()
    betas = np.exp(rng.uniform(math.log(1.01), math.log(8.0), 200 if thorough else 20))
    for beta in betas.tolist():
        got = _number(ck.call(fn, "r_max", beta), "r_max(beta)")
        want = _window_expected(beta)
        if abs(got - want) <= 5e-3 * want:
            continue
        if got <= 0:
            ck.fail("r_max is a positive row maximum")
        if abs(got - EXP_ROUNDS_TO_ONE / (beta - 1.0)) <= 5e-3 * want:
            ck.fail("that is BF16's window (section 3): how many mantissa bits does FP16 store?")
        if abs(got * (beta - 1) / beta - want) <= 5e-3 * want:
            ck.fail(
                "the tied entries get P̄ = e^(r_m - β r_m): which multiple of r_m is in the "
                "exponent?"
            )
        if abs(got / 2 - want) <= 5e-3 * want or abs(got * 2 - want) <= 5e-3 * want:
            ck.fail(
                "off by a factor of two: where is the rounding boundary between 1.0 and the "
                "largest FP16 number below it?"
            )
        ck.fail("not within 0.5%: which value of e^(-x) rounds up to 1.0 in FP16, and what is x?")
    ck.correct(f"{betas.size} fresh values of β within 0.5%")


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-fixes-delta``: δ without O
# ----------------------------------------------------------------------------------------------
def check_delta_dp(fn, thorough: bool = False) -> None:
    """Exercise ``ex-fixes-delta``: ``fn(p, d_p) -> δ`` per row from the probabilities and dP = dO
    Vᵀ, shaped (rows, keys) or with leading batch dimensions: both are checked, in the notebook
    as in the grader (``thorough`` adds a second batched draw)."""
    ck.need_function(fn, "delta_dp")
    ck.forbid(fn, "ex-fixes-delta")
    gen, rng = ck.fresh_generator(), ck.fresh_rng()
    shapes = [(int(rng.integers(3, 9)), int(rng.integers(20, 60)))]
    shapes += [(2, 3, int(rng.integers(3, 9)), int(rng.integers(20, 60)))] * (2 if thorough else 1)
    for shape in shapes:
        *lead, rows, keys = shape
        d = int(rng.integers(4, 12))
        p = torch.softmax(torch.randn(*shape, generator=gen, dtype=torch.float64) * 2, -1)
        v = torch.randn(*lead, keys, d, generator=gen, dtype=torch.float64)
        d_out = torch.randn(*lead, rows, d, generator=gen, dtype=torch.float64)
        want = (d_out * (p @ v)).sum(-1)  # rowsum(dO ∘ O)
        got = ck.call(fn, "delta_dp", p.clone(), d_out @ v.transpose(-1, -2))
        why = f"one δ per row: for p of shape {tuple(shape)} expected shape {tuple(want.shape)}"
        ck.need_tensor(got, "delta_dp", want.shape, why)
        if not torch.allclose(got.double(), want, atol=1e-10, rtol=1e-10):
            ck.fail(
                "the shape is right but the values are not δ = rowsum(dO ∘ O): which two "
                "tensors are multiplied, and along which axis is the sum?"
            )
    ck.correct(f"fresh P and dP of shapes {[tuple(s) for s in shapes]}: δ agrees to 1e-10")


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-fixes-offset``: Algorithm 3's offset
# ----------------------------------------------------------------------------------------------
def _offset_expected(scores, beta: float, eps: float):
    """Algorithm 3's m for each row of ``scores`` (no rounding)."""
    rm = scores.amax(-1)
    rs = (scores >= (rm - eps).unsqueeze(-1)).sum(-1).to(scores.dtype)
    return offset_rule(rm, rs, beta, lambda x: x)


def _offset_rows(gen, rng, n_rows: int, eps: float):
    """Rows of scores of five kinds: the maximum positive or negative, alone or tied (exactly,
    or within ε), and a second score just outside ε. Returns scores and the kind of each row."""
    keys = int(rng.integers(12, 40))
    kinds = rng.integers(0, 5, n_rows)
    rm = torch.from_numpy(rng.uniform(0.5, 6.0, n_rows) * rng.choice([-1.0, 1.0], n_rows))
    scores = (
        rm.unsqueeze(-1) - 1.0 - 3 * torch.rand(n_rows, keys, generator=gen, dtype=torch.float64)
    )
    for r, kind in enumerate(kinds.tolist()):
        pos = torch.randperm(keys, generator=gen)[:3]
        scores[r, pos[0]] = rm[r]
        if kind == 1:  # exact ties
            scores[r, pos[1:]] = rm[r]
        elif kind == 2:  # a tie within ε
            scores[r, pos[1]] = rm[r] - 0.5 * eps
        elif kind == 3:  # just outside ε: no tie
            scores[r, pos[1]] = rm[r] - 2.0 * eps
        elif kind == 4:  # one exact tie and one within ε
            scores[r, pos[1]] = rm[r]
            scores[r, pos[2]] = rm[r] - 0.25 * eps
    return scores, kinds, rm


_ROW_KINDS = {
    0: "a single maximum",
    1: "exactly tied maxima",
    2: "two maxima within ε",
    3: "a second score just outside ε",
    4: "several maxima, exact and within ε",
}


def check_offset(fn, thorough: bool = False) -> None:
    """Exercise ``ex-fixes-offset``: ``fn(scores, beta, eps) -> m``, one offset per row of the
    (rows, keys) fp64 ``scores``. Fresh rows: the maximum positive or negative, alone, tied exactly,
    tied within ε, or with a second score just outside ε."""
    ck.need_function(fn, "offset")
    ck.forbid(fn, "ex-fixes-offset")
    gen, rng = ck.fresh_generator(), ck.fresh_rng()
    for _ in range(5 if thorough else 1):
        beta, eps = float(rng.uniform(1.5, 8.0)), float(10 ** rng.uniform(-4, -2))
        scores, kinds, rm = _offset_rows(gen, rng, 60, eps)
        want = _offset_expected(scores, beta, eps)
        got = ck.call(fn, "offset", scores.clone(), beta, eps)
        ck.need_tensor(got, "offset", want.shape, f"one m per row: expected {tuple(want.shape)}")
        bad = ~torch.isclose(got.double(), want, rtol=1e-12, atol=1e-12)
        if not bad.any():
            continue
        r = int(bad.nonzero()[0])
        sign = "positive" if rm[r] > 0 else "negative"
        ck.fail(
            f"wrong m for a row with {_ROW_KINDS[int(kinds[r])]} and a {sign} maximum: "
            "when does the rule count a score as a tie, and what does it choose in each case?"
        )
    ck.correct("fresh rows: single, tied, within ε, just outside ε; maxima of both signs")
