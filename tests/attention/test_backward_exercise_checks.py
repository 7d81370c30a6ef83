"""Chapter 4's exercise ``ch4-which``: the check passes the right set with a ``correct`` line
that does not name the gradients, rejects every other set without naming them, and the chapter
does not print the answer before the exercise."""

from __future__ import annotations

import itertools

import pytest

from kernels.attention import exercises as ex
from kernels.exercise_rules import WrongAnswer
from kernels.tools.booktools import BOOK_DIR, source_before

RIGHT = {"dQ", "dK"}


def test_changed_passes_without_naming_the_gradients(capsys):
    ex.check_changed(set(RIGHT))
    out = capsys.readouterr().out
    assert out.startswith("correct"), out
    assert not any(g in out for g in ex.GRADIENTS), out


def _every_other_set():
    sets = [set(c) for r in range(4) for c in itertools.combinations(ex.GRADIENTS, r)]
    return [s for s in sets if s and s != RIGHT]


@pytest.mark.parametrize("wrong", _every_other_set(), ids=lambda s: "+".join(sorted(s)))
def test_changed_rejects_every_other_set(wrong):
    with pytest.raises(WrongAnswer) as err:
        ex.check_changed(wrong)
    assert str(sorted(RIGHT)) not in str(err.value)


def test_chapter_4_does_not_answer_before_the_exercise():
    text = source_before(BOOK_DIR / "04_flash_backward.ipynb", "ex4-2-task")
    assert "torch.equal(dv_hp, dv_lp)" not in text
    assert "dV, which never uses δ, does not change" not in text
