"""explore() turns every input, however extreme, into a report; the widget builds without errors."""

import math

import numpy as np
import pytest

from kernels import numerics as B
from kernels.numerics.widgets import bits_explorer, explore, parse_value

BAD = [
    ("nan", "NaN"),
    (math.nan, "NaN"),
    ("inf", "infinite"),
    (-math.inf, "infinite"),
    ("hello", "not a number"),
    ("", "not a number"),
    ("1e39", "overflows BF16"),
    (10**400, "too large"),
    ("0b0101", "16-bit pattern"),
    (None, "not a number"),
    (True, "boolean"),
    ([1.0], "not a number"),
]


@pytest.mark.parametrize("bad,words", BAD)
def test_bad_values_give_a_message(bad, words):
    for report in (explore(bad, 1.0), explore(1.0, bad)):
        assert not report.ok and report.trace is None
        assert words in report.text and "Cannot trace" in report.html


def test_unknown_format_gives_a_message():
    report = explore(1.0, 2.0, "fp64")
    assert not report.ok and "unknown format 'fp64'" in report.text and "'bf16'" in report.text


@pytest.mark.parametrize("fmt", list(B.FORMATS))
def test_extreme_values_are_traced_with_notes(fmt):
    f = B.get_format(fmt)
    rng = np.random.default_rng()
    cases = [
        (f.max, f.max),
        (-f.max, -f.max),
        (f.max, -f.max),
        (f.smallest_subnormal, f.smallest_subnormal),
        (f.smallest_subnormal / 4, 0.0),
        (f.smallest_normal, -f.smallest_subnormal),
        (0.0, -0.0),
        (f.max, f.smallest_subnormal),
        (rng.standard_normal(), rng.standard_normal()),
    ]
    for a, b in cases:
        report = explore(a, b, fmt)
        assert report.ok, report.text
        t = report.trace
        assert t.result == B.round_to(t.exact_sum, fmt) or (math.isnan(t.result) and t.overflow)
        assert "exact sum" in report.text
    assert "overflows" in explore(f.max, f.max, fmt).text
    assert "underflow" in explore(f.smallest_subnormal / 4, 0.0, fmt).text


def test_paper_example_through_explore():
    report = explore("0b11000000000110100000111000101110", "-2.296875", "bf16", acc_fmt="fp32")
    assert report.ok and report.trace.result == -4.71875
    assert "-0.014759540557861328" in report.text and "#f4a261" in report.html


def test_parse_value():
    assert parse_value(" -2.5 ", "bf16") == -2.5
    assert parse_value("0b0|01111111|0000000", "bf16") == 1.0
    with pytest.raises(ValueError, match="overflows FP16"):
        parse_value(70000.0, "fp16")


def test_widget_builds_and_reacts():
    import ipywidgets  # noqa: F401  (in requirements.txt: a missing install fails here, loudly)

    box = bits_explorer()
    html_out = box.children[-1]
    assert "-4.71875" in html_out.value
    a_text = box.children[0].children[0]
    a_text.value = "not a number"
    assert "Cannot trace" in html_out.value
    slider = box.children[1].children[1]
    slider.value = 1.0
    assert "Cannot trace" in html_out.value  # a is still bad text
    box.children[0].children[1].value = 2.0  # sliding a replaces the bad text
    assert "exact sum" in html_out.value
