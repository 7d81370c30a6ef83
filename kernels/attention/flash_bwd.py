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
points are rounded with :func:`kernels.numerics.triton_rounding.round_low`. Two kernels, no
atomics: one program per key/value tile accumulates dK and dV over the query tiles; one program
per query tile accumulates dQ over the key tiles. So the gradients are deterministic.

Both loops skip the mask where no entry of a tile pair can be masked (``SPLIT``): with causal
attention that is every pair below the diagonal, and without it every pair but the ragged
ends. Only the diagonal and ragged tiles pay for index comparisons, selects and bounds-checked
loads. The tiles are visited in the same order either way, so the sums (and every rounding)
are the same.

The host side follows the kernels: :func:`backward_launches` plans the three launches (δ, dK/dV,
dQ) without making them, :func:`flash_backward` hands them to :mod:`.launcher` in one call, and
:func:`backward_gradients` is the eager backward pass (δ source ``"o_fp32"`` included) that
autograd, the custom op and chapter 4 run; :func:`compile_backward_ahead` hands the same
launches to the launcher to compile while a forward pass runs.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from ..interpreter import interpreting
from ..numerics.triton_rounding import round_low
from .flash_fwd import flash_forward, kernel_params, new_output
from .launcher import (
    Launch,
    autotuners,
    base_two,
    cdiv,
    compile_ahead_of,
    launch_together,
    launcher,
    not_specialised,
    pick_blocks,
    switches,
)
from .options import LOW_CODES, AttentionOptions
from .tile_ops import (
    BF16,
    batch_head,
    exp_shifted,
    load_rows,
    load_tile,
    load_tile_pair,
    mma,
    mma_acc,
    program_tile,
    store_tile,
    to_operand,
)


@triton.jit(do_not_specialize=not_specialised("N_Q"))
def _delta_from_o_kernel(O, DO, DELTA, strides_o, strides_do, H, N_Q, HEAD_DIM: tl.constexpr,
                         O_LOW: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
                         BLOCK_M: tl.constexpr):
    """δ_i = Σ_d dO_id · O_id, in the working precision."""
    bh, b, h = batch_head(H)
    _, rows, ok = program_tile(BLOCK_M, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    o, do = load_tile_pair(O, DO, b, h, rows, ok, dims, strides_o, strides_do, O_LOW, LOW,
                           EXPLICIT)
    work = DELTA.dtype.element_ty
    delta = tl.sum(o.to(work) * do.to(work), 1)
    tl.store(DELTA + bh * N_Q + rows, delta, mask=ok)


@triton.jit
def _p_dp_tile(q, do, lse, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
               rows, ok, dims, start_n, N_K, scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               LOW: tl.constexpr, EXPLICIT: tl.constexpr, BLOCK_N: tl.constexpr,
               LOG2: tl.constexpr):
    """For a query tile and the key tile at ``start_n``: P = exp(S − L) (0 where masked),
    dP = dO Vᵀ, and Kᵀ (the dQ kernel multiplies dS by it). Without ``MASKED`` every key of
    the tile is inside the sequence and visible to every row (rows past the end of the
    sequence then hold values that are never stored: each row of dQ and δ is its own)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    in_seq = cols < N_K
    k_t = load_tile(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                    in_seq[None, :], LOW, EXPLICIT, MASKED)
    v_t = load_tile(v_base + cols[None, :] * stride_vn + dims[:, None] * stride_vd,
                    in_seq[None, :], LOW, EXPLICIT, MASKED)
    p = exp_shifted(mma(q, k_t, LOW, EXPLICIT), scale, lse[:, None], LOG2)
    if MASKED:
        visible = in_seq[None, :] & ok[:, None]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        p = tl.where(visible, p, 0.0)
    dp = mma(do, v_t, LOW, EXPLICIT)
    return p, dp, k_t


@triton.jit
def _dkdv_tiles(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, bh, cols, in_seq, dims, strides_q,
                strides_do, lo, hi, N_Q, scale, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                LOW: tl.constexpr, EXPLICIT: tl.constexpr, BLOCK_M: tl.constexpr,
                LOG2: tl.constexpr):
    """Query tiles [lo, hi) for one key/value tile: dV += Pᵀ dO and dK += dSᵀ Q (unscaled).
    Without ``MASKED`` every query row is inside the sequence and sees every key."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        ok = rows < N_Q
        q_t = load_tile(Q + b * strides_q[0] + h * strides_q[1] + rows[None, :] * strides_q[2]
                        + dims[:, None] * strides_q[3], ok[None, :], LOW, EXPLICIT, MASKED)
        do = load_tile(DO + b * strides_do[0] + h * strides_do[1] + rows[:, None] * strides_do[2]
                       + dims[None, :] * strides_do[3], ok[:, None], LOW, EXPLICIT, MASKED)
        if MASKED:
            lse = tl.load(LSE + bh * N_Q + rows, mask=ok, other=0.0)
            delta = tl.load(DELTA + bh * N_Q + rows, mask=ok, other=0.0)
        else:
            lse = tl.load(LSE + bh * N_Q + rows)
            delta = tl.load(DELTA + bh * N_Q + rows)
        p_t = exp_shifted(mma(k, q_t, LOW, EXPLICIT), scale, lse[None, :], LOG2)
        if MASKED:
            visible = in_seq[:, None] & ok[None, :]
            if CAUSAL:
                visible = visible & (cols[:, None] <= rows[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv = mma_acc(to_operand(p_t, LOW, EXPLICIT), do, dv, LOW, EXPLICIT)   # += Pᵀ dO
        dp_t = mma(v, tl.trans(do), LOW, EXPLICIT)                        # (dO Vᵀ)ᵀ
        ds_t = p_t * (dp_t - delta[None, :])
        # += dSᵀ Q
        dk = mma_acc(to_operand(ds_t, LOW, EXPLICIT), tl.trans(q_t), dk, LOW, EXPLICIT)
    return dk, dv


@triton.jit(do_not_specialize=not_specialised("N_Q", "N_K"))
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, PARAMS, strides_q, strides_k, strides_v,
                     strides_do, strides_g, H, N_Q, N_K, HEAD_DIM: tl.constexpr,
                     CAUSAL: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
                     SPLIT: tl.constexpr, LOG2: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """One key/value tile: dV = Σ Pᵀ dO and dK = scale · Σ dSᵀ Q over the query tiles.

    Works on transposed tiles (keys along rows): Sᵀ = K Qᵀ, so no in-register transpose.
    ``strides_*``: the (batch, head, row, dim) strides of Q, K, V, dO and of dK and dV
    (``strides_g``, shared), each a tuple."""
    bh, b, h = batch_head(H)
    scale = tl.load(PARAMS)
    start_n, cols, in_seq = program_tile(BLOCK_N, N_K)   # key indices of this program
    dims = tl.arange(0, HEAD_DIM)
    k, v = load_tile_pair(K, V, b, h, cols, in_seq, dims, strides_k, strides_v, LOW, LOW,
                          EXPLICIT)
    work = LSE.dtype.element_ty
    dk = tl.zeros([BLOCK_N, HEAD_DIM], work)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], work)
    first_key = start_n * BLOCK_N
    lo = 0
    if CAUSAL:
        lo = (first_key // BLOCK_M) * BLOCK_M  # earlier queries see none of these keys
    # The query tiles [lo, N_Q) in three runs, in order: [lo, mid_lo) straddles the diagonal
    # (causal), [mid_lo, mid_hi) needs no mask at all, the rest holds the ragged last tile.
    # mid_lo: the first tile whose first row comes at or after this tile's last key.
    # A key tile that runs past the end of the sequence is masked throughout.
    if CAUSAL:
        mid_lo = lo + (first_key + BLOCK_N - 1 - lo + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    else:
        mid_lo = 0
    mid_hi = (N_Q // BLOCK_M) * BLOCK_M * (first_key + BLOCK_N <= N_K).to(tl.int32)
    if not SPLIT:
        mid_lo = lo
        mid_hi = 0
    dk, dv = _dkdv_tiles(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, bh, cols, in_seq, dims,
                         strides_q, strides_do, lo, tl.minimum(mid_lo, N_Q), N_Q, scale,
                         True, CAUSAL, LOW, EXPLICIT, BLOCK_M, LOG2)
    dk, dv = _dkdv_tiles(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, bh, cols, in_seq, dims,
                         strides_q, strides_do, mid_lo, mid_hi, N_Q, scale, False, CAUSAL,
                         LOW, EXPLICIT, BLOCK_M, LOG2)
    dk, dv = _dkdv_tiles(k, v, dk, dv, Q, DO, LSE, DELTA, b, h, bh, cols, in_seq, dims,
                         strides_q, strides_do, tl.maximum(mid_lo, mid_hi), N_Q, N_Q, scale,
                         True, CAUSAL, LOW, EXPLICIT, BLOCK_M, LOG2)
    dk = round_low(dk * scale, LOW, EXPLICIT)
    dv = round_low(dv, LOW, EXPLICIT)
    g = (cols[:, None] * strides_g[2] + dims[None, :] * strides_g[3] + b * strides_g[0]
         + h * strides_g[1])
    store_tile(DK + g, dk, in_seq[:, None], LOW == BF16 and EXPLICIT)
    store_tile(DV + g, dv, in_seq[:, None], LOW == BF16 and EXPLICIT)


@triton.jit
def _dq_tiles(q, do, lse, delta, acc, k_base, v_base, stride_kn, stride_kd, stride_vn,
              stride_vd, rows, ok, dims, lo, hi, N_K, scale, MASKED: tl.constexpr,
              CAUSAL: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
              DELTA_ONLY: tl.constexpr, BLOCK_N: tl.constexpr, LOG2: tl.constexpr):
    """Key tiles [lo, hi) for one query tile: ``acc`` += rowsum(dP ∘ P) (``DELTA_ONLY``, δ) or
    ``acc`` += dS K with dS = P ∘ (dP − δ) (dQ, unscaled)."""
    for start_n in range(lo, hi, BLOCK_N):
        p, dp, k_t = _p_dp_tile(q, do, lse, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                stride_vd, rows, ok, dims, start_n, N_K, scale, MASKED, CAUSAL,
                                LOW, EXPLICIT, BLOCK_N, LOG2)
        if DELTA_ONLY:
            acc += tl.sum(p * dp, 1)
        else:
            ds = p * (dp - delta[:, None])
            # += dS K
            acc = mma_acc(to_operand(ds, LOW, EXPLICIT), tl.trans(k_t), acc, LOW, EXPLICIT)
    return acc


@triton.jit(do_not_specialize=not_specialised("N_Q", "N_K"))
def _query_tile_kernel(Q, K, V, DO, LSE, DELTA, DQ, PARAMS, strides_q, strides_k, strides_v,
                       strides_do, strides_g, H, N_Q, N_K, HEAD_DIM: tl.constexpr,
                       CAUSAL: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
                       DELTA_ONLY: tl.constexpr, SPLIT: tl.constexpr, LOG2: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One query tile walks the key tiles, recomputing P = exp(S − L) and dP = dO Vᵀ.

    ``DELTA_ONLY``: δ_i = Σ_j dP_ij P_ij (the δ source "dp", which never reads O), stored in
    DELTA. Otherwise dQ = scale · Σ dS K with dS = P ∘ (dP − δ), stored in DQ."""
    bh, b, h = batch_head(H)
    scale = tl.load(PARAMS)
    start_m, rows, ok = program_tile(BLOCK_M, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    q, do, lse = load_rows(Q, DO, LSE, b, h, bh, rows, ok, dims, strides_q, strides_do, N_Q,
                           LOW, EXPLICIT)
    if DELTA_ONLY:
        delta = tl.zeros([BLOCK_M], LSE.dtype.element_ty)
        acc = delta
    else:
        delta = tl.load(DELTA + bh * N_Q + rows, mask=ok, other=0.0)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], LSE.dtype.element_ty)
    # key tiles [0, hi_full) are inside the sequence and (causal) before this tile's first
    # row: no mask; [hi_full, hi) are the diagonal and the ragged end (as in the forward pass)
    if CAUSAL:
        hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, N_K)
        hi_full = (tl.minimum(start_m * BLOCK_M, N_K) // BLOCK_N) * BLOCK_N
    else:
        hi = N_K
        hi_full = (N_K // BLOCK_N) * BLOCK_N
    if not SPLIT:
        hi_full = 0
    k_base = K + b * strides_k[0] + h * strides_k[1]
    v_base = V + b * strides_v[0] + h * strides_v[1]
    acc = _dq_tiles(q, do, lse, delta, acc, k_base, v_base, strides_k[2], strides_k[3],
                    strides_v[2], strides_v[3], rows, ok, dims, 0, hi_full, N_K, scale, False,
                    CAUSAL, LOW, EXPLICIT, DELTA_ONLY, BLOCK_N, LOG2)
    acc = _dq_tiles(q, do, lse, delta, acc, k_base, v_base, strides_k[2], strides_k[3],
                    strides_v[2], strides_v[3], rows, ok, dims, hi_full, hi, N_K, scale, True,
                    CAUSAL, LOW, EXPLICIT, DELTA_ONLY, BLOCK_N, LOG2)
    if DELTA_ONLY:
        tl.store(DELTA + bh * N_Q + rows, acc, mask=ok)
    else:
        dq = round_low(acc * scale, LOW, EXPLICIT)
        store_tile(DQ + b * strides_g[0] + h * strides_g[1] + rows[:, None] * strides_g[2]
                   + dims[None, :] * strides_g[3], dq, ok[:, None], LOW == BF16 and EXPLICIT)


# --- autotuning (CUDA, native bf16/fp16): (BLOCK_M, BLOCK_N, warps, stages) -----------------
# The dK/dV program keeps a BLOCK_N-key tile and its two accumulators resident and streams
# BLOCK_M-row query tiles past it (long, narrow query tiles: small BLOCK_M, large BLOCK_N);
# the dQ program is the mirror image. Deeper pipelines hide the streamed tiles' loads.
_NARROW_DKDV = [(64, 64, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 8, 2)]
_NARROW_DQ = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 2)]
_WIDE_DKDV = [(32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 3), (32, 128, 8, 3),
              (64, 64, 4, 3)]
_WIDE_DQ = [(128, 32, 4, 3), (128, 32, 4, 5), (128, 64, 8, 3), (128, 32, 8, 3),
            (64, 64, 4, 3)]
_TUNE_KEY = ["N_Q", "N_K", "HEAD_DIM", "CAUSAL", "LOW", "EXPLICIT"]   # SPLIT left out: the
                                                    # ablation compares both at one tile shape


def _tuned(kernel, pairs):
    # cache_results: each key's timings also go to Triton's on-disk cache (see flash_fwd)
    return triton.autotune(
        configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bm, bn, w, s in pairs], key=_TUNE_KEY, cache_results=True)(kernel)


_bwd_dkdv_tuned = _tuned(_bwd_dkdv_kernel, _WIDE_DKDV)
_bwd_dq_tuned = _tuned(_query_tile_kernel, _WIDE_DQ)
_bwd_dkdv_narrow = _tuned(_bwd_dkdv_kernel, _NARROW_DKDV)   # the first, narrower ones (ablation)
_bwd_dq_narrow = _tuned(_query_tile_kernel, _NARROW_DQ)
autotuners(_bwd_dkdv_tuned, _bwd_dq_tuned, _bwd_dkdv_narrow, _bwd_dq_narrow)
# the plan keys hold the alignment of the inputs the caller hands in (q, k, v, dO, L; for δ
# from O: O and dO): the first arguments of each kernel
_DELTA = launcher(_delta_from_o_kernel, aligned=2)
_DKDV = launcher(_bwd_dkdv_kernel, aligned=5)
_DQ = launcher(_query_tile_kernel, aligned=5)


def _as_args(explicit, *tensors):
    """On the explicit path bf16 tensors travel as their raw 16-bit patterns."""
    if explicit:
        return tuple(t.view(torch.int16) if t.dtype == torch.bfloat16 else t for t in tensors)
    return tensors


def _tile_args(qa, ka, va, da, lse, delta, grads, params, heads, n_q, n_k):
    """The non-constexpr arguments of :func:`_bwd_dkdv_kernel` (``grads`` = (dK, dV)) and
    :func:`_query_tile_kernel` (``grads`` = (dQ,)), in their order: inputs, L, δ, the gradient
    buffers, the parameters, the strides of q, k, v, dO and of the gradients (dK and dV share
    theirs; each tensor's strides one tuple), the lengths."""
    return (qa, ka, va, da, lse, delta, *grads, params, qa.stride(), ka.stride(), va.stride(),
            da.stride(), grads[0].stride(), heads, n_q, n_k)


def _delta_launch(q, k, v, out, do, lse, params, delta, *, causal, delta_source, explicit,
                  block_m, block_n, key):
    """The launch (launcher, key, args, first) that writes δ per query row into ``delta``:
    from O (stored or fp32) or from dP ∘ P."""
    batch, heads, n_q, d = q.shape
    qa, ka, va, da = _as_args(explicit, q, k, v, do)
    grid = lambda meta: (cdiv(n_q, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    tiles = dict(BLOCK_M=block_m, BLOCK_N=block_n)
    if delta_source == "dp":
        # the query-tile kernel in its δ mode (DQ unused: it gets dO and dO's strides)
        return (_DQ, ("dp", bool(causal), block_m, block_n) + key,
                _tile_args(qa, ka, va, da, lse, delta, (da,), params, heads, n_q, k.shape[2]),
                lambda: Launch(dict(HEAD_DIM=d, CAUSAL=bool(causal), LOW=LOW_CODES[q.dtype],
                                    EXPLICIT=explicit, DELTA_ONLY=True,
                                    SPLIT=switches.CURRENT.causal_split,
                                    LOG2=base_two(False, q.dtype)), grid, tiles))
    (oa,) = _as_args(explicit, out)
    return (_DELTA, ("o", block_m, out.dtype, out.stride()) + key,
            (oa, da, delta, oa.stride(), da.stride(), heads, n_q),
            lambda: Launch(dict(HEAD_DIM=d, O_LOW=LOW_CODES[out.dtype], LOW=LOW_CODES[q.dtype],
                                EXPLICIT=explicit), grid, dict(BLOCK_M=block_m)))


def backward_launches(q, k, v, out, do, lse, opts: AttentionOptions, *, explicit: bool,
                      out_fp32=None):
    """The backward pass's buffers (dQ, dK, dV, δ) and its three launches (δ, dK/dV, dQ), each
    (launcher, key, args, first), planned but not made; ``out_fp32`` for δ source
    ``"o_fp32"``."""
    kc = opts.kernel                      # validated once per options object
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    dtype = q.dtype
    params = kernel_params(opts, d, dtype, q.device, cap=False)
    # everything that decides what Triton compiles and how it is launched; the gradient
    # buffers are fresh, contiguous and aligned, so the shapes decide their strides (the
    # launcher adds the inputs' alignment and the speed-ups)
    key = (q.shape, n_k, q.stride(), k.stride(), v.stride(), do.stride(), dtype, q.device,
           explicit, kc.causal, kc.block_m, kc.block_n)
    blocks = pick_blocks(kc.block_m, kc.block_n, dtype, explicit, backward=True)
    pre_m, pre_n = blocks if blocks is not None else (64, 64)
    o_for_delta = out_fp32 if kc.delta_source == "o_fp32" else out
    delta = new_output(lse.shape, lse.dtype, lse.device)
    delta_call = _delta_launch(q, k, v, o_for_delta, do, lse, params, delta, causal=kc.causal,
                               delta_source=kc.delta_source, explicit=explicit, block_m=pre_m,
                               block_n=pre_n, key=key)
    # fresh contiguous gradient buffers (NaN-poisoned while poison_outputs is on)
    dq = new_output(q.shape, dtype, q.device)
    dk = new_output(k.shape, dtype, q.device)
    dv = new_output(v.shape, dtype, q.device)
    qa, ka, va, da, dqa, dka, dva = _as_args(explicit, q, k, v, do, dq, dk, dv)
    dkdv_args = _tile_args(qa, ka, va, da, lse, delta, (dka, dva), params, heads, n_q, n_k)
    dq_args = _tile_args(qa, ka, va, da, lse, delta, (dqa,), params, heads, n_q, n_k)
    dkdv_first = lambda: _bwd_launch(blocks, dtype, kc.causal, d, explicit,  # noqa: E731
                                     (n_q, n_k), batch * heads, "dkdv")
    dq_first = lambda: _bwd_launch(blocks, dtype, kc.causal, d, explicit,  # noqa: E731
                                   (n_q, n_k), batch * heads, "dq")
    calls = [delta_call, (_DKDV, key, dkdv_args, dkdv_first), (_DQ, key, dq_args, dq_first)]
    return (dq, dk, dv, delta), calls


def flash_backward(q, k, v, out, do, lse, opts: AttentionOptions, *, explicit: bool,
                   out_fp32=None):
    """dQ, dK, dV (inputs' dtype) and δ for O = attention(q, k, v) with the options ``opts``
    (tensors already checked); ``out_fp32`` for δ source "o_fp32". The three launches go to
    the launcher at once: a new shape compiles their kernels together, in parallel threads."""
    grads, calls = backward_launches(q, k, v, out, do, lse, opts, explicit=explicit,
                                     out_fp32=out_fp32)
    launch_together(calls)
    return grads


def compile_backward_ahead(q, k, v, out, lse, opts: AttentionOptions, *, explicit: bool):
    """Have the launcher compile, in a background thread, the kernels the backward pass of this
    forward call will need (its dO taken to be laid out like O, as autograd's gradient usually
    is), so that they compile while the forward pass goes on (``parallel_compile``). If dO comes
    otherwise, the backward compiles what it needs itself."""
    if not (switches.CURRENT.parallel_compile and q.is_cuda) or opts.delta_source == "o_fp32":
        return
    compile_ahead_of(backward_launches(q, k, v, out, out, lse, opts, explicit=explicit)[1],
                     q.device)


@dataclasses.dataclass
class Gradients:
    """What the backward kernels return, with the forward outputs they used."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    delta: torch.Tensor  # δ = rowsum(dO ∘ O) (or its stand-in), one per query row
    out: torch.Tensor  # the O the backward pass used
    lse: torch.Tensor  # L = m + log ℓ of the forward pass


def backward_gradients(q, k, v, out, lse, d_out, opts, explicit) -> Gradients:
    """The eager backward pass: dQ, dK, dV and δ of the backward kernels (inputs checked)."""
    out_fp32 = None
    if opts.delta_source == "o_fp32":
        # the same forward pass again, acc/ℓ stored without rounding it to bf16/fp16
        out_fp32, _, _ = flash_forward(q, k, v, opts, explicit=explicit, round_out=False,
                                       checked=True)
    if d_out.dtype != q.dtype:
        d_out = d_out.to(q.dtype)
    dq, dk, dv, delta = flash_backward(q, k, v, out, d_out, lse, opts, explicit=explicit,
                                       out_fp32=out_fp32)
    return Gradients(dq, dk, dv, delta, out, lse)


def _bwd_launch(blocks, dtype, causal, d, explicit, lengths, programs, which) -> Launch:
    """How the dK/dV (``which="dkdv"``, one program per key tile) or the dQ kernel is
    launched the first time for a plan key; ``lengths`` = (N_Q, N_K)."""
    consts = dict(HEAD_DIM=d, CAUSAL=causal, LOW=LOW_CODES[dtype], EXPLICIT=explicit,
                  SPLIT=switches.CURRENT.causal_split, LOG2=base_two(False, dtype))
    if which == "dq":
        consts["DELTA_ONLY"] = False
    axis, n = ("BLOCK_N", lengths[1]) if which == "dkdv" else ("BLOCK_M", lengths[0])
    grid = lambda meta: (cdiv(n, meta[axis]), programs)  # noqa: E731
    if blocks is None:
        wide = switches.CURRENT.wide_tuning
        tuned = {("dkdv", True): _bwd_dkdv_tuned, ("dkdv", False): _bwd_dkdv_narrow,
                 ("dq", True): _bwd_dq_tuned, ("dq", False): _bwd_dq_narrow}[(which, wide)]
        return Launch(consts, grid, None, tuned, lengths=lengths)   # the lengths _TUNE_KEY holds
    # fp64 tiles are large: no software pipelining, or head dim 128 overflows shared memory
    options = dict(num_stages=1) if (dtype == torch.float64 and not interpreting()) else {}
    return Launch(consts, grid, dict(BLOCK_M=blocks[0], BLOCK_N=blocks[1]), **options)
