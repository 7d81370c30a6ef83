"""Checks for the monitor chapter's exercises.

Each check raises AssertionError on a missing or wrong answer with a hint that names
what to re-examine, never the answer itself; it prints "correct" otherwise. The chapter
calls a check only once an answer is filled in, so executing the chapter with blank
answers raises nothing.
"""
from __future__ import annotations

import numpy as np

from .readings import layer_table


def _number(answer, what: str) -> float:
    assert answer is not None, f"no answer yet: set {what} to a number"
    assert isinstance(answer, (int, float, np.integer, np.floating)) \
        and not isinstance(answer, bool), (
            f"{what} should be a number, got {type(answer).__name__}")
    return float(answer)


def slowdown_percent(timing: dict, every: int) -> float:
    """Exercise 1's quantity: the average slowdown of training, in percent, when one
    step in ``every`` is read (cost of a reading step over a plain one, spread over
    ``every`` steps)."""
    off, reading = timing["off"]["median"], timing["reading"]["median"]
    call = timing["call"]["median"]
    return 100.0 * ((reading - off) / every + call) / off


def check_slowdown(answer, timing: dict, every: int) -> None:
    """Exercise 1: the average slowdown in percent at ``every``."""
    got = _number(answer, "slowdown_answer")
    want = slowdown_percent(timing, every)
    off, reading = timing["off"]["median"], timing["reading"]["median"]
    per_read = 100.0 * (reading - off) / off
    assert abs(got - per_read) > 0.05 * abs(per_read), (
        "that is how much slower one reading step is: the monitor reads one step in "
        "every")
    assert abs(got - want / 100) > 0.05 * abs(want / 100), (
        "that looks like a fraction: the question asks for percent")
    assert abs(got - want) <= 0.05 * abs(want) + 1e-6, (
        f"{got:g} % is not within 5 %: spread the extra time of one reading step over "
        "the steps between readings, and compare with a plain step")
    print(f"correct: about {want:.2g} %")


def wq_ratio_step(failing, control, ratio: float = 2.0, layer: int = 0):
    """Exercise 2's quantity: the first monitoring step at which the failing run's layer
    ‖W_Q‖₂ (largest head) is more than ``ratio`` times the control's at the same
    step."""
    a = layer_table(failing).xs(layer, level="layer").wq_norm
    b = layer_table(control).xs(layer, level="layer").wq_norm
    both = (a / b).dropna()
    over = both[both > ratio]
    return int(over.index[0]) if len(over) else None


def check_wq_ratio_step(answer, failing, control, ratio: float = 2.0) -> None:
    """Exercise 2: the first step at which the failing run's ‖W_Q‖ is more than
    ``ratio`` times the control's."""
    got = _number(answer, "ratio_step")
    want = wq_ratio_step(failing, control, ratio)
    a = layer_table(failing).xs(0, level="layer").wq_norm
    b = layer_table(control).xs(0, level="layer").wq_norm
    ratios = (a / b).dropna()
    assert got in ratios.index, (
        f"{got:g} is not a step the monitor read: take a value of the 'step' column")
    assert ratios[got] > ratio, (
        f"at step {got:g} the failing run's ‖W_Q‖ is not {ratio:g} times the "
        "control's: compare the largest head of layer 0 at the same step (metric "
        "'wq_norm')")
    assert got == want, ("at that step the ratio is above the mark, but an earlier "
                         "step already was: the question asks for the first")
    print(f"correct: step {want:,}")


# ----------------------------------------------------------------------------------------------
# the lab's form of the two exercises: functions, checked on fresh random inputs
# ----------------------------------------------------------------------------------------------
def _fail(message: str):
    from ..checking import WrongAnswer
    raise WrongAnswer(message)


def check_slowdown_fn(fn, thorough: bool = False) -> None:
    """Exercise 9.1: ``fn(off_ms, reading_ms, every)`` is the average slowdown of training in
    percent when one step in ``every`` is a reading step (``reading_ms``) and the others
    cost what a step without the monitor costs (``off_ms``)."""
    from ..checking import fresh_rng, need
    need(fn, "slowdown", "a function (off_ms, reading_ms, every) -> percent")
    rng = fresh_rng()
    cases = 200 if thorough else 20
    for _ in range(cases):
        off = float(rng.uniform(0.5, 50.0))
        reading = off * float(1.0 + rng.uniform(0.2, 4.0))
        every = int(rng.choice([1, 5, 10, 50, 100, 1000]))
        got = fn(off, reading, every)
        if got is None:
            _fail("no answer yet: slowdown returned None")
        want = 100.0 * (reading - off) / every / off
        if not np.isfinite(float(got)):
            _fail("the slowdown should be a finite number of percent")
        if abs(float(got) - want) <= 1e-9 * max(1.0, abs(want)):
            continue
        if abs(float(got) - want * every) <= 1e-9 * max(1.0, abs(want * every)) and every > 1:
            _fail("that is how much slower one reading step is: the monitor reads one step "
                  "in every, and the steps between cost what a plain step costs")
        if abs(float(got) - want / 100) <= 1e-9 * max(1.0, abs(want)):
            _fail("that looks like a fraction: the question asks for percent")
        _fail("not the average slowdown: spread the extra time of one reading step over the "
              "steps between readings, and compare it with a plain step (not a reading step)")
    print(f"correct: {cases} fresh timings")


def check_first_ratio_step(fn, thorough: bool = False) -> None:
    """Exercise 9.2: ``fn(steps, failing, control, ratio)`` is the first monitoring step at
    which ``failing`` is more than ``ratio`` times ``control`` (NumPy arrays sampled at
    ``steps``), or None if it never is."""
    from ..checking import fresh_rng, need
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
        if kind == 0:           # crosses once (an exact touch of the mark before it)
            cross = int(rng.integers(2, n))
            failing[cross:] = control[cross:] * ratio * rng.uniform(1.05, 3.0, n - cross)
            failing[cross - 1] = control[cross - 1] * ratio
        elif kind == 1:         # an excursion above the mark, back down, then for good
            first = int(rng.integers(1, n - 4))
            failing[first] = control[first] * ratio * 1.5
            failing[-2:] = control[-2:] * ratio * 2.0
        got = fn(steps, failing, control, ratio)
        over = np.nonzero(failing / control > ratio)[0]
        want = int(steps[over[0]]) if len(over) else None
        if want is None:
            if got is not None:
                _fail("the failing series never passes the mark in one case, and the answer "
                      "should then be None")
            continue
        if got is None:
            _fail("no answer yet: first_ratio_step returned None for series that pass the "
                  "mark")
        if got == over[0] and steps[over[0]] != over[0]:
            _fail("that is a position in the arrays: return the training step at it")
        if got == int(steps[over[-1]]) and len(over) > 1:
            _fail("that is the last step above the mark: the question asks for the first")
        if got != want:
            _fail("not the first step above the mark: compare failing / control with the "
                  "ratio at every step, and count a step only when it is strictly more")
    print(f"correct: {cases} fresh pairs of series (crossings, exact touches, excursions, "
          "none)")
