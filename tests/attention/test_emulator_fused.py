"""The fused elementwise kernels of the paper's path against the emulator's op-by-op formulas.

On a CPU the kernels run in the Triton interpreter (NumPy's exp); on a GPU the same checks run
natively (``python -m kernels.gpt2.fast_step_check`` adds whole training steps)."""

import math

import pytest
import torch

from kernels.attention import emulator_fused
from kernels.attention.emulator import paper_scores
from kernels.numerics.rounding import round_to_dtype

BF16 = torch.bfloat16


def inputs(gen, b=2, h=3, n=48, d=16):
    q, k, v = (round_to_dtype(torch.randn(b, h, n, d, generator=gen) * 2, BF16) for _ in range(3))
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_scores_same_bits(causal):
    gen = torch.Generator().manual_seed(torch.seed())
    q, k, _ = inputs(gen)
    expected = paper_scores(q, k, 0.25, BF16, causal)
    assert torch.equal(emulator_fused.scores(q, k, 0.25, causal), expected)


def test_scores_of_a_later_key_tile_mask_by_column():
    gen = torch.Generator().manual_seed(torch.seed())
    q, k, _ = inputs(gen)
    tile = emulator_fused.scores(q, k[..., 16:32, :], 0.25, True, col0=16)
    full = paper_scores(q, k, 0.25, BF16, True)[..., 16:32]
    assert torch.equal(tile, full)


def test_p_bar_and_probs_match_the_formulas():
    gen = torch.Generator().manual_seed(torch.seed())
    q, k, _ = inputs(gen)
    s = paper_scores(q, k, 0.25, BF16, True)
    m = s.amax(-1)
    expected = round_to_dtype(torch.exp(round_to_dtype(s - m.unsqueeze(-1), BF16)), BF16)
    got = emulator_fused.p_bar(s, m)
    # the interpreter's exp is NumPy's: the rare fp32 exp that lands on a bf16 rounding
    # boundary may round the other way; on a GPU (libdevice, as torch) the check is exact
    same = (got == expected).float().mean().item()
    assert same > 0.999 and torch.allclose(got, expected, rtol=2**-7, atol=0)
    lse = m + torch.log(torch.exp(s - m.unsqueeze(-1)).sum(-1))
    p = emulator_fused.probs(q, k, lse, 0.25, True)
    assert torch.allclose(p, torch.exp(s - lse.unsqueeze(-1)), rtol=1e-6, atol=0)
    assert torch.allclose(p.sum(-1), torch.ones(p.shape[:-1]), rtol=1e-5)


def test_d_scores_same_bits():
    gen = torch.Generator().manual_seed(torch.seed())
    p = torch.rand(2, 3, 32, 32, generator=gen)
    dp = torch.randn(2, 3, 32, 32, generator=gen)
    delta = torch.randn(2, 3, 32, generator=gen)
    expected = p * (dp - delta.unsqueeze(-1))
    assert torch.equal(emulator_fused.d_scores(dp.clone(), p, delta), expected)


def test_fused_kernels_refuse_other_dtypes():
    x = torch.zeros(2, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="fp32"):
        emulator_fused.p_bar(x, x[..., 0])


def test_not_used_on_cpu():
    assert not emulator_fused.usable(torch.zeros(1), BF16)
    assert math.isfinite(emulator_fused.BLOCK)
