"""Chapter 3's step-by-step attention (kernels/tiling.py) against fp64 attention."""

import kernels  # noqa: F401,I001  first: without a GPU it turns on the interpreter before triton loads

import math

import pytest
import torch

from kernels.attention import tiling
from kernels.attention.reference import attention_fp64, standard_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n, block_m, block_n", [(100, 32, 16), (64, 64, 64), (37, 16, 8)])
def test_tiled_versions_equal_naive(causal, n, block_m, block_n):
    q, k, v = (torch.randn(2, 3, n, 16, dtype=torch.float64) * 2 for _ in range(3))
    want = attention_fp64(q, k, v, causal)
    two = tiling.two_pass_attention(q, k, v, block_n=block_n, causal=causal)
    out, lse = tiling.online_attention(q, k, v, block_m=block_m, block_n=block_n, causal=causal)
    assert (two - want).abs().max().item() < 1e-12
    assert (out - want).abs().max().item() < 1e-12
    scores = (q @ k.transpose(-1, -2)) / 4.0
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    assert (lse - torch.logsumexp(scores, -1)).abs().max().item() < 1e-12


def test_trace_records_running_max_and_sum():
    q, k, v = (torch.randn(1, 1, 96, 8, dtype=torch.float64) for _ in range(3))
    row = 50
    _, lse, trace = tiling.online_attention(q, k, v, block_m=32, block_n=32, trace_row=row)
    assert [t[0] for t in trace] == [0, 1, 2]
    ms = [t[1] for t in trace]
    assert all(a <= b for a, b in zip(ms, ms[1:]))  # the running max never decreases
    _, m_last, ell_last = trace[-1]
    assert abs(m_last + math.log(ell_last) - lse[0, 0, row].item()) < 1e-12


def test_peak_live_bytes_sees_the_score_matrix():
    n = 1024
    q, k, v = (torch.randn(1, 1, n, 64) for _ in range(3))
    naive = tiling.peak_live_bytes(standard_attention, q, k, v)
    tiled = tiling.peak_live_bytes(tiling.online_attention, q, k, v, block_m=64, block_n=64)
    assert naive >= n * n * 4  # at least one fp32 N x N matrix
    assert tiled < n * 64 * 4 * 4  # the output, L and a few 64 x 64 tiles: O(N)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        tiling.online_attention(torch.zeros(4, 8), torch.zeros(4, 4), torch.zeros(4, 4))
    with pytest.raises(ValueError):
        tiling.two_pass_attention(
            torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(4, 8), block_n=0
        )
