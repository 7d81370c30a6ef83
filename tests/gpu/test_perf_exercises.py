"""Chapter 10's exercise checks (kernels.gpu.exercises): a blank and a plausible wrong answer
fail, the solution passes."""

from __future__ import annotations

import pytest

import kernels  # noqa: F401
from kernels.gpu import exercises as ex
from kernels.gpu.roofline import intensity


def test_exercise_checks_accept_only_the_solution():
    from kernels.exercise_rules import WrongAnswer

    for check in (ex.check_flop_per_byte, ex.check_stream_tflops, ex.check_bit_changes):
        with pytest.raises(WrongAnswer, match="no answer yet"):
            check(None)
    with pytest.raises(WrongAnswer, match="no answer yet"):
        ex.check_flop_per_byte(lambda n, d, s, fused: None)  # a blank body
    model = lambda n, d, s, fused: intensity(n, d, "fused" if fused else "math", s)  # noqa
    ex.check_flop_per_byte(model, thorough=True)
    with pytest.raises(WrongAnswer, match="values, not bytes"):
        ex.check_flop_per_byte(lambda n, d, s, fused: model(n, d, 1, fused))
    with pytest.raises(WrongAnswer, match="N×N"):
        ex.check_flop_per_byte(lambda n, d, s, fused: model(n, d, s, True))
    ex.check_stream_tflops(lambda f, h, k: f / max(h, k) * 1e-6, thorough=True)
    ex.check_stream_tflops(lambda f, h, k: f / max(h, k) / 1e6)
    with pytest.raises(WrongAnswer, match="CPU wait"):
        ex.check_stream_tflops(lambda f, h, k: f / (h + k) * 1e-6)
    with pytest.raises(WrongAnswer, match="power of ten"):
        ex.check_stream_tflops(lambda f, h, k: f / max(h, k))
    with pytest.raises(WrongAnswer):
        ex.check_stream_tflops(lambda f, h, k: f / k * 1e-6)


def test_which_changes_move_bits():
    """Direct launches, the causal split and the max-first row maximum leave every bit of O
    alone; another tile width and the exp2 rewrite do not (the rewrite rarely, hence its large
    sample)."""
    assert ex._bit_changes_expected() == {"tile shape", "exp2"}
    ex.check_bit_changes({"tile shape", "exp2"})
    ex.check_bit_changes(["exp2", "tile shape"])
    from kernels.exercise_rules import WrongAnswer

    for wrong in (
        {"exp2"},
        set(ex.CHANGES),
        set(),
        "tile shape",
        {"tile shape", "exp2", "max first"},
    ):
        with pytest.raises(WrongAnswer):
            ex.check_bit_changes(wrong)
    with pytest.raises(WrongAnswer, match="use only the names"):
        ex.check_bit_changes({"tiles"})
