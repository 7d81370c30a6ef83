"""What the GPT-2 chapter watches while it trains (the paper's Figs. 3-5, 11 and 13).

Pure functions on tensors (each tested on inputs with a known answer; those the
attention monitor shares live in :mod:`kernels.monitor.metrics`) plus
:class:`AttentionProbe`, which an attention layer fills on monitoring steps:

* ‖W_Q‖₂ per layer and head (spectral norm of each head's query projection; Figs. 3, 11)
* the largest attention logit per layer (logit growth: the *other* way small models fail)
* rows with repeated maxima (App. E.1), counted two ways:
    - FA2 rule: S in fp32, ≥ 2 entries whose P̄ = exp(S − rowmax) rounds to exactly 1.0 in bf16
    - paper rule: S formed in bf16 as the paper's code does, ≥ 2 entries exactly equal to the max
* a shadow high-precision pass: Σ_T (δ_lp − δ_hp)[T] with δ = rowsum(dO ∘ O), O_lp the output the
  layer really produced and O_hp = softmax(S)V in fp32 from the same inputs (Fig. 5a)
* how alike the rank-1 terms (PK)[T]ᵀ X[T] of Eq. (2) are across tokens and across steps (Fig. 4)

The probe is called inside the model's forward pass, under bf16 autocast; it switches autocast
off for its own arithmetic, so its fp32 products (QKᵀ for the FA2 count and the largest logit,
PV for O_hp) are fp32 products. (Runs stored before 2026-11-25 were probed with autocast on:
their O_hp was formed in bf16, which blurs δ_hp; chapter 7 says which runs are which.)
"""

from __future__ import annotations

import numpy as np
import torch

# The pure functions of the monitor live once, in kernels.monitor.metrics; the trainer's
# diagnostics are computed by that code (re-exported here for the chapter and the tests;
# ``name as name`` marks the two this module does not use itself).
from ..monitor import metrics as _metrics
from ..monitor.metrics import (
    causal_scores,
    delta_error,
    max_logit,
    rows_rounding_to_one,
    rows_with_tied_max,
    spectral_norm as spectral_norm,
    wq_head_norms as wq_head_norms,
)


def pairwise_rank1_cosine(u: torch.Tensor, x: torch.Tensor) -> float:
    """Mean cosine similarity of the rank-1 matrices u[T]ᵀx[T] over all pairs T ≠ T'.

    For outer products, ⟨aᵀb, cᵀd⟩_F = (a·c)(b·d), so cos(u_iᵀx_i, u_jᵀx_j) =
    cos(u_i,u_j)·cos(x_i,x_j).
    """
    if u.shape[0] != x.shape[0] or u.shape[0] < 2:
        raise ValueError(f"need ≥ 2 tokens with matching counts, got {u.shape[0]} and {x.shape[0]}")
    un = torch.nn.functional.normalize(u.double(), dim=-1)
    xn = torch.nn.functional.normalize(x.double(), dim=-1)
    sim = (un @ un.T) * (xn @ xn.T)
    n = sim.shape[0]
    return float((sim.sum() - sim.diagonal().sum()) / (n * (n - 1)))


def matrix_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two matrices as vectors (Frobenius inner product)."""
    a, b = a.double().flatten(), b.double().flatten()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else 0.0


def find_explosion(steps, losses, rise: float = 1.0, smooth: int = 20):
    """First step where the smoothed loss rises ``rise`` nats above its running minimum and never
    comes back within ``rise / 2`` of it. Returns ``None`` if the run did not explode.
    A NaN loss counts as an explosion at the step it appears."""
    steps, losses = np.asarray(steps), np.asarray(losses, dtype=float)
    if len(losses) == 0:
        return None
    bad = ~np.isfinite(losses)
    if bad.any():
        first_bad = int(np.argmax(bad))
        losses = losses[:first_bad]
        if len(losses) == 0:
            return int(steps[first_bad])
    width = min(smooth, len(losses))
    sm = np.convolve(losses, np.ones(width) / width, mode="valid")
    offset = (width - 1) // 2  # report the centre of the smoothing window
    run_min = np.minimum.accumulate(sm)
    above = sm > run_min + rise
    for i in np.flatnonzero(above):
        # never recovers: from i on, stays above the minimum reached by i plus rise/2
        if np.all(sm[i:] > run_min[i] + rise / 2):
            return int(steps[i + offset])
    if bad.any():
        return int(steps[first_bad])
    return None


class AttentionProbe:
    """Collects the per-layer diagnostics of one attention layer on a monitoring step."""

    def __init__(self):
        self.active = False
        self.stats: dict = {}
        self.prev_rank1 = None  # mean rank-1 matrix of the previous monitoring step

    @torch.no_grad()
    def observe(self, x, q, k, v, out, wq_norms):
        """Forward-side statistics. x (B, N, C) input of the layer; q, k, v, out (B, H, N, D)."""
        with torch.autocast(device_type=q.device.type, enabled=False):  # fp32 means fp32
            self._observe(x, q, k, v, out, wq_norms)

    def _observe(self, x, q, k, v, out, wq_norms):
        s32 = causal_scores(q, k)
        s_low = causal_scores(q, k, low=torch.bfloat16)
        rows = s32.shape[0] * s32.shape[1] * s32.shape[2]
        probs = torch.softmax(s32, dim=-1)
        out_high = probs @ v.float()
        head = int(np.argmax(wq_norms))
        pk = probs[0, head] @ k[0, head].float()  # (PK)[T] of the largest-‖W_Q‖ head
        xs = x[0].float()
        tokens = torch.arange(pk.shape[0] // 2, pk.shape[0], device=pk.device)  # rows with context
        rank1 = pk[tokens].T @ xs[tokens] / len(tokens)  # mean of (PK)[T]ᵀ X[T]
        step_cos = None if self.prev_rank1 is None else matrix_cosine(rank1, self.prev_rank1)
        self.prev_rank1 = rank1
        self.stats = {
            "max_logit": max_logit(s32),
            "mean_row_max": float(s32.amax(-1).mean()),
            "rows": rows,
            "rows_p1_fa2": rows_rounding_to_one(s32),
            "rows_tied_bf16": rows_with_tied_max(s_low),
            "rank1_head": head,
            "rank1_token_cos": pairwise_rank1_cosine(pk[tokens], xs[tokens]),
            "rank1_step_cos": step_cos,
        }
        self._out_low, self._out_high = out.detach(), out_high

    def backward_hook(self, d_out):
        """Receives dO (B, H, N, D): Σ_T (δ_lp − δ_hp)[T], mean over the batch, per head."""
        with torch.no_grad():
            err = delta_error(d_out, self._out_low, self._out_high)  # (B, H, N)
            per_head = err.sum(-1).mean(0)
            self.stats["delta_err_per_head"] = [float(t) for t in per_head]
            self.stats["delta_err"] = float(per_head.sum())
            self.stats["delta_abs"] = float(err.abs().sum(-1).mean(0).sum())
            self.stats["delta_sq"] = float((err * err).sum(-1).mean(0).sum())  # for matched noise
        self._out_low = self._out_high = None


# the monitor's functions imported above, then the trainer's own
__all__ = [
    *(name for name in _metrics.__all__ if name in globals()),
    "pairwise_rank1_cosine",
    "matrix_cosine",
    "find_explosion",
    "AttentionProbe",
]
