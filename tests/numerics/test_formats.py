"""Tests for kernels/bf16.py: traces against the library casts, format constants, bad input.

Every run draws fresh random operands (no fixed seed): a disagreement anywhere shows up sooner or
later.
"""

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from kernels import numerics as B
from kernels.numerics import addition, exercises

NAMES = list(B.FORMATS)


def _random_values(fmt, n, rng):
    """n finite values of ``fmt``: half random bit patterns, half log-uniform magnitudes over the
    range."""
    f = B.get_format(fmt)
    codes = rng.integers(0, 2**f.total_bits, size=n, dtype=np.uint64).astype(f.uint)
    with np.errstate(invalid="ignore"):
        from_codes = codes.view(f.dtype).astype(np.float64)
    logs = rng.uniform(math.log2(f.smallest_subnormal), math.log2(f.max), size=n)
    from_range = B.round_to(rng.choice([-1.0, 1.0], size=n) * np.exp2(logs), f)
    vals = np.where(rng.random(n) < 0.5, from_codes, from_range)
    return vals[np.isfinite(vals)]


def _check_trace(t, a, b):
    """Independent checks of one trace against exact arithmetic and the library."""
    exact = Fraction(a) + Fraction(b)
    assert t.exact == exact
    fo = B.get_format(t.out_fmt)
    proxy = addition._exact_proxy(exact, fo)
    # the library's cast of the exact sum (float64 holds it exactly here, or the round-to-odd proxy)
    if Fraction(float(exact)) == exact:
        lib = B.round_to(float(exact), fo)
    else:
        lib = B.round_to(proxy, fo)
    if math.isnan(lib):
        assert math.isnan(t.result) and t.overflow
        return
    assert t.result == lib
    if math.isfinite(t.result):
        assert t.error_exact == Fraction(t.result) - exact
        assert t.error == float(Fraction(t.result) - exact)
        assert abs(t.error_ulps) <= 0.5
        # rounded_up means the magnitude grew
        assert t.rounded_up == (abs(Fraction(t.result)) > abs(exact))
        # a tie means the exact sum lies halfway between two neighbours
        if t.tie:
            assert abs(Fraction(t.result) - exact) == Fraction(B.ulp(float(exact), fo)) / 2
    else:
        assert t.overflow


@pytest.mark.parametrize("fmt", NAMES)
def test_trace_matches_library_addition_same_format(fmt):
    rng = np.random.default_rng()
    f = B.get_format(fmt)
    a_vals, b_vals = _random_values(fmt, 400, rng), _random_values(fmt, 400, rng)
    for a, b in zip(a_vals, b_vals):
        t = B.add_trace(a, b, fmt)
        with np.errstate(over="ignore", invalid="ignore"):
            native = float(np.array(a).astype(f.dtype) + np.array(b).astype(f.dtype))
        if math.isnan(native):
            assert math.isnan(t.result)
        else:
            assert t.result == native and math.copysign(1, t.result) == math.copysign(1, native)
        _check_trace(t, a, b)


@pytest.mark.parametrize("fmt", NAMES)
def test_trace_matches_library_cast_mixed_formats(fmt):
    """An FP32 (or any other format) accumulator plus a value of ``fmt``, rounded to ``fmt``."""
    rng = np.random.default_rng()
    for _ in range(150):
        a_fmt = NAMES[rng.integers(len(NAMES))]
        a, b = _random_values(a_fmt, 1, rng), _random_values(fmt, 1, rng)
        if a.size == 0 or b.size == 0:
            continue
        t = B.add_trace(a[0], b[0], fmt, a_fmt=a_fmt)
        _check_trace(t, a[0], b[0])


def test_same_binade_sums_with_residual_round_away_from_zero():
    """The structure of Claim 3: a carry, then guard = 1 with a sticky residual always rounds up."""
    rng = np.random.default_rng()
    for _ in range(300):
        sig = rng.integers(128, 256, size=2)
        a, b = -sig[0] / 64.0, -sig[1] / 64.0  # two bf16 values in [-4, -2)
        acc = B.round_to(a - rng.uniform(1e-6, 0.01), "fp32")  # same-signed residual below a's ulp
        t = B.add_trace(acc, b, "bf16", a_fmt="fp32")
        assert t.normalise == "carry"
        assert t.guard == (int(sig[0] + sig[1]) & 1)
        assert t.round_bit or t.sticky
        assert t.rounded_up == bool(t.guard)


def test_paper_example_bit_for_bit():
    acc = B.from_bits("11000000000110100000111000101110", "fp32")
    assert acc == -2.4071154594421387
    t = B.add_trace(acc, -2.296875, "bf16", a_fmt="fp32")
    assert t.exact_sum == -4.703990459442139
    assert t.sum_fits_fp32
    assert t.result == -4.71875
    assert t.result_pattern.replace("|", "") == "1100000010010111"
    assert t.error == -0.014759540557861328
    assert (t.guard, t.sticky, t.rounded_up, t.normalise) == (1, 1, True, "carry")
    assert t.kept == "1.0010110"
    html = t._repr_html_()
    assert "#f4a261" in html and "-4.71875" in html
    assert "-4.703990459442139" in str(t)


def test_ties_go_to_even():
    down = B.add_trace(-2.40625, -2.296875, "bf16")  # kept last bit 0: stays
    assert down.tie and not down.rounded_up and down.result == -4.6875
    up = B.add_trace(1.0234375, 1.0, "bf16")  # kept last bit 1: goes up to even
    assert up.tie and up.rounded_up and up.result == 2.03125


def test_round_to_avoids_double_rounding():
    x = 1 + 2**-8 + 2**-30  # above the bf16 tie, below fp32's resolution
    assert float(ml_dtypes.bfloat16(x)) == 1.0  # the library's float64 path rounds twice
    assert B.round_to(x, "bf16") == 1.0078125  # round_to rounds once, correctly
    rng = np.random.default_rng()
    for fmt in NAMES:
        f = B.get_format(fmt)
        x = rng.standard_normal(2000) * np.exp2(rng.uniform(-6, 6, 2000))
        got = B.round_to(x, fmt)
        ok = np.isfinite(got)
        gap = np.abs(got[ok] - x[ok])
        # nearest: no representable neighbour is closer
        assert np.all(gap <= B.ulp(x[ok], f) / 2)
        # values already in fp32 go through the library cast unchanged
        x32 = x.astype(np.float32).astype(np.float64)
        with np.errstate(over="ignore"):
            direct = x32.astype(f.dtype).astype(np.float64)
        np.testing.assert_array_equal(B.round_to(x32, fmt), direct)


@pytest.mark.parametrize("fmt", NAMES)
def test_format_constants_match_finfo_and_bit_counts(fmt):
    f = B.get_format(fmt)
    info = ml_dtypes.finfo(f.dtype)
    assert (f.exponent_bits, f.fraction_bits, f.total_bits) == (info.nexp, info.nmant, info.bits)
    assert f.bias == 2 ** (f.exponent_bits - 1) - 1
    assert f.eps == float(info.eps) == 2.0**-f.fraction_bits
    assert f.smallest_normal == float(info.smallest_normal) == 2.0**f.emin
    assert (
        f.smallest_subnormal == float(info.smallest_subnormal) == 2.0 ** (f.emin - f.fraction_bits)
    )
    if f.has_inf:  # IEEE-style: the all-ones exponent is reserved
        assert f.max == (2 - 2.0**-f.fraction_bits) * 2.0**f.bias
    else:  # E4M3 "fn": only the all-ones pattern is NaN
        assert f.max == (2 - 2.0 ** (1 - f.fraction_bits)) * 2.0 ** (f.bias + 1)
    assert f.max == float(info.max)


@pytest.mark.parametrize("fmt", NAMES)
def test_ulp_matches_numpy_spacing(fmt):
    f = B.get_format(fmt)
    rng = np.random.default_rng()
    vals = np.abs(_random_values(fmt, 3000, rng))
    vals = vals[vals < f.max]
    spacing = np.spacing(vals.astype(f.dtype)).astype(np.float64)
    np.testing.assert_array_equal(B.ulp(vals, fmt), spacing)
    assert B.ulp(1.0, fmt) == f.eps
    assert B.ulp(0.0, fmt) == f.smallest_subnormal
    assert math.isnan(B.ulp(math.inf, fmt))


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_bits_roundtrip_every_pattern(fmt):
    f = B.get_format(fmt)
    values = exercises._all_values(fmt)
    rng = np.random.default_rng()
    for code in rng.choice(2**f.total_bits, size=min(300, 2**f.total_bits), replace=False):
        v = values[code]
        pattern = format(int(code), f"0{f.total_bits}b")
        got = B.from_bits(pattern, fmt)
        assert (math.isnan(got) and math.isnan(v)) or got == v
        if not math.isnan(v):
            assert B.bits(v, fmt, sep="") == pattern
            d = B.decode(v, fmt)
            assert d.pattern.replace("|", "") == pattern and (d.value == v)


def test_decode_fields():
    d = B.decode(-2.296875, "bf16")
    assert (d.sign, d.exponent_field, d.exponent, d.kind, d.significand) == (
        1,
        128,
        1,
        "normal",
        "1.0010011",
    )
    assert B.decode(B.get_format("bf16").smallest_subnormal, "bf16").kind == "subnormal"
    assert B.decode(math.inf, "bf16").kind == "inf"
    assert B.decode(math.inf, "fp8_e4m3").kind == "nan"  # E4M3 has no infinity
    assert B.bits(1.0, "fp32") == "0|01111111|00000000000000000000000"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_operands_raise(bad):
    with pytest.raises(ValueError, match="not finite"):
        B.add_trace(bad, 1.0)
    with pytest.raises(ValueError, match="not finite"):
        B.add_trace(1.0, bad, "fp32")


def test_bad_input_messages():
    with pytest.raises(ValueError, match=r"unknown format 'bf8'.*'fp32', 'bf16', 'fp16'"):
        B.add_trace(1.0, 2.0, "bf8")
    with pytest.raises(ValueError, match="unknown format"):
        B.round_to(1.0, "float32")
    with pytest.raises(ValueError, match="unknown format"):
        B.add_trace(1.0, 2.0, a_fmt="int8")
    with pytest.raises(ValueError, match="overflows BF16"):
        B.add_trace(1e39, 1.0, "bf16")
    with pytest.raises(ValueError, match="overflows FP8 E4M3"):
        B.add_trace(500.0, 1.0, "fp8_e4m3")
    with pytest.raises(TypeError, match="real number"):
        B.add_trace("abc", 1.0)
    with pytest.raises(ValueError, match="16-bit pattern"):
        B.from_bits("0101", "bf16")
    with pytest.raises(ValueError, match="unknown kind"):
        B.rounding_errors(10, "sorted")
    with pytest.raises(ValueError, match="positive integer"):
        B.rounding_errors(0)


def test_overflow_and_underflow_traces():
    t = B.add_trace(3e38, 3e38, "bf16")
    assert t.overflow and t.result == math.inf and "overflow" in str(t)
    t = B.add_trace(300.0, 200.0, "fp8_e4m3")
    assert t.overflow and math.isnan(t.result)
    t = B.add_trace(1e-39, -1.1e-39, "bf16")
    assert t.underflow and t.result < 0 and "underflow" in str(t)
    t = B.add_trace(1e30, 1e-30, "fp32")  # exact sum needs ~200 bits
    assert t.result == B.round_to(1e30, "fp32") and t.sticky == 1


def test_bias_experiment():
    rng = np.random.default_rng()
    for fmt in ("bf16", "fp16"):
        biased = B.mean_error(B.rounding_errors(40_000, "carry+residual", fmt, rng))
        assert biased.mean < -0.15 and biased.sem < 0.01
        pos = B.mean_error(B.rounding_errors(40_000, "carry+residual", fmt, rng, sign=1.0))
        assert pos.mean > 0.15
        for kind in ("random", "carry"):
            m = B.mean_error(B.rounding_errors(40_000, kind, fmt, rng))
            assert abs(m.mean) < 6 * m.sem, (kind, fmt, m)
    errs = B.rounding_errors(1000, "random", "bf16", rng)
    assert errs.shape == (1000,) and np.all(np.abs(errs) <= 0.5)
