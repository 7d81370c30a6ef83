"""Interactive explorers for the book, each built on a plain function the static site can show.

:func:`explore` does the work and returns a :class:`Report` (text and HTML); the notebooks call it
in ordinary cells, so the website shows the same content. :func:`bits_explorer` wraps it in
ipywidgets for Jupyter and Colab. Invalid input (text that is not a number, NaN, inf, values beyond
a format's range) becomes a message in the report, never a traceback.
"""

from __future__ import annotations

import dataclasses
import html
import math

from . import addition as _addition, formats as _formats

__all__ = ["Report", "parse_value", "explore", "bits_explorer"]


@dataclasses.dataclass
class Report:
    """What :func:`explore` found: ``ok`` is False when the input could not be traced."""

    ok: bool
    text: str
    html: str
    trace: _addition.AddTrace | None = None

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html


def _message(text: str) -> Report:
    box = (
        "<div style='border-left:4px solid #e76f51;padding:4px 8px;background:#fff4f0'>"
        f"<b>Cannot trace this sum.</b> {html.escape(text)}</div>"
    )
    return Report(False, "Cannot trace this sum. " + text, box)


def parse_value(value, fmt) -> float:
    """A number from a float, an int, or text: a decimal ('-2.5', '1e-3') or a bit pattern
    ('0b...').

    Raises ValueError with a readable message for anything that is not a finite number representable
    (after rounding) in ``fmt``.
    """
    f = _formats.get_format(fmt)
    if isinstance(value, str):
        text = value.strip()
        if text.lower().startswith("0b"):
            number = _formats.from_bits(text, f)
        else:
            try:
                number = float(text)
            except ValueError:
                raise ValueError(
                    f"{value!r} is not a number (write e.g. -2.296875, 1e-3 or a "
                    f"{f.total_bits}-bit pattern 0b...)"
                ) from None
    elif isinstance(value, bool) or type(value).__name__ == "bool_":
        raise ValueError(f"{value!r} is a boolean, not a number")
    else:
        try:
            number = float(value)
        except OverflowError:
            raise ValueError(f"{value!r} is too large for any float format") from None
        except (TypeError, ValueError):
            raise ValueError(f"{value!r} is not a number") from None
    if math.isnan(number):
        raise ValueError("NaN is not a number: it has no bits to add (any sum with NaN is NaN)")
    if math.isinf(number):
        raise ValueError(
            f"{number} is infinite: inf + anything finite is inf, there is nothing to round"
        )
    stored = _formats.round_to(number, f)
    if not math.isfinite(stored):
        raise ValueError(
            f"{number!r} overflows {f.label}: its largest finite value is {f.max:.6g}, so it "
            f"would be stored as {stored!r}"
        )
    return number


def explore(a, b, fmt="bf16", acc_fmt=None) -> Report:
    """Trace ``a + b`` rounded to ``fmt``; ``a`` is held in ``acc_fmt`` (default ``fmt``), ``b`` in
    ``fmt``.

    Returns a :class:`Report`; never raises for bad numbers (the report says what was wrong).
    """
    try:
        f = _formats.get_format(fmt)
        fa = _formats.get_format(acc_fmt or f)
        x, y = parse_value(a, fa), parse_value(b, f)
        trace = _addition.add_trace(x, y, f, a_fmt=fa)
    except (ValueError, TypeError) as exc:
        return _message(str(exc))
    notes = []
    for name, given, op in (("a", x, trace.a), ("b", y, trace.b)):
        if given != 0 and op.value == 0:
            notes.append(
                f"underflow: {name} = {given!r} is below the smallest "
                f"{_formats.get_format(op.fmt).label}"
                f" subnormal and was stored as 0"
            )
    if trace.overflow:
        notes.append(f"the sum overflows {f.label}: stored as {trace.result!r}")
    summary = f"exact sum {trace.exact_sum!r}, rounded {trace.result!r}" + (
        f", signed error {trace.error!r} ({trace.error_ulps:+.3f} ulp)"
        if math.isfinite(trace.result)
        else ""
    )
    note_html = "".join(
        f"<p style='margin:2px 0;color:#b5542c'><b>Note:</b> {html.escape(n)}</p>" for n in notes
    )
    text = "\n".join([summary, *("Note: " + n for n in notes), trace.to_text()])
    page = (
        f"<p style='margin:2px 0'><b>{html.escape(summary)}</b></p>{note_html}{trace._repr_html_()}"
    )
    return Report(True, text, page, trace)


def bits_explorer(
    a: float = -2.4071154594421387, b: float = -2.296875, fmt: str = "bf16", acc_fmt: str = "fp32"
):
    """An ipywidgets panel around :func:`explore`: type or slide two values, pick the formats."""
    import ipywidgets as w

    names = list(_formats.FORMATS)
    labels = [(_formats.FORMATS[n].label, n) for n in names]
    a_text = w.Text(value=repr(float(a)), description="a (acc)", continuous_update=False)
    b_text = w.Text(value=repr(float(b)), description="b", continuous_update=False)
    a_slider = w.FloatSlider(
        value=a, min=-8, max=8, step=1 / 512, description="slide a", readout_format=".6f"
    )
    b_slider = w.FloatSlider(
        value=b, min=-8, max=8, step=1 / 512, description="slide b", readout_format=".6f"
    )
    fmt_box = w.Dropdown(options=labels, value=fmt, description="b, result")
    acc_box = w.Dropdown(options=labels, value=acc_fmt, description="a held in")
    out = w.HTML()

    def refresh(*_):
        out.value = explore(a_text.value, b_text.value, fmt_box.value, acc_box.value).html

    def slid(text_box):
        def on_change(change):
            text_box.value = repr(float(change["new"]))

        return on_change

    a_slider.observe(slid(a_text), names="value")
    b_slider.observe(slid(b_text), names="value")
    for control in (a_text, b_text, fmt_box, acc_box):
        control.observe(refresh, names="value")
    refresh()
    return w.VBox(
        [w.HBox([a_text, a_slider]), w.HBox([b_text, b_slider]), w.HBox([acc_box, fmt_box]), out]
    )
