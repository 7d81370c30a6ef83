"""Plain PyTorch attention to check the kernels against.

* :func:`attention_fp64` is the golden output: everything in fp64, the softmax written out.
* :func:`standard_attention` is "standard" attention in the inputs' dtype, the way torch's
  math path does it: S = QKᵀ·scale materialised in the input dtype, softmax, P V.
* :func:`relative_error` compares in fp64.

It imports nothing it is used to check (not the emulator, not the kernels).

All take (..., seq, head_dim) tensors; ``causal`` masks key j > query i (top-left aligned,
like ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``).
"""

from __future__ import annotations

import math

import torch


def default_scale(head_dim: int, scale=None) -> float:
    """The softmax scale of every implementation: 1/√head_dim unless ``scale`` is given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _scale(q, scale):
    return default_scale(q.shape[-1], scale)


def _causal_mask(n_q, n_k, device):
    rows = torch.arange(n_q, device=device).unsqueeze(-1)
    cols = torch.arange(n_k, device=device)
    return cols > rows  # True where a key is hidden from a query


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


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in fp64."""
    out, ref = out.to(torch.float64), ref.to(torch.float64)
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
