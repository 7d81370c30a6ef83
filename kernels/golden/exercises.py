"""Checks for chapter 8's exercises.

The checks follow the book's rules (:mod:`kernels.exercise_rules`): a blank answer fails with
"no answer yet", a wrong one with :class:`~kernels.exercise_rules.WrongAnswer` and a hint that
names what to re-examine, never the answer; a right one prints a line starting with
"correct"."""

from __future__ import annotations

import math

import numpy as np

from ..exercise_rules import WrongAnswer, forbid, fresh_rng, need, need_function
from .implementations import expected_record_count

TILES = 24


def check_growths(answer, tiles: int = TILES) -> None:
    """Exercise ``ex-golden-growths``: the expected number of running-maximum growths after the
    first of ``tiles`` key tiles, for i.i.d. scores."""
    need(answer, "growths", "a number")
    _check(
        isinstance(answer, (int, float, np.integer, np.floating)) and not isinstance(answer, bool),
        f"growths should be a number, got {type(answer).__name__}",
    )
    want = expected_record_count(tiles)
    got = float(answer)
    close = lambda x: abs(got - x) <= 0.02 * abs(x)  # noqa: E731
    _check(
        not close(want + 1),
        "that counts the first tile too: its maximum is the first value of m, not a growth",
    )
    _check(
        not close(math.log(tiles)),
        "ln T is what the count approaches for very many "
        "tiles; add up the exact probability for each tile",
    )
    _check(got < tiles - 1, "a tile raises the maximum only if it holds the largest score so far")
    _check(
        close(want),
        "not within 2 %: what is the chance that tile t holds the largest "
        "of the first t tiles' maxima?",
    )
    print("correct: the expected number of growths")


def check_w1(fn, thorough: bool = False) -> None:
    """Exercise ``ex-golden-w1``: ``fn(a, b)`` returns the Wasserstein distance between the
    empirical distributions of two equally long 1-D arrays (``thorough``: more, longer and shifted
    pairs)."""
    from scipy.stats import wasserstein_distance

    need_function(fn, "w1")
    forbid(fn, "ex-golden-w1")
    rng = fresh_rng()
    cases = 20 if thorough else 3
    for _ in range(cases):
        size = int(rng.integers(50, 5_000 if thorough else 500))
        a = rng.normal(0.0, 0.02, size)
        # wider and shifted: the sorted differences change sign, so no shortcut through
        # the means or the unsorted pairs can land on the distance
        b = (
            rng.permutation(a) * rng.uniform(1.2, 1.6)
            + rng.normal(0.0, 0.002, size)
            + rng.uniform(-0.005, 0.005)
        )
        out = fn(a, b)
        _check(out is not None, "no answer yet: w1 returned None")
        got = float(out)
        want = wasserstein_distance(a, b)
        _check(math.isfinite(got) and got >= 0, "a distance is a finite number >= 0")
        _check(
            not math.isclose(got, float(np.mean(np.abs(a - b))), rel_tol=1e-6),
            "that compares element i of a with element i of b; the distance compares "
            "the two distributions of values, whatever their order",
        )
        _check(
            not math.isclose(got, abs(float(a.mean() - b.mean())), rel_tol=1e-6),
            "that compares only the means, a lower bound of the distance",
        )
        _check(
            math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15),
            "not the Wasserstein distance of these samples: with equally many "
            "values, which value of a is moved onto which value of b at the least cost?",
        )
    print(f"correct: {cases} fresh pairs of samples agree with scipy.stats.wasserstein_distance")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise WrongAnswer(message)
