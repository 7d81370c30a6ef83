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
