"""How an :class:`~kernels.numerics.addition.AddTrace` is shown: plain text and an HTML table.

Rendering only: every number comes from the trace; nothing here computes arithmetic.
"""

from __future__ import annotations

import html
import math

from .formats import get_format


def fixed_point(n: int, frac_digits: int, int_width: int = 0) -> str:
    """Nonnegative integer n * 2^-frac_digits written in binary with frac_digits fraction digits."""
    digits = format(n, "b").rjust(frac_digits + 1, "0")
    whole, frac = digits[: len(digits) - frac_digits], digits[len(digits) - frac_digits :]
    return f"{whole.rjust(int_width)}.{frac}" if frac_digits else whole.rjust(int_width)


def _signed(sign: str, digits: str) -> str:
    """Put the sign right before the first digit, keeping the column alignment of ``digits``."""
    stripped = digits.lstrip(" ")
    return " " * (len(digits) - len(stripped)) + sign + stripped


def _squeeze(s: str, keep: int = 40) -> str:
    """Shorten very long runs of zeros for display ('0000...(120 zeros)...0001')."""
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == "0":
            j += 1
        run = j - i
        if run > keep:
            out.append("0" * 4 + f"…({run - 8} zeros)…" + "0" * 4)
            i = j
        else:
            out.append(s[i] if run == 0 else s[i:j])
            i = j + 1 if run == 0 else j
    return "".join(out)


def trace_rows(t):
    """(step, explanation, bit-segments) rows; a segment is (text, role)."""
    fa, fb, fo = get_format(t.a.fmt), get_format(t.b.fmt), get_format(t.out_fmt)
    rows = []
    for name, op, f in (("a", t.a, fa), ("b", t.b, fb)):
        extra = f" (given {op.given!r}, rounded on input)" if op.rounded_on_input else ""
        rows.append((name, f"{op.value!r} in {f.label}{extra}", [(op.pattern, "pattern")]))
    sign = lambda s: "-" if s else "+"
    big_sign = sign(t.a.sign if abs(t.a.value) >= abs(t.b.value) else t.b.sign)
    small_sign = sign(t.b.sign if abs(t.a.value) >= abs(t.b.value) else t.a.sign)
    rows.append(
        (
            "1 align",
            f"exponents differ by {t.exp_diff}: the smaller significand moves "
            f"{t.shifted} place(s) right (x 2^{t.raw_exponent})",
            [
                (_signed(big_sign, _squeeze(t.aligned[0])), "plain"),
                ("\n", "plain"),
                (_signed(small_sign, _squeeze(t.aligned[1])), "plain"),
            ],
        )
    )
    op_word = (
        "same signs: add the significands"
        if t.operation == "add"
        else "different signs: subtract the smaller significand"
    )
    rows.append(
        (
            "2 add",
            op_word,
            [(_signed(big_sign, _squeeze(t.raw_sum)) + f" x 2^{t.raw_exponent}", "plain")],
        )
    )
    norm_text = {
        "carry": f"carry out of the leading bit: shift right by 1, exponent "
        f"{t.raw_exponent} -> {t.exponent}",
        "none": "already of the form 1.xxx: nothing to do",
        "cancel": f"cancellation: shift left by {-t.norm_shift}, exponent "
        f"{t.raw_exponent} -> {t.exponent}",
        "zero": "the significands cancel exactly: the sum is 0",
        "subnormal": f"below the smallest normal exponent: kept as a subnormal "
        f"0.xxx x 2^{t.exponent}",
    }[t.normalise]
    rows.append(("3 normalise", norm_text, bit_segments(t, big_sign)))
    rows.append(("4 round", t.decision, bit_segments(t, big_sign, grs=True)))
    if math.isfinite(t.result):
        res = f"{t.result!r} in {fo.label}"
    else:
        res = f"{t.result!r}: overflow beyond {fo.label}'s largest value {fo.max:.6g}"
    rows.append(("5 result", res, [(t.result_pattern, "pattern")]))
    fits = "yes" if t.sum_fits_fp32 else "no"
    rows.append(("exact sum", f"{t.exact_sum!r} (exact as a fraction; fits in FP32: {fits})", []))
    if math.isfinite(t.result):
        rows.append(
            (
                "error",
                f"result - exact = {t.error!r} = {t.error_ulps:+.4g} ulp "
                f"(1 ulp of {fo.label} here = {t.ulp!r})",
                [],
            )
        )
    check = f"library cast of the exact sum: {t.library!r}"
    if t.native is not None:
        check += f"; library {fo.label} addition a + b: {t.native!r}"
    rows.append(("check", check + " (asserted equal)", []))
    for note in t.notes:
        rows.append(("note", note, []))
    return rows


def bit_segments(t, sign: str, grs: bool = False):
    if t.normalise == "zero":
        return [("0", "plain")]
    if not grs:
        tail = (str(t.guard) + str(t.round_bit) + t.sticky_bits) if t.inexact else ""
        return [(sign + t.kept + _squeeze(tail) + f" x 2^{t.exponent}", "plain")]
    segs = [(sign + t.kept[:-1], "kept"), (t.kept[-1], "lsb")]
    if t.inexact:
        segs += [
            ("|", "plain"),
            (str(t.guard), "guard"),
            ("|", "plain"),
            (str(t.round_bit), "round"),
        ]
        if t.sticky_bits:
            segs += [("|", "plain"), (_squeeze(t.sticky_bits), "sticky")]
    segs.append((f" x 2^{t.exponent}", "plain"))
    return segs


def to_text(t) -> str:
    fo = get_format(t.out_fmt)
    lines = [
        f"{get_format(t.a.fmt).label} a + {get_format(t.b.fmt).label} b, rounded once to "
        f"nearest-even {fo.label}"
    ]
    for step, text, segs in trace_rows(t):
        bitstr = "".join(t for t, _ in segs)
        lines.append(f"  {step:<11} {text}")
        for bl in bitstr.split("\n") if bitstr else []:
            lines.append(f"  {'':<11}   {bl}")
    if t.inexact:
        lines.append(
            "  (step 4 reads kept bits | guard bit G | round bit R | sticky bits, "
            f"S = OR of the sticky bits = {t.sticky})"
        )
    return "\n".join(lines)


STYLE = {
    "lsb": "text-decoration:underline;font-weight:bold",
    "guard": "background:#f4a261;color:#000;font-weight:bold",
    "round": "background:#bde0fe;color:#000",
    "sticky": "background:#bde0fe;color:#000",
    "pattern": "",
    "kept": "",
    "plain": "",
}


def to_html(t) -> str:
    fo = get_format(t.out_fmt)
    rows = []
    for step, text, segs in trace_rows(t):
        cell = "".join(
            f'<span style="{STYLE[role]}">{html.escape(t)}</span>'
            if STYLE[role]
            else html.escape(t)
            for t, role in segs
        ).replace("\n", "<br>")
        bit_line = (
            f"<br><span style='font-family:monospace;white-space:pre'>{cell}</span>" if cell else ""
        )
        rows.append(
            f"<tr><td style='text-align:left;vertical-align:top;white-space:nowrap;"
            f"padding-right:12px'><b>{html.escape(step)}</b></td>"
            f"<td style='text-align:left'>{html.escape(text)}{bit_line}</td></tr>"
        )
    legend = (
        "<span style='{}'>guard bit G</span> (the paper's \"rounding bit\"), "
        "<span style='{}'>round bit R and sticky bits</span>, "
        "<span style='{}'>kept last bit</span>"
    ).format(STYLE["guard"], STYLE["sticky"], STYLE["lsb"])
    title = (
        f"{get_format(t.a.fmt).label} a + {get_format(t.b.fmt).label} b, rounded once to "
        f"nearest-even {fo.label}"
    )
    return (
        f"<div><p style='margin:0'><b>{html.escape(title)}</b></p>"
        f"<table style='border-collapse:collapse;font-size:90%'>{''.join(rows)}</table>"
        f"<p style='margin:0;font-size:85%'>{legend}</p></div>"
    )
