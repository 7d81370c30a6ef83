"""The FlashAttention-2 backward pass (Algorithm 2) in Triton.

Nothing N×N is stored by the forward pass: only O and L = m + log ℓ per row. The backward
pass recomputes the probabilities tile by tile, ``P = exp(S − L)`` (exact softmax, no offset
needed), and uses, with dO the gradient of the output::

    δ  = rowsum(dO ∘ O)          one number per query row (the preprocessing kernel)
    dV = Pᵀ dO                   dP = dO Vᵀ
    dS = P ∘ (dP − δ)            dQ = scale · dS K        dK = scale · dSᵀ Q

δ is where Qiu & Yao find the failure: FA2 computes it from the *stored low-precision*
O, so the rounding error of O enters every gradient through (dP − δ). ``delta_source`` picks
where δ comes from:

``"o"``       rowsum(dO ∘ O) with the stored bf16/fp16 O (FlashAttention-2);
``"dp"``      rowsum(dP ∘ P), recomputed from the tiles, never touching O (the paper's stable
              variant);
``"o_fp32"``  rowsum(dO ∘ O₃₂) with O₃₂ = acc/ℓ of a second forward pass left unrounded.

Like FA2, every accumulation is fp32 and the P and dS tiles are cast to the low format right
before their tensor-core matmuls; on the explicit path (interpreter, pre-sm_80 GPUs) the same
points are rounded with :func:`kernels.numerics.triton_rounding.round_low`. Two kernels, no atomics: one program
per key/value tile accumulates dK and dV over the query tiles; one program per query tile
accumulates dQ over the key tiles. So the gradients are deterministic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..env import interpreting
from ..numerics.triton_rounding import round_low
from .jit import (BF16, batch_head, load_rows, load_tile, load_tile_pair, mma, mma_acc,
                  store_tile, program_tile, to_operand)
from .launch import as_kernel_arg, kernel_params, new_output, pick_blocks
from .options import LOW_CODES, AttentionOptions


@triton.jit
def _delta_from_o_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_on, stride_od,
                         stride_db, stride_dh, stride_dn, stride_dd, H, N_Q,
                         HEAD_DIM: tl.constexpr, O_LOW: tl.constexpr, LOW: tl.constexpr,
                         EXPLICIT: tl.constexpr, BLOCK_M: tl.constexpr):
    """δ_i = Σ_d dO_id · O_id, in the working precision."""
    bh, b, h = batch_head(H)
    _, rows, ok = program_tile(BLOCK_M, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    o, do = load_tile_pair(O, DO, b, h, rows, ok, dims, stride_ob, stride_oh, stride_on,
                           stride_od, stride_db, stride_dh, stride_dn, stride_dd, O_LOW, LOW,
                           EXPLICIT)
    work = DELTA.dtype.element_ty
    delta = tl.sum(o.to(work) * do.to(work), 1)
    tl.store(DELTA + bh * N_Q + rows, delta, mask=ok)


@triton.jit
def _p_dp_tile(q, do, lse, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
               rows, ok, dims, start_n, N_K, scale, CAUSAL: tl.constexpr, LOW: tl.constexpr,
               EXPLICIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """For a query tile and the key tile at ``start_n``: P = exp(S − L) (0 where masked),
    dP = dO Vᵀ, and Kᵀ (the dQ kernel multiplies dS by it)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    in_seq = cols < N_K
    k_t = load_tile(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                    in_seq[None, :], LOW, EXPLICIT, True)
    v_t = load_tile(v_base + cols[None, :] * stride_vn + dims[:, None] * stride_vd,
                    in_seq[None, :], LOW, EXPLICIT, True)
    visible = in_seq[None, :] & ok[:, None]
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None])
    p = tl.where(visible, tl.exp(mma(q, k_t, LOW, EXPLICIT) * scale - lse[:, None]), 0.0)
    dp = mma(do, v_t, LOW, EXPLICIT)
    return p, dp, k_t


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, PARAMS,
                     stride_qb, stride_qh, stride_qn, stride_qd,
                     stride_kb, stride_kh, stride_kn, stride_kd,
                     stride_vb, stride_vh, stride_vn, stride_vd,
                     stride_db, stride_dh, stride_dn, stride_dd,
                     stride_gb, stride_gh, stride_gn, stride_gd,
                     H, N_Q, N_K, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                     LOW: tl.constexpr, EXPLICIT: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One key/value tile: dV = Σ Pᵀ dO and dK = scale · Σ dSᵀ Q over the query tiles.

    Works on transposed tiles (keys along rows): Sᵀ = K Qᵀ, so no in-register transpose."""
    bh, b, h = batch_head(H)
    scale = tl.load(PARAMS)
    start_n, cols, in_seq = program_tile(BLOCK_N, N_K)   # key indices of this program
    dims = tl.arange(0, HEAD_DIM)
    k, v = load_tile_pair(K, V, b, h, cols, in_seq, dims, stride_kb, stride_kh, stride_kn,
                          stride_kd, stride_vb, stride_vh, stride_vn, stride_vd, LOW, LOW,
                          EXPLICIT)
    work = LSE.dtype.element_ty
    dk = tl.zeros([BLOCK_N, HEAD_DIM], work)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], work)
    lo = 0
    if CAUSAL:
        lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M  # earlier queries see none of these keys
    for start_m in range(lo, N_Q, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        ok = rows < N_Q
        q_t = load_tile(Q + b * stride_qb + h * stride_qh + rows[None, :] * stride_qn
                        + dims[:, None] * stride_qd, ok[None, :], LOW, EXPLICIT, True)
        do = load_tile(DO + b * stride_db + h * stride_dh + rows[:, None] * stride_dn
                       + dims[None, :] * stride_dd, ok[:, None], LOW, EXPLICIT, True)
        lse = tl.load(LSE + bh * N_Q + rows, mask=ok, other=0.0)
        delta = tl.load(DELTA + bh * N_Q + rows, mask=ok, other=0.0)
        visible = in_seq[:, None] & ok[None, :]
        if CAUSAL:
            visible = visible & (cols[:, None] <= rows[None, :])
        p_t = tl.where(visible, tl.exp(mma(k, q_t, LOW, EXPLICIT) * scale - lse[None, :]), 0.0)
        dv = mma_acc(to_operand(p_t, LOW, EXPLICIT), do, dv, LOW, EXPLICIT)      # += Pᵀ dO
        dp_t = mma(v, tl.trans(do), LOW, EXPLICIT)                           # (dO Vᵀ)ᵀ
        ds_t = p_t * (dp_t - delta[None, :])
        dk = mma_acc(to_operand(ds_t, LOW, EXPLICIT), tl.trans(q_t), dk, LOW, EXPLICIT)  # += dSᵀ Q
    dk = round_low(dk * scale, LOW, EXPLICIT)
    dv = round_low(dv, LOW, EXPLICIT)
    g = cols[:, None] * stride_gn + dims[None, :] * stride_gd + b * stride_gb + h * stride_gh
    store_tile(DK + g, dk, in_seq[:, None], LOW == BF16 and EXPLICIT)
    store_tile(DV + g, dv, in_seq[:, None], LOW == BF16 and EXPLICIT)


@triton.jit
def _query_tile_kernel(Q, K, V, DO, LSE, DELTA, DQ, PARAMS,
                       stride_qb, stride_qh, stride_qn, stride_qd,
                       stride_kb, stride_kh, stride_kn, stride_kd,
                       stride_vb, stride_vh, stride_vn, stride_vd,
                       stride_db, stride_dh, stride_dn, stride_dd,
                       stride_gb, stride_gh, stride_gn, stride_gd,
                       H, N_Q, N_K, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                       LOW: tl.constexpr, EXPLICIT: tl.constexpr, DELTA_ONLY: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile walks the key tiles, recomputing P = exp(S − L) and dP = dO Vᵀ.

    ``DELTA_ONLY``: δ_i = Σ_j dP_ij P_ij (the δ source "dp", which never reads O), stored in
    DELTA. Otherwise dQ = scale · Σ dS K with dS = P ∘ (dP − δ), stored in DQ."""
    bh, b, h = batch_head(H)
    scale = tl.load(PARAMS)
    start_m, rows, ok = program_tile(BLOCK_M, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    q, do, lse = load_rows(Q, DO, LSE, b, h, bh, rows, ok, dims, stride_qb, stride_qh,
                           stride_qn, stride_qd, stride_db, stride_dh, stride_dn, stride_dd,
                           N_Q, LOW, EXPLICIT)
    if DELTA_ONLY:
        delta = tl.zeros([BLOCK_M], LSE.dtype.element_ty)
    else:
        delta = tl.load(DELTA + bh * N_Q + rows, mask=ok, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], LSE.dtype.element_ty)
    if CAUSAL:
        hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, N_K)
    else:
        hi = N_K
    for start_n in range(0, hi, BLOCK_N):
        p, dp, k_t = _p_dp_tile(q, do, lse, K + b * stride_kb + h * stride_kh,
                                V + b * stride_vb + h * stride_vh, stride_kn, stride_kd,
                                stride_vn, stride_vd, rows, ok, dims, start_n, N_K, scale,
                                CAUSAL, LOW, EXPLICIT, BLOCK_N)
        if DELTA_ONLY:
            delta += tl.sum(p * dp, 1)
        else:
            ds = p * (dp - delta[:, None])
            dq = mma_acc(to_operand(ds, LOW, EXPLICIT), tl.trans(k_t), dq, LOW, EXPLICIT)  # += dS K
    if DELTA_ONLY:
        tl.store(DELTA + bh * N_Q + rows, delta, mask=ok)
    else:
        dq = round_low(dq * scale, LOW, EXPLICIT)
        store_tile(DQ + b * stride_gb + h * stride_gh + rows[:, None] * stride_gn
                   + dims[None, :] * stride_gd, dq, ok[:, None], LOW == BF16 and EXPLICIT)


def _bwd_configs(pairs):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
            for bm, bn, warps, stages in pairs]


_TUNE_KEY = ["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "LOW", "EXPLICIT"]
_bwd_dkdv_tuned = triton.autotune(
    configs=_bwd_configs([(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 8, 2)]),
    key=_TUNE_KEY)(_bwd_dkdv_kernel)
_bwd_dq_tuned = triton.autotune(
    configs=_bwd_configs([(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 2)]),
    key=_TUNE_KEY)(_query_tile_kernel)


def compute_delta(q, k, v, out, do, lse, params, *, causal, delta_source, explicit,
                  block_m, block_n, as_arg):
    """δ per query row (working dtype), from O (stored or fp32) or from dP ∘ P."""
    batch, heads, n_q, d = q.shape
    delta = new_output(lse.shape, lse.dtype, lse.device)
    qa, ka, va, da = (as_arg(t) for t in (q, k, v, do))
    if delta_source == "dp":
        grid = (triton.cdiv(n_q, block_m), batch * heads)
        # the query-tile kernel in its δ mode (DQ unused: it gets dO and dO's strides)
        _query_tile_kernel[grid](qa, ka, va, da, lse, delta, da, params, *qa.stride(),
                                 *ka.stride(), *va.stride(), *da.stride(), *da.stride(),
                                 heads, n_q, k.shape[2], HEAD_DIM=d, CAUSAL=bool(causal),
                                 LOW=LOW_CODES[q.dtype], EXPLICIT=explicit, DELTA_ONLY=True,
                                 BLOCK_M=block_m, BLOCK_N=block_n)
        return delta
    oa = as_arg(out)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    _delta_from_o_kernel[grid](oa, da, delta, *oa.stride(), *da.stride(), heads, n_q,
                               HEAD_DIM=d, O_LOW=LOW_CODES[out.dtype], LOW=LOW_CODES[q.dtype],
                               EXPLICIT=explicit, BLOCK_M=block_m)
    return delta


def flash_backward(q, k, v, out, do, lse, opts: AttentionOptions, *, explicit: bool,
                   out_fp32=None):
    """dQ, dK, dV (inputs' dtype) and δ for O = attention(q, k, v) with the options ``opts``
    (already validated; tensors already checked); ``out_fp32`` for δ source "o_fp32"."""
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    params = kernel_params(opts.scale_for(d), opts.beta, opts.eps, q.dtype, q.device)
    blocks = pick_blocks(opts.block_m, opts.block_n, q.dtype, explicit, backward=True)
    pre_m, pre_n = blocks if blocks is not None else (64, 64)

    def as_arg(t):
        return as_kernel_arg(t, explicit)

    o_for_delta = out_fp32 if opts.delta_source == "o_fp32" else out
    delta = compute_delta(q, k, v, o_for_delta, do, lse, params, causal=opts.causal,
                          delta_source=opts.delta_source, explicit=explicit, block_m=pre_m,
                          block_n=pre_n, as_arg=as_arg)
    # fresh contiguous gradient buffers (NaN-poisoned when POISON_OUTPUTS is on)
    dq, dk, dv = (new_output(t.shape, t.dtype, t.device) for t in (q, k, v))
    qa, ka, va, da = (as_arg(t) for t in (q, k, v, do))
    dqa, dka, dva = (as_arg(t) for t in (dq, dk, dv))
    common = dict(HEAD_DIM=d, CAUSAL=opts.causal, LOW=LOW_CODES[q.dtype], EXPLICIT=explicit)
    strides = (*qa.stride(), *ka.stride(), *va.stride(), *da.stride())
    dkdv_args = (qa, ka, va, da, lse, delta, dka, dva, params, *strides, *dka.stride(),
                 heads, n_q, n_k)
    dq_args = (qa, ka, va, da, lse, delta, dqa, params, *strides, *dqa.stride(), heads, n_q, n_k)
    if blocks is None:
        _bwd_dkdv_tuned[lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), batch * heads)](
            *dkdv_args, **common)
        _bwd_dq_tuned[lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads)](
            *dq_args, **common, DELTA_ONLY=False)
    else:
        bm, bn = blocks
        # fp64 tiles are large: no software pipelining, or head dim 128 overflows shared memory
        launch = dict(num_stages=1) if (q.dtype == torch.float64 and not interpreting()) else {}
        _bwd_dkdv_kernel[(triton.cdiv(n_k, bn), batch * heads)](*dkdv_args, **common,
                                                                BLOCK_M=bm, BLOCK_N=bn, **launch)
        _query_tile_kernel[(triton.cdiv(n_q, bm), batch * heads)](
            *dq_args, **common, DELTA_ONLY=False, BLOCK_M=bm, BLOCK_N=bn, **launch)
    return dq, dk, dv, delta
