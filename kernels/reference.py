"""Plain PyTorch attention to check the kernels against.

* :func:`attention_fp64` is the golden output: everything in fp64, the softmax written out.
* :func:`standard_attention` is "standard" attention in the inputs' dtype, the way torch's
  math path does it: S = QKᵀ·scale materialised in the input dtype, softmax, P V.
* :func:`emulated_fa2` and :func:`emulated_paper` expose the two numerics modes of the
  emulator (:mod:`kernels.emulate`, the numerics contract of the Triton kernels).

All take (..., seq, head_dim) tensors; ``causal`` masks key j > query i (top-left aligned,
like ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``).
"""
from __future__ import annotations

import math

import torch

from . import emulate


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def _causal_mask(n_q, n_k, device):
    rows = torch.arange(n_q, device=device).unsqueeze(-1)
    cols = torch.arange(n_k, device=device)
    return cols > rows          # True where a key is hidden from a query


def attention_fp64(q, k, v, causal=False, scale=None):
    """softmax(Q Kᵀ·scale) V computed in fp64 (differentiable); returns fp64."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * _scale(q, scale)
    if causal:
        scores = scores.masked_fill(_causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def lse_fp64(q, k, causal=False, scale=None):
    """log Σ_j exp(S_ij), the statistic L the forward kernel stores, in fp64."""
    q, k = q.to(torch.float64), k.to(torch.float64)
    scores = (q @ k.transpose(-1, -2)) * _scale(q, scale)
    if causal:
        scores = scores.masked_fill(_causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return torch.logsumexp(scores, dim=-1)


def standard_attention(q, k, v, causal=False, scale=None):
    """Attention in the inputs' dtype with the N×N score matrix materialised (torch's math path)."""
    scores = (q @ k.transpose(-1, -2)) * _scale(q, scale)
    if causal:
        scores = scores.masked_fill(_causal_mask(q.shape[-2], k.shape[-2], q.device), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def emulated_fa2(q, k, v, causal=False, scale=None, block_n=64, stable="off", beta=2.0,
                 eps=1e-3, low=None):
    """The emulator in FlashAttention-2 numerics (fp32 accumulation); returns a ForwardResult."""
    low = q.dtype if low is None else low
    return emulate.flash_forward(q, k, v, causal=causal, scale=scale, numerics="fa2", low=low,
                                 block_n=block_n, stable=stable, beta=beta, eps=eps)


def emulated_paper(q, k, v, causal=False, scale=None, block_n=64, stable="off", beta=2.0,
                   eps=1e-3, low=None):
    """The emulator in the seed paper's all-bf16 numerics; returns a ForwardResult."""
    low = q.dtype if low is None else low
    return emulate.flash_forward(q, k, v, causal=causal, scale=scale, numerics="paper", low=low,
                                 block_n=block_n, stable=stable, beta=beta, eps=eps)


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64."""
    out, ref = out.to(torch.float64), ref.to(torch.float64)
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def ulp_distance(a, b) -> torch.Tensor:
    """How many representable numbers of the (common, low-precision) dtype lie between a and b.

    Works on the integer bit patterns, so it is exact: 0 means bit-identical, 1 means
    neighbours. Both must be bf16, fp16 or fp32 of the same dtype; NaNs are not allowed.
    """
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must share a dtype, got {a.dtype} and {b.dtype}")
    ints = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}
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
