"""Chapter 8's exercise checks fail on a blank and on plausible wrong answers, with
hints that do not contain the answer, and accept the right one."""

import math

import numpy as np
import pytest

import kernels  # noqa: F401
from kernels.golden import exercises as ex
from kernels.golden.implementations import expected_record_count


def _fails(check, answer, hint, secret=None):
    with pytest.raises(AssertionError) as err:
        check(answer)
    assert hint in str(err.value)
    if secret is not None:
        assert secret not in str(err.value), f"the hint gives the answer away: {err.value}"


def test_growths():
    want = expected_record_count(ex.TILES)
    secret = f"{want:.2f}"
    _fails(ex.check_growths, None, "no answer")
    _fails(ex.check_growths, "3", "number")
    _fails(ex.check_growths, want + 1, "first tile", secret)
    _fails(ex.check_growths, math.log(ex.TILES), "ln T", secret)
    _fails(ex.check_growths, ex.TILES - 1, "largest score so far", secret)
    _fails(ex.check_growths, 2.0, "not within", secret)
    ex.check_growths(want)


def test_w1():
    _fails(ex.check_w1, None, "no answer")
    _fails(ex.check_w1, lambda a, b: np.mean(np.abs(a - b)), "whatever their order")
    _fails(ex.check_w1, lambda a, b: abs(a.mean() - b.mean()), "only the means")
    _fails(ex.check_w1, lambda a, b: np.max(np.abs(np.sort(a) - np.sort(b))), "not the Wasserstein")
    ex.check_w1(lambda a, b: float(np.mean(np.abs(np.sort(a) - np.sort(b)))))
