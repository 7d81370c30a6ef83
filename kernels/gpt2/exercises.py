"""Checks of the GPT-2 chapter's exercises (rules: :mod:`kernels.exercise_rules`).

* ``ex-gpt2-tokens`` :func:`check_minutes`: how long our model needs to see the paper's tokens
* ``ex-gpt2-ties`` :func:`check_tie_counts`: two ways of counting repeated maxima in a row
* ``ex-gpt2-logit`` :func:`check_departure`: the step from which one series leaves another for good
"""

from __future__ import annotations

import numpy as np
import torch

from ..exercise_rules import call, correct, fail, forbid, fresh_generator, fresh_rng, need_function
from .report import departure

PAPER_TOKENS = 6_600 * 524_288  # the paper's run before it failed: steps × tokens/step
OUR_TOKENS_PER_STEP = 64 * 256


def _number(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        fail(f"{name} should return a number, got {type(x).__name__}")
    return float(x)


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-gpt2-tokens``: Tokens against time
# ----------------------------------------------------------------------------------------------
def _minutes_expected(steps_per_s: float) -> float:
    return PAPER_TOKENS / OUR_TOKENS_PER_STEP / steps_per_s / 60


def check_minutes(fn, thorough: bool = False) -> None:
    """Exercise ``ex-gpt2-tokens``: ``fn(steps_per_s) -> minutes`` our model needs to see as many
    tokens as the paper's did before it failed, within 1%, for fresh speeds."""
    need_function(fn, "minutes")
    forbid(fn, "ex-gpt2-tokens")
    speeds = fresh_rng().uniform(5.0, 200.0, 100 if thorough else 10)
    for speed in speeds.tolist():
        got = _number(call(fn, "minutes", speed), "minutes")
        want = _minutes_expected(speed)
        if abs(got - want) <= 0.01 * want:
            continue
        if abs(got - 60 * want) <= 0.01 * 60 * want:
            fail("that is the time in seconds: the question asks for minutes")
        if abs(got - want / 60) <= 0.01 * want / 60:
            fail("that is the time in hours: the question asks for minutes")
        fail(
            "not within 1%: the number of steps is the paper's tokens divided by our tokens "
            "per step, and the speed is in steps per second"
        )
    correct(f"{speeds.size} fresh speeds within 1%")


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-gpt2-ties``: Two tie counts
# ----------------------------------------------------------------------------------------------
def _tie_counts(row) -> tuple[int, int]:
    """(entries with P̄ = exp(S − max S) == 1.0 in bf16, entries exactly equal to the maximum)."""
    row = torch.as_tensor(row, dtype=torch.float32)
    p_bar = torch.exp(row - row.max()).bfloat16()
    return int((p_bar == 1.0).sum()), int((row == row.max()).sum())


def _tie_rows(gen, rng, n: int):
    """fp32 rows with exact ties, entries a little below the maximum (some whose P̄ rounds to
    1.0 in bf16, some just too far below for that) and the rest far below."""
    rows = []
    for _ in range(n):
        keys = int(rng.integers(12, 40))
        top = float(rng.uniform(-8, 8))
        row = top - torch.rand(keys, generator=gen, dtype=torch.float64) * 9 - 1
        pos = torch.randperm(keys, generator=gen)
        counts = rng.integers(0, 4, 3)  # exact, inside, just outside
        row[pos[0]] = top
        at = 1
        for count, (lo, hi) in zip(counts.tolist(), [(0, 0), (1e-5, 1.5e-3), (2.5e-3, 4e-3)]):
            for _ in range(count):
                row[pos[at]] = top - float(rng.uniform(lo, hi))
                at += 1
        rows.append(row.float())
    return rows


def check_tie_counts(fn, thorough: bool = False) -> None:
    """Exercise ``ex-gpt2-ties``: ``fn(row) -> (rounding_to_one, exactly_tied)`` for an fp32 tensor
    of scores: how many entries get P̄ = exp(S − max S) equal to 1.0 once rounded to BF16 (the FA2
    count), and how many equal the maximum exactly. Fresh rows with ties and near ties."""
    need_function(fn, "tie_counts")
    forbid(fn, "ex-gpt2-ties")
    gen, rng = fresh_generator(), fresh_rng()
    rows = _tie_rows(gen, rng, 200 if thorough else 30)
    for row in rows:
        got = call(fn, "tie_counts", row.clone())
        try:
            ones, tied = (int(v) for v in got)
        except (TypeError, ValueError):
            fail(f"tie_counts should return a pair of counts, got {got!r}")
        want_ones, want_tied = _tie_counts(row)
        if tied != want_tied:
            fail(
                "the second count is wrong on a row with near ties: which entries are "
                "*exactly* equal to the largest score?"
            )
        if ones != want_ones:
            if ones == want_tied:
                fail(
                    "the first count is wrong on a row with near ties: P̄ is rounded to BF16 "
                    "before it is compared with 1.0"
                )
            fail(
                "the first count is wrong on a row with near ties: how far below 1 is the "
                "largest BF16 number under 1.0, and which values round up to 1.0?"
            )
    correct(f"{len(rows)} fresh rows with ties and near ties")


# ----------------------------------------------------------------------------------------------
# Exercise ``ex-gpt2-logit``: When does a series leave for good?
# ----------------------------------------------------------------------------------------------
def _departure_expected(steps, failing, control, ratio: float):
    return departure(steps, failing, steps, control, ratio, 1)


def _series(rng, kind: str):
    """A control series and a failing one whose ratio to it crosses ``ratio`` as ``kind`` says:
    'for good' (an excursion above, back below, then above to the end), 'never' (above only
    for a while) or 'always' (above from the start)."""
    n = int(rng.integers(60, 200))
    steps = np.arange(n) * int(rng.choice([5, 10, 50]))
    control = np.exp(rng.normal(0, 0.05, n).cumsum() * 0.1) * float(rng.uniform(1, 100))
    ratio = float(rng.uniform(1.1, 2.0))
    factor = np.full(n, 1.0) * rng.uniform(0.8, 0.95, n) * ratio
    a, b, c = sorted(rng.choice(np.arange(5, n - 8), 3, replace=False).tolist())
    if kind in ("for good", "never"):
        factor[a:b] = ratio * rng.uniform(1.05, 1.3, b - a)  # above for a while
    if kind == "for good":
        factor[c:] = ratio * rng.uniform(1.05, 1.5, n - c)  # above to the end
    if kind == "always":
        factor[:] = ratio * rng.uniform(1.05, 1.5, n)
    return steps, control * factor, control, ratio


def check_departure(fn, thorough: bool = False) -> None:
    """Exercise ``ex-gpt2-logit``: ``fn(steps, failing, control, ratio) -> step or None``: the first
    step from which ``failing / control`` stays above ``ratio`` at every later step (None if it does
    not end above it). Fresh series with excursions above the ratio that come back."""
    need_function(fn, "departure_step")
    forbid(fn, "ex-gpt2-logit")
    rng = fresh_rng()
    kinds = ["for good", "never", "always"] * (10 if thorough else 2)
    for kind in kinds:
        steps, failing, control, ratio = _series(rng, kind)
        want = _departure_expected(steps, failing, control, ratio)
        try:
            got = fn(steps.copy(), failing.copy(), control.copy(), ratio)
        except Exception as exc:
            fail(f"departure_step raised {type(exc).__name__}: {exc}")
        if want is None:
            if got is not None:
                fail("a series that ends below the ratio has not left for good: return None")
            continue
        if got is None:
            fail(
                "no answer yet, or a departure missed: departure_step returned None for a "
                "series that leaves for good"
            )
        got = _number(got, "departure_step")
        if got == want:
            continue
        if got < want and kind == "for good":
            fail(
                "too early: an excursion above the ratio that comes back below is not a "
                "departure for good"
            )
        fail("wrong step: the first step from which the ratio stays above at every later step")
    correct(f"{len(kinds)} fresh pairs of series (excursions, no departure, above throughout)")
