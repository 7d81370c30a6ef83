"""The monitor chapter's exercise checks fail on a blank and on plausible wrong answers,
with hints that do not contain the answer, and accept the right one."""
import numpy as np
import pandas as pd
import pytest

import kernels  # noqa: F401
from kernels.monitor import exercises as ex
from kernels.monitor import layer_table


def _fails(check, answer, *args, hint=None, secret=None):
    with pytest.raises(AssertionError) as err:
        check(answer, *args)
    message = str(err.value)
    if hint:
        assert hint in message, message
    if secret is not None:
        assert f"{secret:g}" not in message, f"the hint gives it away: {message}"


def _timing():
    off = float(np.random.uniform(0.01, 0.05))
    reading = off * float(np.random.uniform(1.5, 3.0))
    return {"off": {"median": off}, "between": {"median": off * 1.01},
            "reading": {"median": reading}, "call": {"median": 2e-7}}


def test_slowdown():
    timing, every = _timing(), 100
    want = ex.slowdown_percent(timing, every)
    per_read = 100 * (timing["reading"]["median"] / timing["off"]["median"] - 1)
    _fails(ex.check_slowdown, None, timing, every, hint="no answer")
    _fails(ex.check_slowdown, "1", timing, every, hint="should be a number")
    _fails(ex.check_slowdown, per_read, timing, every, hint="one reading step",
           secret=want)
    _fails(ex.check_slowdown, want / 100, timing, every, hint="percent", secret=want)
    _fails(ex.check_slowdown, 2 * want, timing, every, hint="within 5 %", secret=want)
    ex.check_slowdown(want, timing, every)
    ex.check_slowdown(per_read / every, timing, every)     # without the call's cost


def _runs():
    """Rows of a failing run and a control: 1 layer, 2 heads, ‖W_Q‖ faster in one."""
    steps = np.arange(0, 800, 50)
    first = int(np.random.randint(4, 12))
    rows_f, rows_c = [], []
    for i, step in enumerate(steps):
        control = 1.0 + 0.01 * i
        failing = control * (1.1 if i < first else 2.5)
        for head, scale in ((0, 1.0), (1, 0.5)):
            rows_f.append((int(step), 0, head, "wq_norm", failing * scale))
            rows_c.append((int(step), 0, head, "wq_norm", control * scale))
    cols = ["step", "layer", "head", "metric", "value"]
    failing, control = (pd.DataFrame(r, columns=cols) for r in (rows_f, rows_c))
    return failing, control, steps, first


def test_wq_ratio_step():
    failing, control, steps, first = _runs()
    want = ex.wq_ratio_step(failing, control)
    assert want == steps[first]
    assert layer_table(failing).loc[(int(steps[0]), 0), "wq_norm"] == pytest.approx(1.1)
    _fails(ex.check_wq_ratio_step, None, failing, control, hint="no answer")
    _fails(ex.check_wq_ratio_step, want + 1, failing, control, hint="not a step")
    _fails(ex.check_wq_ratio_step, int(steps[0]), failing, control, hint="not 2 times")
    _fails(ex.check_wq_ratio_step, int(steps[first + 2]), failing, control,
           hint="an earlier step", secret=want)
    ex.check_wq_ratio_step(want, failing, control)
