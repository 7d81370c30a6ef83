"""The candidate fixes of the bias chapters: options, emulator, kernel, and the lab's measures.

Fresh random inputs each run; fp64 references; kernel outputs start as NaN (conftest)."""

import math

import pytest
import torch
from test_flash_fwd import assert_close_to_emulator

from kernels import rounding_lab as lab
from kernels.attention import AttentionOptions, emulator
from kernels.attention.flash_fwd import flash_forward
from kernels.attention.reference import attention_fp64
from kernels.env import native_bf16
from kernels.rounding_lab import fixes

DEVICE = "cuda" if native_bf16() else "cpu"


def tied_inputs(n=96, d=32, rm=3.0, ties=(5, 70)):
    """Random q, k, v with query row 0's scores tied at rm on the keys ``ties``."""
    q, k, v = (torch.randn(1, 2, n, d) for _ in range(3))
    q[..., 0, :] = 0.0
    q[..., 0, 0] = 1.0
    for t in ties:
        k[..., t, :] = 0.0
        k[..., t, 0] = rm * math.sqrt(d)
    return [t.bfloat16().to(DEVICE) for t in (q, k, v)]


@pytest.mark.parametrize(
    "fix",
    [
        dict(stable="cross", offset_cap=1.5),
        dict(stable="tile", offset_cap=0.5),
        dict(stable="cross", ell_rounded=True),
        dict(ell_rounded=True),
    ],
)
def test_kernel_follows_the_emulator_with_each_fix(fix):
    q, k, v = tied_inputs()
    out, _, offset = flash_forward(q, k, v, block_m=32, block_n=32, return_offset=True, **fix)
    emu = emulator.flash_forward(q, k, v, block_n=32, **fix)
    assert torch.isfinite(out.float()).all()
    # the same offsets m (to fp32 rounding: tensor cores sum Q·K in another order than torch)
    assert torch.allclose(offset, emu.row_offset.to(offset.dtype), rtol=1e-6, atol=1e-6)
    assert_close_to_emulator(out, emu.out, min_identical=0.98, paper=False)


def test_cap_keeps_the_offset_within_cap_of_the_row_max():
    q, k, v = tied_inputs(rm=3.0)
    capped = emulator.flash_forward(q, k, v, stable="cross", offset_cap=1.5)
    plain = emulator.flash_forward(q, k, v, stable="cross")
    row0 = (0, 0, 0)
    assert float(plain.row_offset[row0]) == pytest.approx(6.0, rel=1e-2)  # β·r_m, β = 2
    assert float(capped.row_offset[row0]) == pytest.approx(4.5, rel=1e-2)  # r_m + cap


def test_cap_prevents_the_underflow_of_ell():
    """Two tied maxima at r_m = 120: with β = 2 the tied P̄ = e^-120 underflows and O is NaN;
    capped at 20 the row sum stays normal and O is close to the fp64 answer."""
    q, k, v = tied_inputs(rm=120.0)
    plain = emulator.flash_forward(q, k, v, stable="cross")
    capped = emulator.flash_forward(q, k, v, stable="cross", offset_cap=20.0)
    assert not torch.isfinite(plain.out[0, :, 0].float()).all()
    ref = attention_fp64(q, k, v)
    assert torch.isfinite(capped.out.float()).all()
    rel = (capped.out.double() - ref).abs().max() / ref.abs().max()
    assert rel < 2e-2, rel


def test_paper_clamp_turns_nan_into_zero():
    q, k, v = tied_inputs(rm=120.0)
    plain = emulator.flash_forward(q, k, v, numerics="paper", stable="cross")
    clamped = emulator.flash_forward(q, k, v, numerics="paper", stable="cross", ell_clamp=1e-10)
    assert torch.isnan(plain.out[0, :, 0].float()).any()
    assert torch.isfinite(clamped.out.float()).all()
    assert (clamped.out[0, :, 0].float() == 0).all(), "ℓ = 0 clamped: Ō/1e-10 = 0, not O"


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(offset_cap=0.0), "offset_cap"),
        (dict(offset_cap=float("inf")), "offset_cap"),
        (dict(numerics="paper", ell_rounded=True), "FA2"),
        (dict(ell_clamp=1e-10), "paper"),
        (dict(numerics="paper", ell_clamp=-1.0), "ell_clamp"),
    ],
)
def test_bad_fix_options_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        AttentionOptions(**bad)


def test_kernel_refuses_the_emulator_only_clamp():
    q, k, v = tied_inputs()
    with pytest.raises(ValueError, match="only in the emulator"):
        flash_forward(q, k, v, numerics="paper", ell_clamp=1e-10)


def test_delta_sources_match_a_direct_fp64_computation():
    case = lab.Case(n_keys=128, ties=2, gap=15.6, batch=2, head_dim=16, block_n=32)
    built = lab.build(case, seed=int(torch.randint(0, 1000, ())))
    d_out = fixes.upstream_gradient(built)
    res = emulator.flash_forward(built.q, built.k, built.v, scale=1.0, block_n=32)
    exact = (d_out * lab.reference(built)).sum(-1)
    for source in fixes.FIXED_DELTA_SOURCES:
        delta = fixes.delta_from(source, built, res, d_out).double()
        assert ((delta - exact).abs() <= 1e-5 * exact.abs().max()).all(), source
    from_o = fixes.delta_from("o", built, res, d_out).double()
    want = (d_out * res.out.double()).sum(-1)
    assert torch.allclose(from_o, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="unknown δ source"):
        fixes.delta_from("o_fp16", built, res, d_out)


def test_the_delta_fixes_remove_delta_bias_and_keep_o_ideal():
    case = lab.Case(n_keys=256, ties=2, gap=15.6, batch=8, head_dim=32, block_n=64)
    recs = {r["fix"]: r for r in fixes.measure_fixes({"c": case}, progress=False)}
    none = recs["none"]
    assert none["out"]["same_as_ideal"] > 0.99 and abs(none["delta"]["bias"]) > 0.05
    for key in ("delta_fp32", "delta_hilo", "delta_dp"):
        assert recs[key]["out"] == none["out"]
        assert abs(recs[key]["delta"]["bias"]) < 0.01, key
    assert recs["beta_cross"]["out"]["same_as_ideal"] < 0.95  # the rule moves O off the ideal
