"""The GPT-2 chapter's exercise checks fail on a blank and on plausible wrong answers, with hints
that do not contain the answer, and accept the right one."""
import pytest

import kernels  # noqa: F401
from kernels.gpt2 import exercises as ex
from kernels.gpt2 import report

ROW = [5.0, 5.0 - 2**-12, 1.0, 5.0 - 2**-12]


def _fails(check, answer, *args, hint=None, secret=None):
    with pytest.raises(AssertionError) as err:
        check(answer, *args)
    message = str(err.value)
    if hint:
        assert hint in message
    if secret is not None:
        assert str(secret) not in message, f"the hint gives the answer away: {message}"


def test_minutes():
    speed = 68.0
    want = ex.PAPER_TOKENS / ex.OUR_TOKENS_PER_STEP / speed / 60
    _fails(ex.check_minutes, None, speed, hint="no answer")
    _fails(ex.check_minutes, 60 * want, speed, hint="seconds", secret=round(want))
    _fails(ex.check_minutes, 6_600 / speed / 60, speed, hint="5%", secret=round(want))
    ex.check_minutes(want, speed)


def test_ties():
    assert ex.tie_counts(ROW) == (3, 1)
    _fails(ex.check_ties, None, ROW, hint="no answer")
    _fails(ex.check_ties, (1, 1), ROW, hint="first count")
    _fails(ex.check_ties, (3, 3), ROW, hint="second count")
    ex.check_ties((3, 1), ROW)


def test_logit_departure():
    runs = report.load_search("amp_final")["data"]["runs"]
    u, f = runs["k7long-U-s0"], runs["k7long-F-s0"]
    want = ex.logit_departure(u, f)
    assert want is not None
    _fails(ex.check_logit_departure, None, u, f, hint="no answer")
    ties = report.pair_departures(u, f, rules={"rows_tied_bf16": (1.25, 1)})["rows_tied_bf16"]
    _fails(ex.check_logit_departure, ties, u, f, hint="max_logit", secret=want)
    wq = report.pair_departures(u, f)["wq"]
    _fails(ex.check_logit_departure, wq, u, f, hint="ratio", secret=want)
    ex.check_logit_departure(want, u, f)
