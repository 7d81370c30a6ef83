"""Chapter 3's step-by-step road from naive attention to FlashAttention's online softmax.

Plain PyTorch, no rounding, written for reading rather than speed: each function adds one
idea to the previous one.

1. :func:`two_pass_attention` — keys and values in tiles of ``block_n``; a first sweep finds
   each row's maximum score, a second sweep sums ``exp(S - m)`` and accumulates ``P̄ V``.
   Nothing of size N × N is ever held, but every score is computed twice.
2. :func:`online_attention` — Algorithm 1 of FlashAttention-2: one sweep, with a running
   maximum ``m`` and running sum ``ℓ``; whenever the maximum grows, what was accumulated so
   far is rescaled by ``exp(m_old - m_new)``. Loops over query tiles (outer) and key tiles
   (inner) exactly like the kernel's grid and loop.

The naive reference (materialising S) is :func:`kernels.attention.reference.standard_attention`; the
*rounding* behaviour of the tiled kernel is the job of :mod:`kernels.attention.emulator`.
:class:`PeakLiveBytes` measures how much tensor memory a computation holds at once.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .reference import default_scale


def _prepare(q, k, v, scale, block):
    if q.shape[:-2] != k.shape[:-2] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if block < 1:
        raise ValueError(f"tile sizes must be positive, got {block}")
    return default_scale(q.shape[-1], scale)


def _tile_scores(q_i, k_j, scale, causal, row0, col0):
    """S_ij = scale · Q_i K_jᵀ for one pair of tiles, with future keys set to -inf if causal."""
    scores = (q_i @ k_j.transpose(-1, -2)) * scale
    if causal:
        rows = torch.arange(row0, row0 + q_i.shape[-2], device=q_i.device).unsqueeze(-1)
        cols = torch.arange(col0, col0 + k_j.shape[-2], device=q_i.device)
        scores = scores.masked_fill(cols > rows, -math.inf)
    return scores


def two_pass_attention(q, k, v, *, block_n=64, causal=False, scale=None):
    """Tiled attention with two sweeps over the keys (no rescaling needed). Shapes (..., N, D)."""
    scale = _prepare(q, k, v, scale, block_n)
    n_k = k.shape[-2]
    row_max = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    for col0 in range(0, n_k, block_n):  # sweep 1: m = max_j rowmax(S_j)
        scores = _tile_scores(q, k[..., col0 : col0 + block_n, :], scale, causal, 0, col0)
        row_max = torch.maximum(row_max, scores.amax(-1))
    row_sum = torch.zeros_like(row_max)
    o_unnorm = torch.zeros_like(q)
    for col0 in range(0, n_k, block_n):  # sweep 2: ℓ = Σ exp(S - m), Ō = Σ P̄ V
        scores = _tile_scores(q, k[..., col0 : col0 + block_n, :], scale, causal, 0, col0)
        p_tilde = torch.exp(scores - row_max.unsqueeze(-1))
        row_sum = row_sum + p_tilde.sum(-1)
        o_unnorm = o_unnorm + p_tilde @ v[..., col0 : col0 + block_n, :]
    return o_unnorm / row_sum.unsqueeze(-1)


def online_attention(q, k, v, *, block_m=64, block_n=64, causal=False, scale=None, trace_row=None):
    """Algorithm 1 (FlashAttention-2 forward) in PyTorch, no rounding. Shapes (..., N, D).

    Returns ``(O, L)`` with ``L = m + log ℓ`` per row (what the backward pass keeps). With
    ``trace_row=r`` also returns a list of ``(tile j, m, ℓ)`` for row ``r`` of the first batch
    entry, recorded after every key tile: the running statistics the derivation talks about.
    """
    scale = _prepare(q, k, v, scale, min(block_m, block_n))
    n_q, n_k = q.shape[-2], k.shape[-2]
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=q.dtype, device=q.device)
    trace = []
    for row0 in range(0, n_q, block_m):  # outer loop: one query tile Q_i
        q_i = q[..., row0 : row0 + block_m, :]
        m = torch.full(q_i.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
        ell = torch.zeros_like(m)
        o_unnorm = torch.zeros_like(q_i)
        for col0 in range(0, n_k, block_n):  # inner loop: key/value tile j
            scores = _tile_scores(q_i, k[..., col0 : col0 + block_n, :], scale, causal, row0, col0)
            m_new = torch.maximum(m, scores.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # fully masked
            p_tilde = torch.exp(scores - m_safe.unsqueeze(-1))
            rescale = torch.exp(m - m_safe)  # e^{m_old - m_new} <= 1
            ell = rescale * ell + p_tilde.sum(-1)
            o_unnorm = rescale.unsqueeze(-1) * o_unnorm + p_tilde @ v[..., col0 : col0 + block_n, :]
            m = m_new
            if trace_row is not None and row0 <= trace_row < row0 + q_i.shape[-2]:
                r = trace_row - row0
                trace.append(
                    (
                        col0 // block_n,
                        m.reshape(-1, q_i.shape[-2])[0, r].item(),
                        ell.reshape(-1, q_i.shape[-2])[0, r].item(),
                    )
                )
        out[..., row0 : row0 + block_m, :] = o_unnorm / ell.unsqueeze(-1)
        lse[..., row0 : row0 + block_m] = m + torch.log(ell)
    return (out, lse, trace) if trace_row is not None else (out, lse)


class PeakLiveBytes(TorchDispatchMode):
    """Count the bytes of tensors created inside the ``with`` block that are alive at once.

    Every tensor an operation returns is recorded with its storage size and forgotten when
    Python frees it (views share their base's storage and are counted once). ``peak`` is the
    largest total seen: the memory a computation needs beyond its inputs. It measures
    allocations made by torch operations, on any device.
    """

    def __init__(self):
        super().__init__()
        self.live = {}  # storage pointer -> [number of live tensors, bytes]
        self.current = 0
        self.peak = 0

    def _forget(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[key]

    def _track(self, t):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.live:
            self.live[key][0] += 1
        else:
            self.live[key] = [1, storage.nbytes()]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        weakref.finalize(t, self._forget, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                self._track(t)
        return result


def peak_live_bytes(fn, *args, **kwargs) -> int:
    """Run ``fn(*args, **kwargs)`` and return the peak bytes of tensors it held at once."""
    with PeakLiveBytes() as tracker:
        result = fn(*args, **kwargs)
        del result
    return tracker.peak
