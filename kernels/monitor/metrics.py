"""The monitor's numbers as pure functions on tensors. This is their one home: the GPT-2
trainer's :mod:`kernels.gpt2.diagnostics` imports them from here.

* ``spectral_norm``, ``wq_head_norms``  ‖W_Q‖₂ of each head's query projection
* ``finite_spectral_norm``  ‖W_Q‖₂, or NaN for weights holding NaN or inf (or no data)
* ``causal_scores``         S = QKᵀ·scale, causal mask; fp32, or formed in bf16 as the
                            paper's code does
* ``rows_with_tied_max``    rows with ≥ 2 entries exactly equal to the row maximum
* ``rows_rounding_to_one``  rows with ≥ 2 entries whose P̄ = exp(S − rowmax) rounds to
                            exactly 1.0 in bf16 (the FA2 rule, S in fp32)
* ``max_logit``             the largest finite |S|
* ``delta_error``           δ_lp − δ_hp per row, δ = rowsum(dO ∘ O)
* ``head_readings``         the tie shares and the largest logit of each head of a layer
                            (NaN for a head whose scores hold NaN or inf)
* ``exact_output``          O_hp = softmax(S)V in fp32
"""

from __future__ import annotations

import math

import torch

from ..numerics.rounding import round_to_dtype


def spectral_norm(matrix: torch.Tensor) -> float:
    """Largest singular value ‖A‖₂."""
    return float(torch.linalg.matrix_norm(matrix.detach().double(), ord=2))


def finite_spectral_norm(matrix: torch.Tensor) -> float:
    """‖A‖₂, or NaN where it cannot be read: a matrix holding NaN or inf (whose SVD would
    raise) or one without data (a meta tensor)."""
    try:
        if not bool(torch.isfinite(matrix.detach()).all()):
            return math.nan
        return spectral_norm(matrix)
    except (RuntimeError, NotImplementedError, ValueError):
        return math.nan


def wq_head_norms(c_attn_weight: torch.Tensor, n_head: int) -> list[float]:
    """‖W_Q‖₂ of each head; ``c_attn_weight`` is the (3C, C) weight making [Q; K; V]."""
    width = c_attn_weight.shape[1]
    if c_attn_weight.shape[0] != 3 * width or width % n_head:
        raise ValueError(
            f"expected a (3C, C) weight with C divisible by {n_head}, "
            f"got {tuple(c_attn_weight.shape)}"
        )
    hd = width // n_head
    return [spectral_norm(c_attn_weight[h * hd : (h + 1) * hd]) for h in range(n_head)]


def causal_scores(q: torch.Tensor, k: torch.Tensor, low=None, scale=None) -> torch.Tensor:
    """S = QKᵀ·scale with the causal mask (−inf above the diagonal); ``scale`` defaults
    to 1/√d. fp32, or formed as the paper's bf16 code does (rnd(rnd(QKᵀ)·scale)) when
    ``low`` is given."""
    q, k = q.float(), k.float()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if low is None:
        s = q @ k.transpose(-1, -2) * scale
    else:
        s = round_to_dtype(round_to_dtype(q @ k.transpose(-1, -2), low) * scale, low)
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, -math.inf)


def rows_rounding_to_one(scores: torch.Tensor, low=torch.bfloat16) -> int:
    """Rows with ≥ 2 entries whose P̄ = exp(S − rowmax) is exactly 1.0 after rounding
    to ``low``."""
    p_bar = torch.exp(scores - scores.amax(-1, keepdim=True))
    ones = (round_to_dtype(p_bar, low) == 1.0).sum(-1)
    return int((ones >= 2).sum())


def rows_with_tied_max(scores: torch.Tensor) -> int:
    """Rows with ≥ 2 entries exactly equal to the row maximum."""
    ties = (scores == scores.amax(-1, keepdim=True)).sum(-1)
    return int((ties >= 2).sum())


def max_logit(scores: torch.Tensor) -> float:
    """Largest finite |S| (the masked −inf entries are ignored)."""
    finite = scores[torch.isfinite(scores)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def delta_error(d_out: torch.Tensor, out_low: torch.Tensor, out_high: torch.Tensor) -> torch.Tensor:
    """(δ_lp − δ_hp) per row, δ = rowsum(dO ∘ O). Shapes (..., N, D) → (..., N)."""
    d_out = d_out.float()
    return (d_out * (out_low.float() - out_high.float())).sum(-1)


def heads_not_finite(scores: torch.Tensor) -> list[bool]:
    """Per head of causal scores (B, H, N, N): whether any score the causal mask shows is NaN
    or infinite (the masked −inf entries above the diagonal do not count)."""
    n = scores.shape[-1]
    shown = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
    bad = ~torch.isfinite(scores) & shown
    return [bool(b) for b in bad.any(-1).any(-1).any(0)]


@torch.no_grad()
def head_readings(q: torch.Tensor, k: torch.Tensor, scale=None) -> dict[str, list[float]]:
    """Per head of one layer (q, k of shape (B, H, N, D)): the share of rows (0 to 1)
    with ≥ 2 tied maxima of a bf16 S (``ties_bf16``), the share with ≥ 2 P̄ rounding to
    1.0 with S in fp32 (``p1_fa2``), and the largest finite |S| in fp32
    (``max_logit``). A head whose scores hold NaN or inf reads NaN for all three: its tie
    count and its largest finite logit would look healthy."""
    s32 = causal_scores(q, k, scale=scale)
    s_low = causal_scores(q, k, low=torch.bfloat16, scale=scale)
    rows = s32.shape[0] * s32.shape[2]  # sequences × queries, per head
    bad = heads_not_finite(s32)
    heads = range(s32.shape[1])

    def per_head(read):
        return [math.nan if bad[h] else read(h) for h in heads]

    return {
        "ties_bf16": per_head(lambda h: rows_with_tied_max(s_low[:, h]) / rows),
        "p1_fa2": per_head(lambda h: rows_rounding_to_one(s32[:, h]) / rows),
        "max_logit": per_head(lambda h: max_logit(s32[:, h])),
    }


def exact_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale=None) -> torch.Tensor:
    """O_hp = softmax(S)V in fp32 from the same q, k, v (causal), shape (B, H, N, D)."""
    return torch.softmax(causal_scores(q, k, scale=scale), dim=-1) @ v.float()


__all__ = [
    "spectral_norm",
    "finite_spectral_norm",
    "wq_head_norms",
    "causal_scores",
    "rows_rounding_to_one",
    "rows_with_tied_max",
    "max_logit",
    "delta_error",
    "head_readings",
    "heads_not_finite",
    "exact_output",
]
