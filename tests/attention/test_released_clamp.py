"""The paper's released fix, clamp included, against a transcription of its arithmetic.

The released PyTorch attention holds every tensor in bf16 and lets each torch op round its
result. Per key tile it takes the tile's row maximum, applies Algorithm 3 to that tile alone
(near-maxima within 1e-3: m → 2m if m > 0, m → 0 if m < 0), never lowers the running maximum,
clamps the tile's row sum at 1e-10 from below *before* it joins the running sum, and forms the
log-sum-exp of the backward pass from those clamped sums. ``released_forward`` below is that
arithmetic written out with bf16 torch ops (not the released code), and the emulator with
``ell_clamp_at="tiles"`` must give the same bits.

Inputs sit on coarse grids so that every fp32 sum inside a matmul or a row sum is exact: the
two implementations may add in different orders, and exact sums make the order irrelevant.
(One quirk of the released code is left out on purpose: there a tile whose keys are all masked
counts as a tie of its masked values and can move m to 0. The GPT-2 runs use one tile per row.)
"""

import math

import pytest
import torch

from kernels.attention import emulator
from kernels.numerics.rounding import round_to_dtype

BF16 = torch.bfloat16


def released_forward(q, k, v, block, *, beta=2.0, eps=1e-3, clamp=1e-10, causal=False):
    """O, row sums, row maxima and log-sum-exp as the released code computes them (all bf16)."""
    q, k, v = (t.to(BF16) for t in (q, k, v))
    n, scale = q.shape[-2], q.shape[-1] ** -0.5
    lowest = -torch.finfo(BF16).max
    out = torch.zeros_like(q)
    row_sum = torch.zeros((*q.shape[:-1], 1), dtype=BF16)
    row_max = torch.full((*q.shape[:-1], 1), lowest, dtype=BF16)
    rows = torch.arange(n).unsqueeze(-1)
    for start in range(0, k.shape[-2], block):
        k_tile, v_tile = k[..., start : start + block, :], v[..., start : start + block, :]
        scores = (q @ k_tile.transpose(-1, -2)) * scale
        if causal:
            cols = torch.arange(start, start + k_tile.shape[-2])
            scores = scores.masked_fill(cols > rows, lowest)
        tile_max = scores.amax(-1, keepdim=True)
        tied = (scores >= tile_max - eps).sum(-1, keepdim=True) > 1
        tile_max = torch.where(tied & (tile_max > 0), beta * tile_max, tile_max)
        tile_max = torch.where(tied & (tile_max < 0), torch.zeros_like(tile_max), tile_max)
        new_max = torch.maximum(tile_max, row_max)
        p_bar = torch.exp(scores - new_max)
        tile_sum = p_bar.sum(-1, keepdim=True).clamp(min=clamp)
        alpha = torch.exp(row_max - new_max)
        row_sum = alpha * row_sum + tile_sum
        out = out * alpha + p_bar @ v_tile
        row_max = new_max
    out = out / row_sum
    lse = row_sum.log() + row_max
    return out, row_sum.squeeze(-1), row_max.squeeze(-1), lse.squeeze(-1)


def emulated(q, k, v, block, *, at="tiles", causal=False):
    return emulator.flash_forward(
        q,
        k,
        v,
        numerics="paper",
        stable="tile",
        beta=2.0,
        eps=1e-3,
        ell_clamp=1e-10,
        ell_clamp_at=at,
        block_n=block,
        causal=causal,
    )


def grid(shape, values, gen):
    """Random entries drawn from a short list of values (few mantissa bits: exact sums)."""
    values = torch.tensor(values, dtype=torch.float32)
    return values[torch.randint(0, len(values), shape, generator=gen)]


def assert_same_as_released(res, ref):
    out, row_sum, row_max, lse = ref
    assert torch.equal(res.out, out), "O differs from the released arithmetic"
    assert torch.equal(res.row_sum.to(BF16), row_sum), "the clamped row sums differ"
    assert torch.equal(res.row_offset.to(BF16), row_max), "the offsets m differ"
    # the emulator keeps L in fp32; rounded as the released code rounds it, the bits agree
    lse_bf16 = round_to_dtype(round_to_dtype(torch.log(res.row_sum), BF16) + res.row_offset, BF16)
    assert torch.equal(lse_bf16.to(BF16), lse), "L is not formed from the clamped sums"


def test_random_rows_several_tiles_match_released():
    gen = torch.Generator().manual_seed(torch.seed())
    # D = 16: scale 1/4 is exact; scores within a few units: every sum stays exact
    q = grid((2, 3, 48, 16), [-0.5, -0.25, 0.0, 0.25, 0.5], gen)
    k = grid((2, 3, 96, 16), [-1.0, -0.5, 0.0, 0.5, 1.0], gen)
    v = grid((2, 3, 96, 16), [-1.0, -0.5, 0.0, 0.5, 1.0], gen)
    ref = released_forward(q, k, v, 32)
    res = emulated(q, k, v, 32)
    assert_same_as_released(res, ref)
    assert res.ties.any(), "the example should contain tied maxima for the rule to act on"


@pytest.mark.parametrize("tied_max", [10.0, 24.0, 26.0, 40.0])
def test_large_tied_maximum_clamped_as_released(tied_max):
    """Two keys tie at a large score: m = 2·max, the tied P̄ = e^(−max) is tiny, and once
    their sum falls under 1e-10 the clamp takes over and O shrinks toward 0."""
    gen = torch.Generator().manual_seed(torch.seed())
    n, d = 64, 16
    q = torch.zeros(1, 1, n, d)
    q[..., 0] = 4.0  # score of key j = k[j, 0] (scale 1/4)
    k = torch.zeros(1, 1, n, d)
    k[..., 0] = -4.0 + grid((n,), [0.0, 0.5, 1.0], gen)  # the rest: scores −4 … −3
    k[..., 3, 0] = k[..., 7, 0] = tied_max  # two tied maxima from row 7 on
    v = grid((1, 1, n, d), [0.5, 1.0], gen)  # all V positive: O ≈ mean of the tied V
    ref = released_forward(q, k, v, 512, causal=True)
    res = emulated(q, k, v, 512, causal=True)
    assert_same_as_released(res, ref)
    exact = (
        torch.softmax(q @ k.transpose(-1, -2) / 4 + torch.full((n, n), -math.inf).triu(1), -1) @ v
    )
    shrink = (res.out[..., 7:, :].float() / exact[..., 7:, :]).mean().item()
    # O = (tied sum · mean tied V) / max(tied sum, 1e-10): shrunk by tied sum / 1e-10 once
    # the sum of the two tied P̄ = e^(−max) falls under the clamp
    tied_sum = 2 * math.exp(-tied_max)
    assert shrink == pytest.approx(min(1.0, tied_sum / 1e-10), rel=0.03, abs=1e-3)


def test_final_only_clamp_disagrees_with_its_log_sum_exp():
    """The book's earlier variant clamped only the final denominator: where the tied sum
    underflows, its L comes from the unclamped ℓ (−inf when ℓ = 0), so the backward pass's
    P = exp(S − L) is not the P that made O."""
    q = torch.zeros(1, 1, 8, 16)
    q[..., 0] = 4.0
    k = torch.zeros(1, 1, 8, 16)
    k[..., 0] = -4.0
    k[..., 1, 0] = k[..., 2, 0] = 60.0  # e^−60 · 2 ≈ 1.8e-26 ≪ 1e-10
    v = torch.ones(1, 1, 8, 16)
    tiles = emulated(q, k, v, 512, at="tiles", causal=True)
    final = emulated(q, k, v, 512, at="out", causal=True)
    assert torch.equal(tiles.out, final.out)  # the same O either way
    assert (tiles.row_sum[..., 2:] == round_to_dtype(torch.tensor(1e-10), BF16)).all()
    assert (final.lse[..., 2:] < tiles.lse[..., 2:] - 20).all()


def test_clamp_at_is_checked():
    q = k = v = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="ell_clamp_at"):
        emulated(q, k, v, 512, at="everywhere")
