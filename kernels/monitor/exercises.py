"""Checks for the monitor chapter's exercises.

They follow the book's rules (:mod:`kernels.exercise_rules`): fresh random inputs on every run, "no
answer yet" for a blank, a :class:`~kernels.exercise_rules.WrongAnswer` that says what is wrong
without the answer, and a line starting with "correct" for a right one.
"""

from __future__ import annotations

import numpy as np

from ..exercise_rules import correct, fail, fresh_rng, need


def check_slowdown_fn(fn, thorough: bool = False) -> None:
    """Exercise ``ex-monitor-cost``: ``fn(off_ms, reading_ms, every)`` is the average slowdown of
    training in percent when one step in ``every`` is a reading step (``reading_ms``) and the others
    cost what a step without the monitor costs (``off_ms``)."""
    need(fn, "slowdown", "a function (off_ms, reading_ms, every) -> percent")
    rng = fresh_rng()
    cases = 200 if thorough else 20
    for _ in range(cases):
        off = float(rng.uniform(0.5, 50.0))
        reading = off * float(1.0 + rng.uniform(0.2, 4.0))
        every = int(rng.choice([1, 5, 10, 50, 100, 1000]))
        got = fn(off, reading, every)
        if got is None:
            fail("no answer yet: slowdown returned None")
        want = 100.0 * (reading - off) / every / off
        if not np.isfinite(float(got)):
            fail("the slowdown should be a finite number of percent")
        if abs(float(got) - want) <= 1e-9 * max(1.0, abs(want)):
            continue
        if abs(float(got) - want * every) <= 1e-9 * max(1.0, abs(want * every)) and every > 1:
            fail(
                "that is how much slower one reading step is: the monitor reads one step "
                "in every, and the steps between cost what a plain step costs"
            )
        if abs(float(got) - want / 100) <= 1e-9 * max(1.0, abs(want)):
            fail("that looks like a fraction: the question asks for percent")
        fail(
            "not the average slowdown: spread the extra time of one reading step over the "
            "steps between readings, and compare it with a plain step (not a reading step)"
        )
    correct(f"{cases} fresh timings")


def check_first_ratio_step(fn, thorough: bool = False) -> None:
    """Exercise ``ex-monitor-ratio``: ``fn(steps, failing, control, ratio)`` is the first monitoring
    step at which ``failing`` is more than ``ratio`` times ``control`` (NumPy arrays sampled at
    ``steps``), or None if it never is."""
    need(fn, "first_ratio_step", "a function (steps, failing, control, ratio) -> step")
    rng = fresh_rng()
    cases = 200 if thorough else 30
    for case in range(cases):
        n = int(rng.integers(8, 60))
        start, every = int(rng.integers(0, 5)) * 100, int(rng.choice([10, 50, 100, 250]))
        steps = start + every * np.arange(n)
        control = rng.uniform(1.0, 3.0, n)
        ratio = float(rng.uniform(1.5, 3.0))
        failing = control * rng.uniform(0.6, 0.95 * ratio, n)
        kind = case % 3
        if kind == 0:  # crosses once (an exact touch of the mark before it)
            cross = int(rng.integers(2, n))
            failing[cross:] = control[cross:] * ratio * rng.uniform(1.05, 3.0, n - cross)
            failing[cross - 1] = control[cross - 1] * ratio
        elif kind == 1:  # an excursion above the mark, back down, then for good
            first = int(rng.integers(1, n - 4))
            failing[first] = control[first] * ratio * 1.5
            failing[-2:] = control[-2:] * ratio * 2.0
        got = fn(steps, failing, control, ratio)
        over = np.nonzero(failing / control > ratio)[0]
        want = int(steps[over[0]]) if len(over) else None
        if want is None:
            if got is not None:
                fail(
                    "the failing series never passes the mark in one case, and the answer "
                    "should then be None"
                )
            continue
        if got is None:
            fail("no answer yet: first_ratio_step returned None for series that pass the mark")
        if got == over[0] and steps[over[0]] != over[0]:
            fail("that is a position in the arrays: return the training step at it")
        if got == int(steps[over[-1]]) and len(over) > 1:
            fail("that is the last step above the mark: the question asks for the first")
        if got != want:
            fail(
                "not the first step above the mark: compare failing / control with the "
                "ratio at every step, and count a step only when it is strictly more"
            )
    correct(f"{cases} fresh pairs of series (crossings, exact touches, excursions, none)")
