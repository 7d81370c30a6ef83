"""The numerics contract (kernels/emulate.py) against fp64 attention and brute-force tie counts."""

import math

import pytest
import torch

from kernels.attention.emulator import flash_forward
from kernels.attention.options import KERNEL_STABLE_MODES
from kernels.attention.reference import attention_fp64, relative_error as rel_err
from kernels.numerics.rounding import round_mantissa, round_mantissa_stochastic, round_to_dtype


@pytest.mark.parametrize("numerics", ["fa2", "paper"])
@pytest.mark.parametrize("stable", KERNEL_STABLE_MODES)
@pytest.mark.parametrize("causal", [False, True])
def test_close_to_fp64(numerics, stable, causal):
    q, k, v = (torch.randn(2, 3, 77, 32) for _ in range(3))
    res = flash_forward(q, k, v, causal=causal, numerics=numerics, stable=stable, block_n=16)
    ref = attention_fp64(*(round_to_dtype(t, torch.bfloat16) for t in (q, k, v)), causal=causal)
    bound = 4e-3 if numerics == "fa2" else 2e-2
    assert res.out.dtype == torch.bfloat16
    assert rel_err(res.out, ref) < bound


def test_fp64_is_exact_and_fp32_is_close():
    q, k, v = (torch.randn(1, 2, 50, 16, dtype=torch.float64) for _ in range(3))
    ref = attention_fp64(q, k, v, causal=True)
    assert (
        rel_err(flash_forward(q, k, v, causal=True, low=torch.float64, block_n=7).out, ref) < 1e-13
    )
    out32 = flash_forward(q, k, v, causal=True, low=torch.float32, block_n=7).out
    assert rel_err(out32, attention_fp64(*(t.float() for t in (q, k, v)), causal=True)) < 1e-6


def test_lse_matches_logsumexp():
    q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
    res = flash_forward(q, k, v, low=torch.float32, block_n=8, stable="cross")
    lse = torch.logsumexp((q.double() @ k.double().mT) / 4.0, -1)
    assert torch.allclose(res.lse.double(), lse, atol=1e-5)


def test_cross_tile_ties_detected_and_tile_rule_misses_them():
    n = 32
    scores = 2.0 - 6.0 - torch.rand(4, n)
    scores[:, [3, 20]] = 2.0  # a tie split between tile 0 and tile 1 (block 16)
    scores = round_to_dtype(scores, torch.bfloat16)
    q = torch.eye(n)[:4].view(1, 1, 4, n)  # q_i · k_j = scores[i, j] with k = scores^T (D = n)
    k = torch.zeros(1, 1, n, n)
    k[0, 0, :, :4] = scores.T
    v = torch.randn(1, 1, n, n)
    for stable, expect in [("tile", False), ("cross", True)]:
        res = flash_forward(q, k, v, scale=1.0, stable=stable, block_n=16, beta=2.0)
        assert bool(res.ties.all()) is expect
        p_max = torch.exp(scores.double() - res.row_offset[0, 0].double().unsqueeze(-1)).amax(-1)
        assert bool((p_max < 1).all()) is expect  # the literal rule leaves P̄ = 1 at the tie
    same = flash_forward(q, k, v, scale=1.0, stable="tile", block_n=32)
    assert bool(same.ties.all())  # one tile holding both: the literal rule sees it


def test_tie_flag_equals_brute_force_count():
    n, eps = 48, 1e-3
    scores = (
        torch.randint(-3, 4, (n, n)).float() * 0.5
    )  # many exact ties, positive and negative maxima
    q = torch.eye(n).view(1, 1, n, n)  # q_i · k_j = scores[i, j] with k = scores^T
    k = scores.T.reshape(1, 1, n, n).contiguous()
    v = torch.randn(1, 1, n, n)
    res = flash_forward(q, k, v, scale=1.0, stable="cross", block_n=8, eps=eps)
    brute = ((scores.amax(-1, keepdim=True) - scores) <= eps).sum(-1) > 1
    assert torch.equal(res.ties[0, 0], brute)
    # the offset is the largest rule value over the prefixes of tiles seen so far (m never
    # decreases); the rule gives beta*rm (rm > 0), 0 (rm < 0), or rm (rm == 0: its blind spot)
    want = torch.full((n,), -math.inf)
    for end in range(8, n + 1, 8):
        prefix = scores[:, :end]
        rm = prefix.amax(-1)
        tied = ((rm.unsqueeze(-1) - prefix) <= eps).sum(-1) > 1
        rule = torch.where(tied & (rm > 0), 2 * rm, torch.where(tied & (rm < 0), 0 * rm, rm))
        want = torch.maximum(want, rule)
    assert torch.equal(res.row_offset[0, 0], want)
    assert (res.row_offset[0, 0] >= scores.amax(-1)).all()


def test_cross_rule_survives_a_far_negative_tie_followed_by_a_larger_maximum():
    """A tie at -100 sets m = 0; a later unique maximum at -50 must not give alpha = inf."""
    n = 32
    scores = torch.full((1, n), -300.0)
    scores[0, [1, 2]] = -100.0
    scores[0, 20] = -50.0
    q = torch.eye(n)[:1].view(1, 1, 1, n)
    k = torch.zeros(1, 1, n, n)
    k[0, 0, :, 0] = scores[0]
    v = torch.randn(1, 1, n, n)
    res = flash_forward(q, k, v, scale=1.0, stable="cross", block_n=16)
    assert torch.isfinite(res.out.float()).all()
    assert torch.allclose(
        res.out.float()[0, 0, 0], round_to_dtype(v[0, 0, 20], torch.bfloat16), atol=1e-2
    )


@pytest.mark.parametrize(
    "bad",
    [
        dict(numerics="bf16"),
        dict(stable="yes"),
        dict(stable="cross", beta=1.0),
        dict(eps=-1e-3),
        dict(block_n=0),
    ],
)
def test_bad_arguments_are_named(bad):
    q = torch.randn(1, 1, 8, 16)
    with pytest.raises(ValueError) as err:
        flash_forward(q, q, q, **bad)
    assert list(bad)[-1] in str(err.value)


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="shapes"):
        flash_forward(torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 32), torch.randn(1, 1, 8, 32))


def test_round_mantissa_is_bf16_and_fp16_rounding():
    """7 kept bits = bf16 exactly (every finite and infinite value); 10 bits = fp16 in its normal
    range."""
    x = torch.randn(200_000) * torch.exp(torch.randn(200_000) * 20)
    x = torch.cat([x, torch.tensor([0.0, -0.0, math.inf, -math.inf, 3.3895313892515355e38, 1e-40])])
    assert torch.equal(round_mantissa(x, 7), x.to(torch.bfloat16).float())
    y = torch.randn(200_000)
    y = y[(y.abs() > 6.2e-5) & (y.abs() < 6e4)]
    assert torch.equal(round_mantissa(y, 10), y.half().float())
    assert torch.isnan(round_mantissa(torch.tensor([math.nan]), 3)).all()
    # ties go to even: 1 + 2^-4 sits halfway between 1 and 1 + 2^-3 with 3 bits, and rounds to 1
    assert round_mantissa(torch.tensor([1.0625, 1.1875]), 3).tolist() == [1.0, 1.25]
    with pytest.raises(TypeError, match="fp32"):
        round_mantissa(torch.zeros(2, dtype=torch.float64), 3)


def test_acc_bits_magnifies_only_the_output_rounding():
    q, k, v = (torch.randn(2, 2, 64, 16) for _ in range(3))
    ref = attention_fp64(q, k, v, causal=True)
    base = flash_forward(q, k, v, causal=True, numerics="paper", block_n=32)
    same = flash_forward(q, k, v, causal=True, numerics="paper", block_n=32, acc_bits=7)
    assert torch.equal(base.out, same.out) and torch.equal(base.row_sum, same.row_sum)
    errors = [
        rel_err(
            flash_forward(q, k, v, causal=True, numerics="paper", block_n=32, acc_bits=b).out, ref
        )
        for b in (7, 5, 3)
    ]
    assert errors[0] < errors[1] < errors[2], errors
    narrow = flash_forward(q, k, v, causal=True, numerics="paper", block_n=32, acc_bits=3)
    assert torch.equal(narrow.row_sum, base.row_sum)  # ℓ is not touched
    with pytest.raises(ValueError, match="acc_bits"):
        flash_forward(q, k, v, numerics="fa2", acc_bits=3)
    with pytest.raises(ValueError, match="acc_bits"):
        flash_forward(q, k, v, numerics="paper", acc_bits=9)


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours():
    x = -torch.rand(20_000) * 7 - 0.01
    lo_hi = torch.stack([round_mantissa(x, 3), round_mantissa(x, 3)])
    draws = torch.stack([round_mantissa_stochastic(x, 3) for _ in range(400)])
    ulp = torch.exp2(torch.floor(torch.log2(x.abs())) - 3)
    # every draw is one of the two 3-bit neighbours of x
    assert ((draws - x).abs() < ulp * 1.0001).all()
    assert torch.equal(round_mantissa(draws.flatten(), 3), draws.flatten())
    # nearest-even is biased on this set only by chance; stochastic rounding's mean error is ~0
    mean_err = ((draws - x) / ulp).mean()
    assert abs(float(mean_err)) < 0.01, float(mean_err)
    assert (lo_hi[0] == lo_hi[1]).all()
    specials = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    out = round_mantissa_stochastic(specials, 3)
    assert out[0] == math.inf and out[1] == -math.inf and torch.isnan(out[2]) and out[3] == 0
    with pytest.raises(ValueError, match="acc_rounding"):
        flash_forward(
            x.view(1, 1, -1, 4)[:, :, :8],
            x.view(1, 1, -1, 4)[:, :, :8],
            x.view(1, 1, -1, 4)[:, :, :8],
            numerics="paper",
            acc_rounding="sr",
        )


def test_delta_rowsum_is_each_sources_formula_in_fp64_and_names_what_is_missing():
    """δ from each source against its definition in fp64 on fresh inputs; a source's missing
    operand and an unknown source are named in the error."""
    from kernels.attention.emulator import delta_rowsum

    rows, n, d = (int(x) for x in torch.randint(2, 40, (3,)))
    d_out, out = torch.randn(rows, d, dtype=torch.float64), torch.randn(rows, d).double()
    probs = torch.softmax(torch.randn(rows, n, dtype=torch.float64), -1)
    values = torch.randn(n, d, dtype=torch.float64)
    d_probs = d_out @ values.T
    exact = probs @ values
    want = {
        "o": (d_out * out).sum(-1),
        "o_fp32": (d_out * exact).sum(-1),
        "dp": (d_probs * probs).sum(-1),
    }
    for source, expected in want.items():
        got = delta_rowsum(source, d_out, out=out, out_fp32=exact, d_probs=d_probs, probs=probs)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # rowsum(dP ∘ P) = rowsum(dO ∘ PV): the two sources agree where O is exact
    torch.testing.assert_close(want["dp"], want["o_fp32"], rtol=1e-10, atol=1e-10)
    hilo = delta_rowsum("o_hilo", d_out, out_fp32=exact)
    hi = round_to_dtype(exact, torch.bfloat16)
    lo = round_to_dtype(exact - hi, torch.bfloat16)
    torch.testing.assert_close(hilo, (d_out * (hi + lo)).sum(-1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="'dp' needs d_probs, probs"):
        delta_rowsum("dp", d_out, out=out)
    with pytest.raises(ValueError, match="unknown δ source 'o_fp8'"):
        delta_rowsum("o_fp8", d_out, out=out)
