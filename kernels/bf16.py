"""Floating-point formats from the bits up: bit views, exact rounding traces, bias experiments.

Chapter 1 of the book builds on this module and later chapters reuse it::

    from kernels import bf16
    bf16.bits(-2.296875, "bf16")             # '1|10000000|0010011'
    bf16.round_to([0.1, 1e40], "bf16")       # float64 array of the stored bf16 values
    bf16.ulp(3.0, "bf16")                    # 0.015625, the spacing of bf16 numbers at 3
    print(bf16.add_trace(-2.4071154594421387, -2.296875, "bf16", a_fmt="fp32"))

Formats are named ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8_e4m3"`` and ``"fp8_e5m2"``. The values
themselves always come from the real casts of NumPy and ml_dtypes; this module only *explains*
them. :func:`add_trace` redoes one addition with exact integers (alignment, carry, guard/round/sticky,
round-to-nearest-even) and then asserts that its result equals the library's cast of the exact sum
(and, when both operands and the result share one format, the library's own addition), so a trace
can never disagree with what the hardware formats do.

A detail worth knowing: ml_dtypes converts a float64 to bf16 or fp8 *through float32*, which rounds
twice (``bfloat16(1 + 2**-8 + 2**-30)`` gives 1.0, the correctly rounded value is 1.0078125).
:func:`round_to` avoids that: it first rounds the float64 "to odd" two bits below the target's last
bit (exact in float32), so the library's single remaining cast is the correct one.
"""
from __future__ import annotations

import dataclasses
import html
import math
from fractions import Fraction

import ml_dtypes
import numpy as np

__all__ = ["Format", "FORMATS", "get_format", "format_table", "round_to", "ulp", "bits",
           "from_bits", "decode", "add_trace", "AddTrace", "Operand", "rounding_errors",
           "mean_error", "MeanError", "check_answer", "plot_ulp", "plot_error_hist",
           "EXERCISE_PATTERN", "EXERCISE_SUMS", "PAPER_EXAMPLE"]


# ----------------------------------------------------------------------------------------------
# Formats
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Format:
    """One binary floating-point format. Numbers are read from numpy/ml_dtypes ``finfo``.

    A finite nonzero value is ``(-1)^s * 1.f * 2^(E - bias)`` (normal) or ``(-1)^s * 0.f * 2^emin``
    (subnormal, biased exponent field 0).
    """
    name: str
    label: str
    dtype: type
    uint: type
    exponent_bits: int
    fraction_bits: int
    bias: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float
    has_inf: bool
    sign_bits: int = 1

    @property
    def precision(self) -> int:
        """Significand bits including the hidden leading bit."""
        return self.fraction_bits + 1

    @property
    def total_bits(self) -> int:
        return self.sign_bits + self.exponent_bits + self.fraction_bits

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (also the exponent of every subnormal)."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        return math.frexp(self.max)[1] - 1

    def __repr__(self) -> str:
        return (f"Format({self.name}: 1+{self.exponent_bits}+{self.fraction_bits} bits, bias {self.bias},"
                f" max {self.max:.6g}, eps {self.eps:.6g})")


def _make_format(name, label, dtype, uint, has_inf) -> Format:
    info = ml_dtypes.finfo(dtype) if dtype.__module__.startswith("ml_dtypes") else np.finfo(dtype)
    return Format(name=name, label=label, dtype=dtype, uint=uint,
                  exponent_bits=int(info.nexp), fraction_bits=int(info.nmant),
                  bias=1 - int(info.minexp), max=float(info.max),
                  smallest_normal=float(info.smallest_normal),
                  smallest_subnormal=float(info.smallest_subnormal), eps=float(info.eps),
                  has_inf=has_inf)


FORMATS: dict[str, Format] = {
    "fp32": _make_format("fp32", "FP32", np.float32, np.uint32, True),
    "bf16": _make_format("bf16", "BF16", ml_dtypes.bfloat16, np.uint16, True),
    "fp16": _make_format("fp16", "FP16", np.float16, np.uint16, True),
    "fp8_e4m3": _make_format("fp8_e4m3", "FP8 E4M3", ml_dtypes.float8_e4m3fn, np.uint8, False),
    "fp8_e5m2": _make_format("fp8_e5m2", "FP8 E5M2", ml_dtypes.float8_e5m2, np.uint8, True),
}


def get_format(fmt) -> Format:
    """The :class:`Format` called ``fmt`` (or ``fmt`` itself). Unknown names raise ValueError."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    raise ValueError(f"unknown format {fmt!r}; valid formats are {', '.join(map(repr, FORMATS))}")


def format_table():
    """A pandas DataFrame comparing the five formats (one row each)."""
    import pandas as pd
    rows = []
    for f in FORMATS.values():
        rows.append({"format": f.label, "sign bits": f.sign_bits, "exponent bits": f.exponent_bits,
                     "fraction bits": f.fraction_bits, "bias": f.bias, "max": f"{f.max:.4g}",
                     "smallest normal": f"{f.smallest_normal:.3g}",
                     "smallest subnormal": f"{f.smallest_subnormal:.3g}",
                     "eps = ulp(1)": f"{f.eps:.3g}", "decimal digits": round(f.precision * math.log10(2), 1),
                     "has inf": "yes" if f.has_inf else "no: NaN"})
    return pd.DataFrame(rows).set_index("format")


# ----------------------------------------------------------------------------------------------
# Values, spacing and bit patterns
# ----------------------------------------------------------------------------------------------
def _as_float64(x, what="x") -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a number or an array of numbers, got {x!r}") from exc


def _round_to_odd(x: np.ndarray, f: Format) -> np.ndarray:
    """``x`` rounded "to odd" two bits below the last bit ``f`` keeps at x (exact in float64).

    Truncating and then forcing the last bit to 1 if anything was cut off keeps exactly the
    information round-to-nearest-even needs (guard bit, and whether anything lies below it), and the
    result has at most ``precision + 2`` significant bits, so float32 holds it exactly.
    """
    mag = np.abs(x)
    finite_nonzero = np.isfinite(mag) & (mag > 0)
    safe = np.where(finite_nonzero, mag, 1.0)
    lead = np.frexp(safe)[1] - 1                                 # floor(log2 |x|)
    lsb = np.maximum(lead, f.emin) - f.fraction_bits - 2           # 2 bits below the kept last bit
    scaled = np.ldexp(safe, -lsb)                                  # exact: power-of-two scaling
    kept = np.floor(scaled)
    kept = np.where((scaled != kept) & (np.fmod(kept, 2) == 0), kept + 1, kept)
    odd = np.copysign(np.ldexp(kept, lsb), x)
    return np.where(finite_nonzero, odd, x)


def round_to(x, fmt):
    """``x`` (number or array) rounded to nearest-even in ``fmt``, returned as float64.

    The rounding is done by the real dtype cast (numpy for fp32/fp16, ml_dtypes for the others).
    NaN stays NaN; values beyond the range become inf (or NaN in FP8 E4M3, which has no inf), as the
    library casts do. Python scalars give a Python float.
    """
    f = get_format(fmt)
    arr = _as_float64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        out = _round_to_odd(arr, f).astype(f.dtype).astype(np.float64)
    return float(out) if out.ndim == 0 else out


def ulp(x, fmt):
    """Spacing of ``fmt`` numbers in the binade of ``x``: 2^(max(floor(log2|x|), emin) - fraction_bits).

    This is the gap between consecutive representable numbers around ``x`` (for ``x`` a power of
    two, the gap just above it). ulp(0) is the smallest subnormal; inf/NaN give NaN.
    """
    f = get_format(fmt)
    arr = _as_float64(x)
    mag = np.abs(arr)
    safe = np.where(np.isfinite(mag) & (mag > 0), mag, 1.0)
    lead = np.maximum(np.frexp(safe)[1] - 1, f.emin)
    out = np.ldexp(1.0, lead - f.fraction_bits)
    out = np.where(mag == 0, f.smallest_subnormal, out)
    out = np.where(np.isfinite(mag), out, np.nan)
    return float(out) if out.ndim == 0 else out


def _pattern_int(x: float, f: Format) -> int:
    stored = np.array(round_to(float(x), f), dtype=np.float64).astype(f.dtype)
    return int(stored.view(f.uint))


def _split_bits(code: int, f: Format) -> tuple[str, str, str]:
    s = format(code, f"0{f.total_bits}b")
    return s[0], s[1:1 + f.exponent_bits], s[1 + f.exponent_bits:]


def bits(x, fmt, sep: str = "|") -> str:
    """The bit pattern of ``x`` stored in ``fmt`` (rounded to nearest-even first): sign|exponent|fraction."""
    f = get_format(fmt)
    return sep.join(_split_bits(_pattern_int(_scalar(x, "x"), f), f))


def from_bits(pattern: str, fmt) -> float:
    """The value (float64) of a bit pattern such as ``'1|10000000|0010011'`` (separators, spaces, 0b ok)."""
    f = get_format(fmt)
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string of 0s and 1s, got {pattern!r}")
    clean = pattern.strip().lower().removeprefix("0b")
    clean = "".join(ch for ch in clean if ch not in "|_ ")
    if len(clean) != f.total_bits or set(clean) - {"0", "1"}:
        raise ValueError(f"{pattern!r} is not a {f.total_bits}-bit pattern of 0s and 1s for {f.label}")
    code = np.array(int(clean, 2), dtype=f.uint)
    with np.errstate(invalid="ignore"):
        return float(code.view(f.dtype).astype(np.float64))


@dataclasses.dataclass(frozen=True)
class Fields:
    """The decoded fields of one stored value."""
    fmt: str
    value: float
    sign: int
    exponent_field: int
    fraction_field: int
    kind: str           # 'normal' | 'subnormal' | 'zero' | 'inf' | 'nan'
    exponent: int | None   # unbiased exponent (None for inf/nan)
    significand: str    # '1.0010011' or '0.0000101'
    pattern: str

    def __str__(self) -> str:
        if self.kind in ("inf", "nan"):
            return f"{self.pattern}  {self.kind}"
        sign = "-" if self.sign else "+"
        return f"{self.pattern}  = {sign}{self.significand} x 2^{self.exponent}  ({self.kind}) = {self.value!r}"


def decode(x, fmt) -> Fields:
    """Sign, exponent and fraction fields of ``x`` stored in ``fmt``, and what they mean."""
    f = get_format(fmt)
    code = _pattern_int(_scalar(x, "x"), f)
    s, e, m = _split_bits(code, f)
    value = from_bits(s + e + m, f)
    ef, mf = int(e, 2), int(m, 2)
    if math.isnan(value):
        kind, exponent, sig = "nan", None, ""
    elif math.isinf(value):
        kind, exponent, sig = "inf", None, ""
    elif ef == 0:
        kind, exponent, sig = ("zero" if mf == 0 else "subnormal"), f.emin, f"0.{m}"
    else:
        kind, exponent, sig = "normal", ef - f.bias, f"1.{m}"
    return Fields(f.name, value, int(s), ef, mf, kind, exponent, sig, f"{s}|{e}|{m}")


def _scalar(x, what: str) -> float:
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{what} must be a number, got the boolean {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be a real number, got {x!r}") from exc


# ----------------------------------------------------------------------------------------------
# Exact addition traces
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Operand:
    """One operand of a traced addition: value = (-1)^sign * significand * 2^(exponent - fraction_bits)."""
    given: float
    value: float
    fmt: str
    sign: int
    exponent: int
    significand: int
    pattern: str

    @property
    def rounded_on_input(self) -> bool:
        return self.given != self.value


def _operand(x, fmt, what: str) -> Operand:
    f = get_format(fmt)
    given = _scalar(x, what)
    if not math.isfinite(given):
        raise ValueError(f"{what} = {given!r} is not finite: a rounding trace needs finite operands")
    value = round_to(given, f)
    if not math.isfinite(value):
        raise ValueError(f"{what} = {given!r} overflows {f.label} (largest finite value {f.max:.6g})")
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    mag = abs(value)
    exponent = f.emin if mag == 0 else max(math.frexp(mag)[1] - 1, f.emin)
    significand = Fraction(mag) / Fraction(2) ** (exponent - f.fraction_bits)
    assert significand.denominator == 1, "value not representable in its format"
    return Operand(given, value, f.name, sign, exponent, int(significand), bits(value, f))


def _fixed(n: int, frac_digits: int, int_width: int = 0) -> str:
    """Nonnegative integer n * 2^-frac_digits written in binary with frac_digits fraction digits."""
    digits = format(n, "b").rjust(frac_digits + 1, "0")
    whole, frac = digits[:len(digits) - frac_digits], digits[len(digits) - frac_digits:]
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


@dataclasses.dataclass(repr=False)
class AddTrace:
    """Every step of ``a + b`` rounded once to nearest-even in ``out_fmt``, computed with integers.

    ``guard`` is the first bit below the kept last bit (the paper calls it "the rounding bit"),
    ``round_bit`` the next one and ``sticky`` the OR of all bits below those. Round to nearest even:
    up (away from zero) if guard = 1 and (round_bit or sticky or the kept last bit is 1).
    """
    a: Operand
    b: Operand
    out_fmt: str
    exp_diff: int                 # exponent of the larger operand minus that of the smaller
    shifted: int                  # how far the smaller significand is shifted right
    operation: str                # 'add' (same signs) | 'subtract' (different signs)
    aligned: tuple[str, str]      # the two significands, binary points aligned (larger first)
    raw_sum: str                  # sum of aligned significands (before normalisation), binary
    raw_exponent: int             # exponent of the larger operand: raw_sum is scaled by 2^raw_exponent
    normalise: str                # 'carry' | 'none' | 'cancel' | 'zero'
    norm_shift: int               # +1 shift right after a carry, -k shift left after cancellation
    exponent: int                 # result exponent before rounding
    kept: str                     # kept significand, e.g. '1.0010110'
    guard: int
    round_bit: int
    sticky_bits: str              # all bits below the round bit
    sticky: int
    inexact: bool
    rounded_up: bool              # magnitude increased (away from zero)
    tie: bool
    decision: str
    result: float
    result_pattern: str
    exact: Fraction
    overflow: bool
    underflow: bool               # result subnormal or zero although the exact sum is not
    library: float                # the library's cast of the exact sum
    native: float | None          # the library's own a + b when all three formats agree
    notes: list[str] = dataclasses.field(default_factory=list)

    # -- numbers derived from the exact ones -------------------------------------------------
    @property
    def exact_sum(self) -> float:
        """The exact sum, rounded to float64 for printing (see ``exact`` for the Fraction)."""
        return float(self.exact)

    @property
    def error_exact(self) -> Fraction | None:
        """result - exact as a Fraction (None after an overflow)."""
        return Fraction(self.result) - self.exact if math.isfinite(self.result) else None

    @property
    def error(self) -> float:
        """result - exact (the signed rounding error), as the nearest float64."""
        return float(self.error_exact) if math.isfinite(self.result) else math.nan

    @property
    def ulp(self) -> float:
        return ulp(self.exact_sum, self.out_fmt)

    @property
    def error_ulps(self) -> float:
        return self.error / self.ulp

    @property
    def sum_fits_fp32(self) -> bool:
        """Would an FP32 accumulator hold the exact sum without rounding?"""
        as_fp32 = round_to(self.exact_sum, "fp32")
        return math.isfinite(as_fp32) and Fraction(as_fp32) == self.exact

    # -- rendering ------------------------------------------------------------------------------
    def _rows(self):
        """(step, explanation, bit-segments) rows; a segment is (text, role)."""
        fa, fb, fo = get_format(self.a.fmt), get_format(self.b.fmt), get_format(self.out_fmt)
        rows = []
        for name, op, f in (("a", self.a, fa), ("b", self.b, fb)):
            extra = f" (given {op.given!r}, rounded on input)" if op.rounded_on_input else ""
            rows.append((name, f"{op.value!r} in {f.label}{extra}", [(op.pattern, "pattern")]))
        sign = lambda s: "-" if s else "+"
        big_sign = sign(self.a.sign if abs(self.a.value) >= abs(self.b.value) else self.b.sign)
        small_sign = sign(self.b.sign if abs(self.a.value) >= abs(self.b.value) else self.a.sign)
        rows.append(("1 align", f"exponents differ by {self.exp_diff}: the smaller significand moves "
                     f"{self.shifted} place(s) right (x 2^{self.raw_exponent})",
                     [(_signed(big_sign, _squeeze(self.aligned[0])), "plain"), ("\n", "plain"),
                      (_signed(small_sign, _squeeze(self.aligned[1])), "plain")]))
        op_word = ("same signs: add the significands" if self.operation == "add"
                   else "different signs: subtract the smaller significand")
        rows.append(("2 add", op_word, [(_signed(big_sign, _squeeze(self.raw_sum)) +
                                         f" x 2^{self.raw_exponent}", "plain")]))
        norm_text = {"carry": f"carry out of the leading bit: shift right by 1, exponent "
                              f"{self.raw_exponent} -> {self.exponent}",
                     "none": "already of the form 1.xxx: nothing to do",
                     "cancel": f"cancellation: shift left by {-self.norm_shift}, exponent "
                               f"{self.raw_exponent} -> {self.exponent}",
                     "zero": "the significands cancel exactly: the sum is 0",
                     "subnormal": f"below the smallest normal exponent: kept as a subnormal "
                                  f"0.xxx x 2^{self.exponent}"}[self.normalise]
        rows.append(("3 normalise", norm_text, self._bit_segments(big_sign)))
        rows.append(("4 round", self.decision, self._bit_segments(big_sign, grs=True)))
        if math.isfinite(self.result):
            res = f"{self.result!r} in {fo.label}"
        else:
            res = f"{self.result!r}: overflow beyond {fo.label}'s largest value {fo.max:.6g}"
        rows.append(("5 result", res, [(self.result_pattern, "pattern")]))
        fits = "yes" if self.sum_fits_fp32 else "no"
        rows.append(("exact sum", f"{self.exact_sum!r} (exact as a fraction; fits in FP32: {fits})", []))
        if math.isfinite(self.result):
            rows.append(("error", f"result - exact = {self.error!r} = {self.error_ulps:+.4g} ulp "
                         f"(1 ulp of {fo.label} here = {self.ulp!r})", []))
        check = f"library cast of the exact sum: {self.library!r}"
        if self.native is not None:
            check += f"; library {fo.label} addition a + b: {self.native!r}"
        rows.append(("check", check + " (asserted equal)", []))
        for note in self.notes:
            rows.append(("note", note, []))
        return rows

    def _bit_segments(self, sign: str, grs: bool = False):
        if self.normalise == "zero":
            return [("0", "plain")]
        if not grs:
            tail = (str(self.guard) + str(self.round_bit) + self.sticky_bits) if self.inexact else ""
            return [(sign + self.kept + _squeeze(tail) + f" x 2^{self.exponent}", "plain")]
        segs = [(sign + self.kept[:-1], "kept"), (self.kept[-1], "lsb")]
        if self.inexact:
            segs += [("|", "plain"), (str(self.guard), "guard"), ("|", "plain"),
                     (str(self.round_bit), "round")]
            if self.sticky_bits:
                segs += [("|", "plain"), (_squeeze(self.sticky_bits), "sticky")]
        segs.append((f" x 2^{self.exponent}", "plain"))
        return segs

    def to_text(self) -> str:
        fo = get_format(self.out_fmt)
        lines = [f"{get_format(self.a.fmt).label} a + {get_format(self.b.fmt).label} b, rounded once to "
                 f"nearest-even {fo.label}"]
        for step, text, segs in self._rows():
            bitstr = "".join(t for t, _ in segs)
            lines.append(f"  {step:<11} {text}")
            for bl in bitstr.split("\n") if bitstr else []:
                lines.append(f"  {'':<11}   {bl}")
        if self.inexact:
            lines.append("  (step 4 reads kept bits | guard bit G | round bit R | sticky bits, "
                         f"S = OR of the sticky bits = {self.sticky})")
        return "\n".join(lines)

    __str__ = to_text

    def __repr__(self) -> str:
        return (f"<AddTrace {self.a.value!r} ({self.a.fmt}) + {self.b.value!r} ({self.b.fmt}) -> "
                f"{self.result!r} ({self.out_fmt}), error {self.error!r}>")

    _STYLE = {"lsb": "text-decoration:underline;font-weight:bold",
              "guard": "background:#f4a261;color:#000;font-weight:bold",
              "round": "background:#bde0fe;color:#000",
              "sticky": "background:#bde0fe;color:#000",
              "pattern": "", "kept": "", "plain": ""}

    def _repr_html_(self) -> str:
        fo = get_format(self.out_fmt)
        rows = []
        for step, text, segs in self._rows():
            cell = "".join(
                f'<span style="{self._STYLE[role]}">{html.escape(t)}</span>' if self._STYLE[role]
                else html.escape(t) for t, role in segs).replace("\n", "<br>")
            bit_line = (f"<br><span style='font-family:monospace;white-space:pre'>{cell}</span>"
                        if cell else "")
            rows.append(f"<tr><td style='text-align:left;vertical-align:top;white-space:nowrap;"
                        f"padding-right:12px'><b>{html.escape(step)}</b></td>"
                        f"<td style='text-align:left'>{html.escape(text)}{bit_line}</td></tr>")
        legend = ("<span style='{}'>guard bit G</span> (the paper's \"rounding bit\"), "
                  "<span style='{}'>round bit R and sticky bits</span>, "
                  "<span style='{}'>kept last bit</span>").format(
            self._STYLE["guard"], self._STYLE["sticky"], self._STYLE["lsb"])
        title = (f"{get_format(self.a.fmt).label} a + {get_format(self.b.fmt).label} b, rounded once to "
                 f"nearest-even {fo.label}")
        return (f"<div><p style='margin:0'><b>{html.escape(title)}</b></p>"
                f"<table style='border-collapse:collapse;font-size:90%'>{''.join(rows)}</table>"
                f"<p style='margin:0;font-size:85%'>{legend}</p></div>")


def add_trace(a, b, fmt="bf16", *, a_fmt=None, b_fmt=None) -> AddTrace:
    """Trace ``a + b`` rounded once to nearest-even in ``fmt``.

    ``a`` is stored in ``a_fmt`` and ``b`` in ``b_fmt`` (both default to ``fmt``), using the library
    casts; the paper's example is ``add_trace(fp32_accumulator, bf16_value, "bf16", a_fmt="fp32")``.
    The sum is computed exactly (integers), then rounded once: what an adder with guard, round and
    sticky bits does, and what happens when an FP32 accumulator that holds the exact sum is stored
    in ``fmt`` (see :attr:`AddTrace.sum_fits_fp32`).

    The result is asserted equal to the library's cast of the exact sum and, when ``a_fmt``,
    ``b_fmt`` and ``fmt`` agree, to the library's own addition in that dtype.
    """
    fo = get_format(fmt)
    fa, fb = get_format(a_fmt or fo), get_format(b_fmt or fo)
    opa, opb = _operand(a, fa, "a"), _operand(b, fb, "b")
    big, small = (opa, opb) if abs(opa.value) >= abs(opb.value) else (opb, opa)
    f_big, f_small = get_format(big.fmt), get_format(small.fmt)
    q_big, q_small = big.exponent - f_big.fraction_bits, small.exponent - f_small.fraction_bits
    q = min(q_big, q_small)                          # common weight of the last bit, 2^q
    m_big, m_small = big.significand << (q_big - q), small.significand << (q_small - q)
    frac = big.exponent - q                          # fraction digits when written x 2^big.exponent
    width = max(1, (m_big + m_small).bit_length() - frac)
    aligned = (_fixed(m_big, frac, width), _fixed(m_small, frac, width))
    operation = "add" if big.sign == small.sign else "subtract"
    total = m_big + m_small if operation == "add" else m_big - m_small      # exact, >= 0
    if total == 0:
        sign = big.sign & small.sign                 # RNE: x + (-x) = +0, (-0) + (-0) = -0
    else:
        sign = big.sign
    exact = Fraction(total * (-1 if sign else 1)) * Fraction(2) ** q
    notes = []

    # normalise: the leading one of `total` sits at 2^lead; the result exponent is at least emin
    if total == 0:
        lead, exponent, normalise = big.exponent, fo.emin, "zero"
    else:
        lead = q + total.bit_length() - 1
        exponent = max(lead, fo.emin)
        normalise = ("carry" if lead > big.exponent else "cancel" if lead < big.exponent else "none")
        if lead < fo.emin:
            normalise = "subnormal"
    norm_shift = lead - big.exponent if total else 0
    lsb = exponent - fo.fraction_bits                # weight of the last kept bit
    drop = lsb - q                                   # how many low bits of `total` fall off
    if drop <= 0:
        kept_int, dropped = total << -drop, 0
        guard = round_bit = sticky = 0
        sticky_bits = ""
    else:
        kept_int, dropped = total >> drop, total & ((1 << drop) - 1)
        guard = dropped >> (drop - 1)
        round_bit = (dropped >> (drop - 2)) & 1 if drop >= 2 else 0
        sticky_bits = format(dropped & ((1 << (drop - 2)) - 1), "b").rjust(drop - 2, "0") if drop > 2 else ""
        sticky = int("1" in sticky_bits)
    inexact = dropped != 0
    kept_str = _fixed(kept_int, fo.fraction_bits)
    lsb_bit = kept_int & 1
    tie = bool(guard and not round_bit and not sticky)
    up = bool(guard and (round_bit or sticky or lsb_bit))
    if not inexact:
        decision = "no bits fall off: the sum is exact in " + fo.label
    elif not guard:
        decision = "G = 0: less than half an ulp falls off: round down (toward zero)"
    elif not tie:
        decision = (f"G = 1 and R or S = 1: more than half an ulp falls off: round up (away from zero)")
    elif lsb_bit:
        decision = "G = 1, R = S = 0: an exact tie; the kept last bit is 1 (odd): round up to even"
    else:
        decision = "G = 1, R = S = 0: an exact tie; the kept last bit is 0 (even): round down to even"
    rounded_int = kept_int + up
    result_exact = Fraction(rounded_int) * Fraction(2) ** lsb
    overflow = result_exact > Fraction(fo.max)
    underflow = total != 0 and (result_exact < Fraction(fo.smallest_normal))
    if underflow:
        notes.append("underflow: the result is " + ("0" if rounded_int == 0 else "subnormal") +
                     f" in {fo.label} (smallest normal {fo.smallest_normal:.6g})")

    # the library's verdict: cast of the exact sum, and its own addition where formats agree
    library = round_to(_exact_proxy(exact, fo), fo)
    if total == 0:
        library = -0.0 if sign else 0.0
    if overflow:
        result = library
        assert not math.isfinite(library), "trace overflowed but the library cast did not"
        notes.append(f"overflow: the rounded magnitude exceeds {fo.max:.6g}; the library gives "
                     f"{library!r}" + ("" if fo.has_inf else f" ({fo.label} has no infinity)"))
    else:
        result = float(result_exact) * (-1.0 if sign else 1.0)
        if result == 0:
            result = -0.0 if sign else 0.0
        assert result == library, f"trace {result!r} != library cast {library!r} of the exact sum"
    native = None
    if fa.name == fb.name == fo.name:
        with np.errstate(over="ignore", invalid="ignore"):
            native = float(np.array(opa.value).astype(fo.dtype) + np.array(opb.value).astype(fo.dtype))
        same = (native == result and math.copysign(1, native) == math.copysign(1, result)) or (
            math.isnan(native) and math.isnan(result)) or (overflow and not math.isfinite(native))
        assert same, f"trace {result!r} != library addition {native!r}"
    pattern = bits(result, fo) if not math.isnan(result) else "NaN"
    if opa.rounded_on_input or opb.rounded_on_input:
        notes.append("an operand was not representable in its format and was rounded first")
    return AddTrace(a=opa, b=opb, out_fmt=fo.name, exp_diff=big.exponent - small.exponent,
                    shifted=(big.exponent - small.exponent) if small.significand else 0,
                    operation=operation, aligned=aligned, raw_sum=_fixed(total, frac, width),
                    raw_exponent=big.exponent, normalise=normalise, norm_shift=norm_shift,
                    exponent=exponent, kept=kept_str, guard=guard, round_bit=round_bit,
                    sticky_bits=sticky_bits, sticky=sticky, inexact=inexact, rounded_up=up and inexact,
                    tie=tie, decision=decision, result=result, result_pattern=pattern, exact=exact,
                    overflow=overflow, underflow=underflow, library=library, native=native, notes=notes)


def _exact_proxy(exact: Fraction, f: Format) -> float:
    """A float64 that rounds like ``exact`` in ``f``: ``exact`` rounded to odd two bits below f's last bit.

    Needed when the exact sum has more bits than a float64 (e.g. 1e30 + 1e-30 in FP32).
    """
    if exact == 0:
        return 0.0
    mag = abs(exact)
    lead = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** lead > mag:                    # make lead = floor(log2 mag)
        lead -= 1
    lsb = max(lead, f.emin) - f.fraction_bits - 2
    scaled = mag / Fraction(2) ** lsb
    kept = scaled.numerator // scaled.denominator
    if kept != scaled and kept % 2 == 0:
        kept += 1
    value = math.ldexp(kept, lsb)                    # at most precision + 3 bits: exact in float64
    return -value if exact < 0 else value


# ----------------------------------------------------------------------------------------------
# The bias experiment
# ----------------------------------------------------------------------------------------------
KINDS = ("random", "carry", "carry+residual")


def rounding_errors(n: int, kind: str = "random", fmt="bf16", rng=None, *, sign: float = -1.0,
                    residual_ulps: float = 0.1, acc_fmt="fp32") -> np.ndarray:
    """Signed rounding errors, in ulps of ``fmt`` at the exact sum, of ``n`` additions acc + b.

    ``b`` is a ``fmt`` value and ``acc`` an ``acc_fmt`` accumulator; the exact sum is rounded once
    to ``fmt`` (:func:`round_to`). ``kind`` chooses the operands:

    ``"random"``
        acc and b of random signs and magnitudes (log-uniform over 2^-4 .. 2^4), acc with a full
        ``acc_fmt`` significand.
    ``"carry"``
        acc and b are two ``fmt`` values of one sign (``sign``) in the same binade, so their
        significands always carry out; nothing else.
    ``"carry+residual"``
        as ``"carry"``, but acc also holds a small residual of the same sign (uniform in
        (0, ``residual_ulps``) ulps of acc's ``fmt`` value), added in the ``acc_fmt`` accumulator:
        the paper's Claim 3 (an accumulated sum of other small terms before the second large one).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid kinds are {', '.join(map(repr, KINDS))}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if sign not in (-1, 1, -1.0, 1.0):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    f, fa = get_format(fmt), get_format(acc_fmt)
    rng = np.random.default_rng(rng)
    if kind == "random":
        signs = rng.choice([-1.0, 1.0], size=(2, n))
        mags = np.exp2(rng.uniform(-4, 4, size=(2, n)))
        acc = round_to(signs[0] * mags[0], fa)
        b = round_to(signs[1] * mags[1], f)
    else:
        binade = rng.integers(-3, 4, size=n)                       # both operands in [2^k, 2^(k+1))
        sig = rng.integers(2 ** f.fraction_bits, 2 ** f.precision, size=(2, n))
        a_val, b = (sign * np.ldexp(sig.astype(np.float64), binade - f.fraction_bits))
        residual = 0.0
        if kind == "carry+residual":
            residual = sign * rng.uniform(0, residual_ulps, size=n) * ulp(a_val, f)
        acc = round_to(a_val + residual, fa)
        b = np.asarray(b)
    exact = acc + b
    if not (np.all(exact - acc == b) and np.all(exact - b == acc)):   # float64 held the sum exactly
        raise ArithmeticError("a sum was not exact in float64; reduce the magnitude range")
    return (round_to(exact, f) - exact) / ulp(exact, f)


@dataclasses.dataclass(frozen=True)
class MeanError:
    mean: float
    sem: float          # standard error of the mean
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.4f} ± {self.sem:.4f} ulp (n = {self.n:,})"


def mean_error(errors) -> MeanError:
    """Mean of ``errors`` with its standard error (sample std / sqrt(n))."""
    e = np.asarray(errors, dtype=np.float64).ravel()
    if e.size < 2 or not np.all(np.isfinite(e)):
        raise ValueError("mean_error needs at least two finite errors")
    return MeanError(float(e.mean()), float(e.std(ddof=1) / math.sqrt(e.size)), int(e.size))


# ----------------------------------------------------------------------------------------------
# Plots used by chapter 1
# ----------------------------------------------------------------------------------------------
def plot_ulp(axes=None, formats=None):
    """Log-log plots of ulp(x) against x > 0 for each format: the whole range, and a zoom around 1.

    Each line runs from the format's smallest subnormal to its largest value (marked with a dot).
    Returns the two axes.
    """
    import matplotlib.pyplot as plt
    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(8, 8), layout="constrained")
    styles = ["-", "-", "--", "-", ":"]
    zoom = (2.0 ** -16, 2.0 ** 17)
    for style, name in zip(styles, formats or FORMATS):
        f = get_format(name)
        x = np.geomspace(f.smallest_subnormal, f.max, 6000)
        for ax in axes:
            line, = ax.step(x, ulp(x, f), where="post", linestyle=style, linewidth=1.6,
                            label=f"{f.label} ({f.fraction_bits} fraction bits)")
            ax.plot([f.max], [ulp(f.max, f)], "o", color=line.get_color(), markersize=4)
    for ax, title in zip(axes, ("whole range (flat left ends: subnormals)", "zoom: each step is one binade")):
        ax.set_xscale("log", base=10)
        ax.set_yscale("log", base=10)
        ax.set_xlabel("value x")
        ax.set_ylabel("ulp(x): gap to the next number")
        ax.set_title(title)
    axes[1].set_xlim(*zoom)
    axes[1].set_ylim(2.0 ** -42, 2.0 ** 16)
    axes[0].legend(fontsize=8, loc="upper left")
    return axes


def plot_error_hist(errors_by_kind: dict, ax=None, bins=None):
    """Overlaid histograms of signed rounding errors (ulps), one per experiment."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    bins = np.linspace(-0.5, 0.5, 41) if bins is None else bins
    for label, errs in errors_by_kind.items():
        m = mean_error(errs)
        _, _, patches = ax.hist(errs, bins=bins, histtype="step", linewidth=1.6, density=True,
                                label=f"{label}: mean {m.mean:+.3f} ± {m.sem:.3f}")
        ax.axvline(m.mean, linestyle="--", linewidth=1, color=patches[0].get_edgecolor())
    ax.set_xlabel("rounding error (rounded − exact), in ulps at the exact sum; dashed: means")
    ax.set_ylabel("density")
    ax.legend(fontsize=8)
    return ax


# ----------------------------------------------------------------------------------------------
# Worked examples and exercises
# ----------------------------------------------------------------------------------------------
# Appendix B of Qiu & Yao: an FP32 accumulator plus a BF16 value, the sum rounded to BF16.
PAPER_EXAMPLE = {"acc_pattern": "11000000000110100000111000101110", "b": -2.296875,
                 "acc_fmt": "fp32", "b_fmt": "bf16", "out_fmt": "bf16"}

# Exercise 2: round this FP32 pattern to BF16 by hand.
EXERCISE_PATTERN = "0|10000001|10110011000000000000000"

# Exercise 3: FP32 accumulator + BF16 value, rounded to BF16. Which round away from zero?
EXERCISE_SUMS = [(-2.40625, -2.296875), (-2.4071154594421387, -2.296875),
                 (1.0078125, 1.0), (1.0234375, 1.0)]


def _all_values(fmt) -> np.ndarray:
    f = get_format(fmt)
    codes = np.arange(2 ** f.total_bits, dtype=np.uint64).astype(f.uint)
    with np.errstate(invalid="ignore"):
        return codes.view(f.dtype).astype(np.float64)


def _reference(question: str):
    if question == "bf16-in-1-2":
        v = _all_values("bf16")
        return int(np.count_nonzero((v >= 1) & (v < 2)))
    if question == "round-pattern":
        return bits(round_to(from_bits(EXERCISE_PATTERN, "fp32"), "bf16"), "bf16", sep="")
    if question == "which-round-up":
        return {i for i, (acc, b) in enumerate(EXERCISE_SUMS)
                if add_trace(acc, b, "bf16", a_fmt="fp32").rounded_up}
    raise ValueError(f"unknown question {question!r}; valid questions are "
                     "'bf16-in-1-2', 'round-pattern', 'which-round-up'")


def _normalise_answer(question: str, answer):
    if question == "round-pattern":
        if not isinstance(answer, str):
            raise TypeError(f"give the BF16 pattern as a string of 16 bits, got {answer!r}")
        return "".join(ch for ch in answer if ch not in "|_ ").removeprefix("0b")
    if question == "which-round-up":
        try:
            return {int(i) for i in answer}
        except TypeError as exc:
            raise TypeError(f"give the indices as a set or list of ints, got {answer!r}") from exc
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, (int, np.integer)):
        raise TypeError(f"give the count as an int, got {answer!r}")
    return int(answer)


_HINTS = {"bf16-in-1-2": "all numbers in [1, 2) share one exponent; how many fraction patterns are there?",
          "round-pattern": "split the 23 fraction bits into 7 kept bits, the guard bit and the rest; "
                           "a tie goes to the even neighbour",
          "which-round-up": "trace each sum: after the carry, look at the guard bit and whether any bit "
                            "below it is set"}


def check_answer(question: str, answer) -> None:
    """Check an exercise answer against a value computed from the library.

    Prints "correct" if right; raises AssertionError (with a hint) if wrong. ``answer=None`` means
    "not answered yet": a message is printed and nothing is checked.
    """
    reference = _reference(question)
    if answer is None:
        print(f"[{question}] no answer yet: replace None with yours and run this cell again.")
        return
    given = _normalise_answer(question, answer)
    if given != reference:
        raise AssertionError(f"[{question}] {answer!r} is not right. Hint: {_HINTS[question]}")
    print(f"[{question}] correct: {answer!r}")
