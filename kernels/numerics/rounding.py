"""Rounding in PyTorch: to a low-precision format, to k mantissa bits, ulps and errors in ulps.

One helper per operation, shared by the emulator, the lab and the GPT-2 code:

* :func:`round_to_dtype`   nearest value of a torch dtype (ties to even), keeping the tensor's
  dtype (NumPy values and named formats: :func:`.formats.round_to`);
* :func:`round_mantissa`   fp32 rounded to k explicit mantissa bits (k = 7 is bf16), ties to even;
* :func:`round_mantissa_stochastic`  the same width, rounded stochastically (unbiased);
* :func:`ulp_in_dtype`     spacing of the dtype's numbers in the binade of x (NumPy:
  :func:`.formats.ulp`);
* :func:`error_in_ulps`    (low − exact) / ulp(low): the unit every bias in the book is quoted in;
* :func:`next_below`       the largest bf16 strictly below x;
* :func:`ulp_distance`     how many representable numbers lie between two tensors (exact).
* :func:`work_dtype`       the dtype arithmetic on low-precision values is done in (fp32, or fp64).

torch's casts round to nearest-even on every device, so these give the same bits on a CPU and a
GPU, and an fp64 input is rounded once (see :func:`round_to_dtype`). (Triton's interpreter does
not: see :mod:`.triton_rounding`.)
"""

from __future__ import annotations

import math

import torch

# explicit fraction bits and smallest normal exponent of each low-precision dtype
_FRACTION_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
_EMIN = {torch.bfloat16: -126, torch.float16: -14, torch.float32: -126}


def work_dtype(low: torch.dtype) -> torch.dtype:
    """The dtype arithmetic on ``low`` values is done in: fp64 for fp64, fp32 for the rest."""
    return torch.float64 if low == torch.float64 else torch.float32


def round_to_dtype(x: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """Round ``x`` to the nearest ``low`` value (ties to even), keeping ``x``'s dtype.

    An fp64 ``x`` is rounded once, correctly: torch's fp64 → bf16 (or fp16) cast goes through
    fp32 and rounds twice, so an fp64 value a hair above a bf16 midpoint (closer than fp32 can
    see) lands on the midpoint and then rounds to even, the wrong way. Rounding to fp32 *to odd*
    first (an inexact result keeps an odd last bit) makes the second rounding the correct one."""
    if low == x.dtype or (low == torch.float64):
        return x
    if x.dtype == torch.float64 and low in (torch.bfloat16, torch.float16):
        return _to_odd_fp32(x).to(low).to(x.dtype)
    return x.to(low).to(x.dtype)


def _to_odd_fp32(x: torch.Tensor) -> torch.Tensor:
    """fp64 → fp32 rounded to odd: exact values stay, inexact ones take the neighbour whose last
    mantissa bit is 1 (enough for one correct rounding to any format with ≤ 21 fraction bits).
    The torch twin of :func:`kernels.numerics.formats._round_to_odd` (numpy, CPU): this one runs
    on the tensor's device and keeps this module free of numpy and ml_dtypes."""
    y = x.to(torch.float32)
    inexact = y.to(torch.float64) != x  # NaN compares unequal, but moving a NaN keeps it NaN
    even = (y.view(torch.int32) & 1) == 0
    away = torch.where(x > y.to(torch.float64), math.inf, -math.inf).to(torch.float32)
    return torch.where(inexact & even & torch.isfinite(y), torch.nextafter(y, away), y)


def _dropped_bits(x: torch.Tensor, bits: int, who: str) -> int:
    """How many of fp32's 23 mantissa bits rounding to ``bits`` drops (checks dtype and range)."""
    if x.dtype != torch.float32:
        raise TypeError(f"{who} works on fp32 tensors, got {x.dtype}")
    if not 0 <= int(bits) <= 23:
        raise ValueError(f"an fp32 value has 0..23 mantissa bits to keep, got {bits}")
    return 23 - int(bits)


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round fp32 ``x`` to ``bits`` explicit mantissa bits, ties to even, keeping fp32's exponent.

    ``bits=7`` is bf16 exactly (same exponent range); smaller ``bits`` give the narrower formats the
    GPT-2 chapter uses as an *amplifier* (bf16's range with fewer mantissa bits). Works on the bit
    pattern: add half an ulp minus one plus the kept last bit, then clear the dropped bits; a carry
    into the exponent is the correct rounding up, and inf stays inf.
    """
    drop = _dropped_bits(x, bits, "round_mantissa")
    if drop == 0:
        return x
    pattern = x.contiguous().view(torch.int32)
    kept_lsb = (pattern >> drop) & 1
    rounded = (pattern + ((1 << (drop - 1)) - 1) + kept_lsb) & ~((1 << drop) - 1)
    out = rounded.view(torch.float32)
    return torch.where(torch.isnan(x), x, out)


def round_mantissa_stochastic(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Stochastic rounding of fp32 ``x`` to ``bits`` mantissa bits: round away from zero with
    probability (distance to the lower neighbour) / ulp, so that E[result] = x. An unbiased
    rounding at the same width as :func:`round_mantissa` (its error spread is a little larger:
    standard deviation ≈ 0.41 ulp against 0.29): the control that tells a *biased* error from a
    merely large one. Draws from torch's global generator."""
    drop = _dropped_bits(x, bits, "round_mantissa_stochastic")
    if drop == 0:
        return x
    pattern = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << drop, x.shape, dtype=torch.int32, device=x.device)
    out = ((pattern + noise) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def ulp_in_dtype(x: torch.Tensor, low: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Spacing of ``low`` numbers in the binade of ``x``: 2^(⌊log2|x|⌋ − fraction bits), in fp64;
    NaN for x = 0 (subnormals share the smallest normal binade's spacing)."""
    if low not in _FRACTION_BITS:
        raise ValueError(f"ulp_in_dtype knows bfloat16, float16 and float32, got {low}")
    ax = x.abs().to(torch.float64)
    exponent = torch.clamp(torch.floor(torch.log2(ax)), min=float(_EMIN[low]))
    spacing = torch.pow(2.0, exponent - _FRACTION_BITS[low])
    return torch.where(ax > 0, spacing, torch.full_like(spacing, math.nan))


def error_in_ulps(
    o_lp: torch.Tensor, o_hp: torch.Tensor, low: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """(O_lp − O_hp) / ulp(O_lp) in fp64; O_hp's binade where O_lp = 0; 0 where both are 0.

    Non-finite O_lp gives NaN (counted separately by the callers). A correctly rounded result is
    always within ±0.5."""
    o_lp, o_hp = o_lp.to(torch.float64), o_hp.to(torch.float64)
    unit = torch.where(o_lp != 0, ulp_in_dtype(o_lp, low), ulp_in_dtype(o_hp, low))
    err = (o_lp - o_hp) / unit
    both_zero = (o_lp == 0) & (o_hp == 0)
    err = torch.where(both_zero, torch.zeros_like(err), err)
    return torch.where(torch.isfinite(o_lp), err, torch.full_like(err, math.nan))


def next_below(x: torch.Tensor) -> torch.Tensor:
    """The largest bf16 number strictly below each (bf16, finite) value of ``x``."""
    bits = x.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    positive = bits >= 0  # sign bit clear (includes +0)
    below = torch.where(positive, bits - 1, bits + 1)
    below = torch.where(bits == 0, torch.full_like(bits, -32767), below)  # 0x8001: -tiny
    below = torch.where(bits == -32768, torch.full_like(bits, -32767), below)  # -0 -> -tiny
    return below.to(torch.int16).view(torch.bfloat16).to(x.dtype)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable numbers of the (common, low-precision) dtype lie between a and b.

    Works on the integer bit patterns, so it is exact: 0 means bit-identical, 1 means
    neighbours. Both must be bf16, fp16, fp32 or fp64 of the same dtype; NaNs are not allowed.
    """
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    ints = {
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
        torch.float32: torch.int32,
        torch.float64: torch.int64,
    }
    if a.dtype not in ints:
        raise TypeError(f"ulp_distance needs a floating dtype, got {a.dtype}")
    if torch.isnan(a).any() or torch.isnan(b).any():
        raise ValueError("ulp_distance got NaN")

    def ordered(x):
        # map the sign-magnitude bit pattern onto a monotone integer line (-0 and +0 coincide)
        i = x.contiguous().view(ints[x.dtype]).to(torch.int64)
        sign_bit = torch.iinfo(ints[x.dtype]).min
        return torch.where(i < 0, sign_bit - i, i)

    return (ordered(a) - ordered(b)).abs()
