"""Floating-point formats from the bits up: what each format is, its values, ulps and bit patterns.

Formats are named ``"fp32"``, ``"bf16"``, ``"fp16"``, ``"fp8_e4m3"`` and ``"fp8_e5m2"``::

    from kernels import numerics
    numerics.bits(-2.296875, "bf16")             # '1|10000000|0010011'
    numerics.round_to([0.1, 1e40], "bf16")       # float64 array of the stored bf16 values
    numerics.ulp(3.0, "bf16")                    # 0.015625, the spacing of bf16 numbers at 3

The values themselves always come from the real casts of NumPy and ml_dtypes; this module only
*explains* them (NumPy side: the torch and Triton roundings live in :mod:`.rounding` and
:mod:`.triton_rounding`).

A detail worth knowing: ml_dtypes converts a float64 to bf16 or fp8 *through float32*, which rounds
twice (``bfloat16(1 + 2**-8 + 2**-30)`` gives 1.0, the correctly rounded value is 1.0078125).
:func:`round_to` avoids that: it first rounds the float64 "to odd" two bits below the target's last
bit (exact in float32), so the library's single remaining cast is the correct one.
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

__all__ = [
    "Format",
    "FORMATS",
    "get_format",
    "format_table",
    "round_to",
    "ulp",
    "bits",
    "from_bits",
    "decode",
    "Fields",
]


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
        return (
            f"Format({self.name}: 1+{self.exponent_bits}+{self.fraction_bits} bits, "
            f"bias {self.bias}, max {self.max:.6g}, eps {self.eps:.6g})"
        )


def _make_format(name, label, dtype, uint, has_inf) -> Format:
    info = ml_dtypes.finfo(dtype) if dtype.__module__.startswith("ml_dtypes") else np.finfo(dtype)
    return Format(
        name=name,
        label=label,
        dtype=dtype,
        uint=uint,
        exponent_bits=int(info.nexp),
        fraction_bits=int(info.nmant),
        bias=1 - int(info.minexp),
        max=float(info.max),
        smallest_normal=float(info.smallest_normal),
        smallest_subnormal=float(info.smallest_subnormal),
        eps=float(info.eps),
        has_inf=has_inf,
    )


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
        rows.append(
            {
                "format": f.label,
                "sign bits": f.sign_bits,
                "exponent bits": f.exponent_bits,
                "fraction bits": f.fraction_bits,
                "bias": f.bias,
                "max": f"{f.max:.4g}",
                "smallest normal": f"{f.smallest_normal:.3g}",
                "smallest subnormal": f"{f.smallest_subnormal:.3g}",
                "eps = ulp(1)": f"{f.eps:.3g}",
                "decimal digits": round(f.precision * math.log10(2), 1),
                "has inf": "yes" if f.has_inf else "no: NaN",
            }
        )
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
    lead = np.frexp(safe)[1] - 1  # floor(log2 |x|)
    lsb = np.maximum(lead, f.emin) - f.fraction_bits - 2  # 2 bits below the kept last bit
    scaled = np.ldexp(safe, -lsb)  # exact: power-of-two scaling
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
    """Spacing of ``fmt`` numbers in the binade of ``x``: 2^(max(floor(log2|x|), emin) -
    fraction_bits).

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
    return s[0], s[1 : 1 + f.exponent_bits], s[1 + f.exponent_bits :]


def bits(x, fmt, sep: str = "|") -> str:
    """The bit pattern of ``x`` stored in ``fmt`` (rounded to nearest-even first):
    sign|exponent|fraction."""
    f = get_format(fmt)
    return sep.join(_split_bits(_pattern_int(_scalar(x, "x"), f), f))


def from_bits(pattern: str, fmt) -> float:
    """The value (float64) of a bit pattern such as ``'1|10000000|0010011'`` (separators, spaces,
    0b ok)."""
    f = get_format(fmt)
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string of 0s and 1s, got {pattern!r}")
    clean = pattern.strip().lower().removeprefix("0b")
    clean = "".join(ch for ch in clean if ch not in "|_ ")
    if len(clean) != f.total_bits or set(clean) - {"0", "1"}:
        raise ValueError(
            f"{pattern!r} is not a {f.total_bits}-bit pattern of 0s and 1s for {f.label}"
        )
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
    kind: str  # 'normal' | 'subnormal' | 'zero' | 'inf' | 'nan'
    exponent: int | None  # unbiased exponent (None for inf/nan)
    significand: str  # '1.0010011' or '0.0000101'
    pattern: str

    def __str__(self) -> str:
        if self.kind in ("inf", "nan"):
            return f"{self.pattern}  {self.kind}"
        sign = "-" if self.sign else "+"
        return (
            f"{self.pattern}  = {sign}{self.significand} x 2^{self.exponent}  ({self.kind})"
            f" = {self.value!r}"
        )


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
