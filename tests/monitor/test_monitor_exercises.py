"""The monitor chapter's exercise checks fail on a blank and on plausible wrong answers, with
hints that say what is wrong, and accept the right one (the lab-kit tests run the same checks
through the chapter's own cells)."""

import numpy as np
import pandas as pd
import pytest

import kernels  # noqa: F401
from kernels.exercise_rules import WrongAnswer
from kernels.monitor import exercises as ex, layer_table


def _fails(check, answer, hint):
    with pytest.raises(WrongAnswer) as err:
        check(answer)
    assert hint in str(err.value), str(err.value)


def test_slowdown():
    _fails(ex.check_slowdown_fn, None, "no answer")
    _fails(ex.check_slowdown_fn, lambda off, reading, every: None, "no answer")
    _fails(
        ex.check_slowdown_fn,
        lambda off, reading, every: 100 * (reading - off) / off,
        "one reading step",
    )
    _fails(
        ex.check_slowdown_fn, lambda off, reading, every: (reading - off) / every / off, "percent"
    )
    _fails(
        ex.check_slowdown_fn,
        lambda off, reading, every: 100 * (reading - off) / every / reading,
        "not the average slowdown",
    )
    ex.check_slowdown_fn(lambda off, reading, every: 100 * (reading - off) / every / off)


def _first(mask, steps):
    hits = np.nonzero(mask)[0]
    return int(steps[hits[0]]) if len(hits) else None


def test_first_ratio_step():
    _fails(ex.check_first_ratio_step, None, "no answer")
    _fails(ex.check_first_ratio_step, lambda steps, f, c, r: None, "no answer")
    _fails(
        ex.check_first_ratio_step,
        lambda steps, f, c, r: _first(f / c > r, np.arange(len(steps))),
        "position",
    )
    _fails(
        ex.check_first_ratio_step,
        lambda steps, f, c, r: _first((f / c > r)[::-1], steps[::-1]),
        "last step",
    )
    _fails(
        ex.check_first_ratio_step, lambda steps, f, c, r: _first(f / c >= r, steps), "strictly more"
    )
    ex.check_first_ratio_step(lambda steps, f, c, r: _first(f / c > r, steps))


def test_layer_table_reads_the_largest_head_of_each_layer():
    steps = np.arange(0, 800, 50)
    rows = [
        (int(step), 0, head, "wq_norm", (1.0 + 0.01 * i) * scale)
        for i, step in enumerate(steps)
        for head, scale in ((0, 1.0), (1, 0.5))
    ]
    table = layer_table(pd.DataFrame(rows, columns=["step", "layer", "head", "metric", "value"]))
    pick = int(np.random.randint(len(steps)))
    assert table.loc[(int(steps[pick]), 0), "wq_norm"] == pytest.approx(1.0 + 0.01 * pick)
