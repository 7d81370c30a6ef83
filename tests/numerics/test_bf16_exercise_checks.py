"""Chapter 1's exercise checks: a right answer passes with a ``correct`` line that does not
restate the answer, wrong answers fail without giving it away, and the chapter does not trace
the exercise's sums before the exercise."""

from __future__ import annotations

import pytest

from kernels.exercise_rules import WrongAnswer
from kernels.numerics import exercises as ex
from kernels.tools.booktools import BOOK_DIR, source_before


def test_binade_count_passes_without_printing_the_count(capsys):
    want = ex._binade_count(0)  # the check itself draws a fresh binade
    ex.check_binade_count(want)
    out = capsys.readouterr().out
    assert out.startswith("correct"), out
    assert str(want) not in out, out


@pytest.mark.parametrize("wrong", [0, 7, 64, 127, 129, 256, 2**23])
def test_binade_count_rejects_wrong_counts(wrong):
    want = ex._binade_count(-3)
    with pytest.raises(WrongAnswer) as err:
        ex.check_binade_count(wrong)
    assert str(want) not in str(err.value)


def test_binade_count_rejects_a_float():
    with pytest.raises(WrongAnswer):
        ex.check_binade_count(float(ex._binade_count(5)))


def test_rounds_away_passes_without_printing_the_indices(capsys):
    want = ex._rounds_away_expected()
    ex.check_rounds_away(set(want))
    out = capsys.readouterr().out
    assert out.startswith("correct"), out
    assert not any(ch.isdigit() for ch in out), out


def _every_other_subset():
    want = ex._rounds_away_expected()
    n = len(ex.EXERCISE_SUMS)
    subsets = [{i for i in range(n) if mask >> i & 1} for mask in range(2**n)]
    return [s for s in subsets if s != want]


@pytest.mark.parametrize("wrong", _every_other_subset(), ids=str)
def test_rounds_away_rejects_every_other_set(wrong):
    with pytest.raises(WrongAnswer) as err:
        ex.check_rounds_away(wrong)
    assert str(sorted(ex._rounds_away_expected())) not in str(err.value)


def test_the_exercise_sums_are_not_traced_before_the_exercise():
    text = source_before(BOOK_DIR / "01_bf16_bits.ipynb", "ex1-3-task")
    for acc, b in ex.EXERCISE_SUMS:
        assert repr(acc) not in text, f"sum ({acc}, {b}) appears before exercise 1.3"
