"""One floating-point addition, traced step by step with exact integers.

:func:`add_trace` redoes ``a + b`` the way an adder with guard, round and sticky bits does, in four
steps that are four functions here:

1. :func:`align`       write both significands as integers over one common last-bit weight 2^q,
                       add or subtract them (exact);
2. :func:`normalise`   find the leading one of the exact sum: carry, cancellation or nothing;
3. :func:`round_guard_bits`  keep the format's bits, read guard / round / sticky, round to
                       nearest-even;
4. :func:`check_against_library`  assert the result equals the library's cast of the exact sum
                       (and the library's own addition when all three formats agree).

So a trace can never disagree with what the real formats do. The paper's worked example
(Qiu & Yao, §3.3.2) is ``add_trace(fp32_accumulator, bf16_value, "bf16", a_fmt="fp32")``.
How a trace is shown (text, HTML) lives in :mod:`.addition_view`.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from . import addition_view
from .formats import Format, _scalar, bits, get_format, round_to, ulp

__all__ = [
    "Operand",
    "AddTrace",
    "add_trace",
    "align",
    "normalise",
    "round_guard_bits",
    "check_against_library",
]


@dataclasses.dataclass(frozen=True)
class Operand:
    """One operand: value = (-1)^sign * significand * 2^(exponent - fraction_bits)."""

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


def operand(x, fmt, what: str) -> Operand:
    """``x`` stored in ``fmt`` (library cast), split into sign, exponent and integer significand."""
    f = get_format(fmt)
    given = _scalar(x, what)
    if not math.isfinite(given):
        raise ValueError(
            f"{what} = {given!r} is not finite: a rounding trace needs finite operands"
        )
    value = round_to(given, f)
    if not math.isfinite(value):
        raise ValueError(
            f"{what} = {given!r} overflows {f.label} (largest finite value {f.max:.6g})"
        )
    sign = 1 if math.copysign(1.0, value) < 0 else 0
    mag = abs(value)
    exponent = f.emin if mag == 0 else max(math.frexp(mag)[1] - 1, f.emin)
    significand = Fraction(mag) / Fraction(2) ** (exponent - f.fraction_bits)
    assert significand.denominator == 1, "value not representable in its format"
    return Operand(given, value, f.name, sign, exponent, int(significand), bits(value, f))


# ----------------------------------------------------------------------------------------------
# The four steps
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Aligned:
    """Step 1: both significands over the common last-bit weight 2^q, and their exact sum."""

    big: Operand
    small: Operand
    q: int  # weight of the last bit of both aligned significands
    m_big: int
    m_small: int
    frac: int  # fraction digits when written x 2^big.exponent
    width: int  # integer digits of the widest of the three numbers
    operation: str  # 'add' (same signs) | 'subtract'
    total: int  # |exact sum| / 2^q, an exact non-negative integer
    sign: int
    exact: Fraction


def align(opa: Operand, opb: Operand) -> Aligned:
    big, small = (opa, opb) if abs(opa.value) >= abs(opb.value) else (opb, opa)
    f_big, f_small = get_format(big.fmt), get_format(small.fmt)
    q_big, q_small = big.exponent - f_big.fraction_bits, small.exponent - f_small.fraction_bits
    q = min(q_big, q_small)
    m_big, m_small = big.significand << (q_big - q), small.significand << (q_small - q)
    frac = big.exponent - q
    width = max(1, (m_big + m_small).bit_length() - frac)
    operation = "add" if big.sign == small.sign else "subtract"
    total = m_big + m_small if operation == "add" else m_big - m_small
    sign = (big.sign & small.sign) if total == 0 else big.sign  # RNE: x + (-x) = +0
    exact = Fraction(total * (-1 if sign else 1)) * Fraction(2) ** q
    return Aligned(big, small, q, m_big, m_small, frac, width, operation, total, sign, exact)


@dataclasses.dataclass(frozen=True)
class Normalised:
    """Step 2: where the leading one of the exact sum sits, and the result's exponent."""

    lead: int
    exponent: int
    kind: str  # 'carry' | 'none' | 'cancel' | 'zero' | 'subnormal'
    shift: int  # +1 after a carry, -k after cancellation


def normalise(al: Aligned, fo: Format) -> Normalised:
    if al.total == 0:
        return Normalised(al.big.exponent, fo.emin, "zero", 0)
    lead = al.q + al.total.bit_length() - 1
    kind = "carry" if lead > al.big.exponent else "cancel" if lead < al.big.exponent else "none"
    if lead < fo.emin:
        kind = "subnormal"
    return Normalised(lead, max(lead, fo.emin), kind, lead - al.big.exponent)


@dataclasses.dataclass(frozen=True)
class Rounded:
    """Step 3: the kept bits, the guard / round / sticky bits and the nearest-even decision."""

    kept_int: int
    lsb: int  # weight of the last kept bit, 2^lsb
    guard: int
    round_bit: int
    sticky_bits: str
    sticky: int
    inexact: bool
    tie: bool
    up: bool
    decision: str


def round_guard_bits(al: Aligned, norm: Normalised, fo: Format) -> Rounded:
    lsb = norm.exponent - fo.fraction_bits
    drop = lsb - al.q  # how many low bits of the exact sum fall off
    if drop <= 0:
        kept_int, dropped, guard, round_bit, sticky, sticky_bits = al.total << -drop, 0, 0, 0, 0, ""
    else:
        kept_int, dropped = al.total >> drop, al.total & ((1 << drop) - 1)
        guard = dropped >> (drop - 1)
        round_bit = (dropped >> (drop - 2)) & 1 if drop >= 2 else 0
        sticky_bits = (
            format(dropped & ((1 << (drop - 2)) - 1), "b").rjust(drop - 2, "0") if drop > 2 else ""
        )
        sticky = int("1" in sticky_bits)
    inexact = dropped != 0
    odd = kept_int & 1
    tie = bool(guard and not round_bit and not sticky)
    up = bool(guard and (round_bit or sticky or odd))
    if not inexact:
        decision = "no bits fall off: the sum is exact in " + fo.label
    elif not guard:
        decision = "G = 0: less than half an ulp falls off: round down (toward zero)"
    elif not tie:
        decision = (
            "G = 1 and R or S = 1: more than half an ulp falls off: round up (away from zero)"
        )
    elif odd:
        decision = (
            "G = 1, R = S = 0: an exact tie; the kept last bit is 1 (odd): away from zero, to even"
        )
    else:
        decision = (
            "G = 1, R = S = 0: an exact tie; the kept last bit is 0 (even): toward zero, stays even"
        )
    return Rounded(kept_int, lsb, guard, round_bit, sticky_bits, sticky, inexact, tie, up, decision)


@dataclasses.dataclass(frozen=True)
class Checked:
    """Step 4: the result, agreed with the library, and what happened at the range's ends."""

    result: float
    library: float
    native: float | None
    overflow: bool
    underflow: bool
    notes: tuple[str, ...]


def check_against_library(
    al: Aligned, rd: Rounded, opa: Operand, opb: Operand, fo: Format
) -> Checked:
    notes = []
    rounded_int = rd.kept_int + rd.up
    result_exact = Fraction(rounded_int) * Fraction(2) ** rd.lsb
    overflow = result_exact > Fraction(fo.max)
    underflow = al.total != 0 and result_exact < Fraction(fo.smallest_normal)
    if underflow:
        notes.append(
            "underflow: the result is "
            + ("0" if rounded_int == 0 else "subnormal")
            + f" in {fo.label} (smallest normal {fo.smallest_normal:.6g})"
        )
    library = round_to(_exact_proxy(al.exact, fo), fo)
    if al.total == 0:
        library = -0.0 if al.sign else 0.0
    if overflow:
        result = library
        assert not math.isfinite(library), "trace overflowed but the library cast did not"
        notes.append(
            f"overflow: the rounded magnitude exceeds {fo.max:.6g}; the library gives "
            f"{library!r}" + ("" if fo.has_inf else f" ({fo.label} has no infinity)")
        )
    else:
        result = float(result_exact) * (-1.0 if al.sign else 1.0)
        if result == 0:
            result = -0.0 if al.sign else 0.0
        assert result == library, f"trace {result!r} != library cast {library!r} of the exact sum"
    native = None
    if opa.fmt == opb.fmt == fo.name:
        with np.errstate(over="ignore", invalid="ignore"):
            native = float(
                np.array(opa.value).astype(fo.dtype) + np.array(opb.value).astype(fo.dtype)
            )
        same = (
            (native == result and math.copysign(1, native) == math.copysign(1, result))
            or (math.isnan(native) and math.isnan(result))
            or (overflow and not math.isfinite(native))
        )
        assert same, f"trace {result!r} != library addition {native!r}"
    if opa.rounded_on_input or opb.rounded_on_input:
        notes.append("an operand was not representable in its format and was rounded first")
    return Checked(result, library, native, overflow, underflow, tuple(notes))


def _exact_proxy(exact: Fraction, f: Format) -> float:
    """A float64 that rounds like ``exact`` in ``f``: ``exact`` rounded to odd two bits below f's
    last bit.

    Needed when the exact sum has more bits than a float64 (e.g. 1e30 + 1e-30 in FP32).
    """
    if exact == 0:
        return 0.0
    mag = abs(exact)
    lead = mag.numerator.bit_length() - mag.denominator.bit_length()
    if Fraction(2) ** lead > mag:  # make lead = floor(log2 mag)
        lead -= 1
    lsb = max(lead, f.emin) - f.fraction_bits - 2
    scaled = mag / Fraction(2) ** lsb
    kept = scaled.numerator // scaled.denominator
    if kept != scaled and kept % 2 == 0:
        kept += 1
    value = math.ldexp(kept, lsb)  # at most precision + 3 bits: exact in float64
    return -value if exact < 0 else value


# ----------------------------------------------------------------------------------------------
# The whole trace
# ----------------------------------------------------------------------------------------------
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
    exp_diff: int  # exponent of the larger operand minus that of the smaller
    shifted: int  # how far the smaller significand is shifted right
    operation: str  # 'add' (same signs) | 'subtract' (different signs)
    aligned: tuple[str, str]  # the two significands, binary points aligned (larger first)
    raw_sum: str  # sum of aligned significands (before normalisation), binary
    raw_exponent: int  # exponent of the larger operand: raw_sum is scaled by 2^raw_exponent
    normalise: str  # 'carry' | 'none' | 'cancel' | 'zero' | 'subnormal'
    norm_shift: int  # +1 shift right after a carry, -k shift left after cancellation
    exponent: int  # result exponent before rounding
    kept: str  # kept significand, e.g. '1.0010110'
    guard: int
    round_bit: int
    sticky_bits: str  # all bits below the round bit
    sticky: int
    inexact: bool
    rounded_up: bool  # magnitude increased (away from zero)
    tie: bool
    decision: str
    result: float
    result_pattern: str
    exact: Fraction
    overflow: bool
    underflow: bool  # result subnormal or zero although the exact sum is not
    library: float  # the library's cast of the exact sum
    native: float | None  # the library's own a + b when all three formats agree
    notes: list[str] = dataclasses.field(default_factory=list)

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

    def to_text(self) -> str:
        return addition_view.to_text(self)

    __str__ = to_text

    def __repr__(self) -> str:
        return (
            f"<AddTrace {self.a.value!r} ({self.a.fmt}) + {self.b.value!r} ({self.b.fmt}) -> "
            f"{self.result!r} ({self.out_fmt}), error {self.error!r}>"
        )

    def _repr_html_(self) -> str:
        return addition_view.to_html(self)


def add_trace(a, b, fmt="bf16", *, a_fmt=None, b_fmt=None) -> AddTrace:
    """Trace ``a + b`` rounded once to nearest-even in ``fmt``.

    ``a`` is stored in ``a_fmt`` and ``b`` in ``b_fmt`` (both default to ``fmt``), using the library
    casts. The sum is computed exactly, then rounded once: what an adder with guard, round and
    sticky bits does, and what happens when an FP32 accumulator that holds the exact sum is stored
    in ``fmt`` (see :attr:`AddTrace.sum_fits_fp32`).
    """
    fo = get_format(fmt)
    opa = operand(a, get_format(a_fmt or fo), "a")
    opb = operand(b, get_format(b_fmt or fo), "b")
    al = align(opa, opb)
    norm = normalise(al, fo)
    rd = round_guard_bits(al, norm, fo)
    ck = check_against_library(al, rd, opa, opb, fo)
    pattern = bits(ck.result, fo) if not math.isnan(ck.result) else "NaN"
    fixed = addition_view.fixed_point
    return AddTrace(
        a=opa,
        b=opb,
        out_fmt=fo.name,
        exp_diff=al.big.exponent - al.small.exponent,
        shifted=(al.big.exponent - al.small.exponent) if al.small.significand else 0,
        operation=al.operation,
        aligned=(fixed(al.m_big, al.frac, al.width), fixed(al.m_small, al.frac, al.width)),
        raw_sum=fixed(al.total, al.frac, al.width),
        raw_exponent=al.big.exponent,
        normalise=norm.kind,
        norm_shift=norm.shift,
        exponent=norm.exponent,
        kept=fixed(rd.kept_int, fo.fraction_bits),
        guard=rd.guard,
        round_bit=rd.round_bit,
        sticky_bits=rd.sticky_bits,
        sticky=rd.sticky,
        inexact=rd.inexact,
        rounded_up=rd.up and rd.inexact,
        tie=rd.tie,
        decision=rd.decision,
        result=ck.result,
        result_pattern=pattern,
        exact=al.exact,
        overflow=ck.overflow,
        underflow=ck.underflow,
        library=ck.library,
        native=ck.native,
        notes=list(ck.notes),
    )
