"""Checks for chapter 8's exercises.

Each check raises AssertionError on a missing or wrong answer with a hint that names
what to re-examine, never the answer; it prints "correct" otherwise. The chapter calls a
check only once an answer is filled in, so executing the chapter with blank answers
raises nothing."""

from __future__ import annotations

import math

import numpy as np

from .implementations import expected_record_count

TILES = 32


def check_growths(answer, tiles: int = TILES) -> None:
    """Exercise 1: the expected number of running-maximum growths after the first of
    ``tiles`` key tiles, for i.i.d. scores."""
    assert answer is not None, "no answer yet: set growths to a number"
    assert isinstance(answer, (int, float)) and not isinstance(
        answer, bool
    ), f"growths should be a number, got {type(answer).__name__}"
    want = expected_record_count(tiles)
    got = float(answer)
    close = lambda x: abs(got - x) <= 0.02 * abs(x)  # noqa: E731
    assert not close(want + 1), (
        "that counts the first tile too: its maximum is the first "
        "value of m, not a growth"
    )
    assert not close(math.log(tiles)), (
        "ln T is what the count approaches for very many "
        "tiles; add up the exact probability for each tile"
    )
    assert (
        got < tiles - 1
    ), "a tile raises the maximum only if it holds the largest score so far"
    assert close(want), (
        "not within 2 %: what is the chance that tile t holds the largest "
        "of the first t tiles' maxima?"
    )
    print(f"correct: {want:.3f} growths on average")


def check_w1(fn) -> None:
    """Exercise 2: ``fn(a, b)`` returns the Wasserstein distance between the empirical
    distributions of two equally long 1-D arrays."""
    from scipy.stats import wasserstein_distance

    assert fn is not None, "no answer yet: define w1(a, b)"
    rng = np.random.default_rng()
    a = rng.normal(0.0, 0.02, 500)
    b = rng.permutation(a) + rng.normal(0.0, 0.002, 500) + 0.001
    got = float(fn(a, b))
    want = wasserstein_distance(a, b)
    assert math.isfinite(got) and got >= 0, "a distance is a finite number >= 0"
    assert not math.isclose(got, float(np.mean(np.abs(a - b))), rel_tol=1e-6), (
        "that compares element i of a with element i of b; the distance compares "
        "the two distributions of values, whatever their order"
    )
    assert not math.isclose(
        got, abs(float(a.mean() - b.mean())), rel_tol=1e-6
    ), "that compares only the means, a lower bound of the distance"
    assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (
        "not the Wasserstein distance of these two samples: with equally many "
        "values, which value of a is moved onto which value of b at the least cost?"
    )
    print(f"correct: {got:.6f} (scipy.stats.wasserstein_distance: {want:.6f})")
