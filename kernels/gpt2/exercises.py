"""Checks for the GPT-2 chapter's exercises.

Each check raises AssertionError on a missing or wrong answer with a hint that names the step to
re-examine, never the answer itself; it prints "correct" otherwise. The chapter calls a check only
once an answer is filled in, so executing the chapter with blank answers raises nothing.
"""
from __future__ import annotations

import torch

from .report import departure, monitor_series

PAPER_TOKENS = 6_600 * 524_288          # the paper's run before it failed: steps × tokens/step
OUR_TOKENS_PER_STEP = 64 * 256


def _number(answer, what: str) -> float:
    assert answer is not None, f"no answer yet: set {what} to a number"
    assert isinstance(answer, (int, float)) and not isinstance(answer, bool), (
        f"{what} should be a number, got {type(answer).__name__}")
    return float(answer)


def check_minutes(answer, steps_per_s: float) -> None:
    """Exercise 1: minutes our model needs to see the paper's tokens at ``steps_per_s``."""
    got = _number(answer, "minutes_answer")
    want = PAPER_TOKENS / OUR_TOKENS_PER_STEP / steps_per_s / 60
    assert abs(got - 60 * want) > 0.05 * want * 60, (
        "that is the time in seconds: the question asks for minutes")
    assert abs(got - want) < 0.05 * want, (
        f"{got:g} min is not within 5%: steps = the paper's tokens / our tokens per step, and "
        "the speed is in steps per second")
    print(f"correct: about {want:.0f} minutes")


def tie_counts(row) -> tuple[int, int]:
    """(entries with P̄ = exp(S − max S) == 1.0 in bf16, entries exactly equal to the maximum)."""
    row = torch.as_tensor(row, dtype=torch.float32)
    p_bar = torch.exp(row - row.max()).bfloat16()
    return int((p_bar == 1.0).sum()), int((row == row.max()).sum())


def check_ties(answer, row) -> None:
    """Exercise 2: ``(rounding_to_one, exactly_tied)`` for the fp32 scores ``row``."""
    assert answer is not None, "no answer yet: set ties_answer to a pair of counts"
    assert len(tuple(answer)) == 2, "give two counts: (rounding_to_one, exactly_tied)"
    ones, tied = tie_counts(row)
    got_ones, got_tied = (int(a) for a in answer)
    assert got_tied == tied, ("the second count is not right: which entries are *exactly* equal "
                              "to the largest score?")
    assert got_ones == ones, ("the first count is not right: how far below 1 is exp(−2⁻¹²), and "
                              "how far apart are the bf16 numbers just below 1?")
    print(f"correct: {(ones, tied)}")


def logit_departure(failing: dict, control: dict) -> int | None:
    """Exercise 3's quantity: where layer 0's largest logit leaves the control's for good
    (25 % above it, no smoothing)."""
    sa, va = monitor_series(failing, "max_logit", 0)
    sb, vb = monitor_series(control, "max_logit", 0)
    return departure(sa, va, sb, vb, 1.25, 1)


def check_logit_departure(answer, failing: dict, control: dict) -> None:
    """Exercise 3: the step at which the failing run's largest layer-0 logit leaves the
    control's by 25 % and stays above."""
    got = _number(answer, "logit_step")
    want = logit_departure(failing, control)
    tie_sa, tie_a = monitor_series(failing, "rows_tied_bf16", 0)
    tie_sb, tie_b = monitor_series(control, "rows_tied_bf16", 0)
    if got == departure(tie_sa, tie_a, tie_sb, tie_b, 1.25, 1):
        raise AssertionError("that step belongs to the share of tied rows: use the key "
                             "'max_logit'")
    assert got == want, (f"step {got:g} is not where the layer-0 max_logit ratio stays above "
                         "1.25: check the key, the layer, the ratio and width=1")
    print(f"correct: step {want:,}")
