"""The FlashAttention-2 forward pass (Algorithm 1) in Triton, with the optional offset fix.

One program owns ``BLOCK_M`` query rows of one (batch, head). It walks over the keys and
values in tiles of ``BLOCK_N`` columns, keeping three running quantities per row::

    S      = (Q K_jᵀ) · scale                 scores of this tile, fp32 accumulation
    m_new  = offset rule on the running max   (plain: the running maximum of S)
    P̄      = exp(S − m_new)                   unnormalised probabilities, every entry <= 1
    α      = exp(m_old − m_new)               rescales what was accumulated so far
    ℓ      = α ℓ + rowsum(P̄)                  running softmax denominator
    acc    = α acc + rnd(P̄) V_j               running unnormalised output Ō (P̄ rounded to
                                              bf16/fp16 before the tensor-core matmul)

and at the end writes ``O = rnd(acc / ℓ)`` and the log-sum-exp ``L = m + log ℓ`` (fp32) that
the backward pass needs to recompute P without storing it.

It follows :mod:`kernels.attention.emulator` operation by operation (the numerics contract), in
both numerics modes: ``PAPER=False`` is the FA2 recipe above; ``PAPER=True`` holds S, P̄, α, ℓ
and acc in the low format like the paper's PyTorch code. ``STABLE`` picks the offset rule: off,
``TILE`` (the paper's per-tile Algorithm 3) or ``CROSS`` (Algorithm 3 on the running (max, tie
count) of all tiles so far, which also sees a tie split between two tiles). The two steps of the
tile loop are the Triton helpers :func:`~kernels.attention.tile_ops.offset_update` and
:func:`~kernels.attention.tile_ops.accumulate`.

The same source serves every machine through two compile-time switches:

``EXPLICIT=False`` (GPU >= sm_80)
    tiles stay bf16/fp16, ``tl.dot`` runs on tensor cores with fp32 accumulation and each
    rounding point is a hardware cast ``.to(tl.bfloat16)``.
``EXPLICIT=True`` (Triton interpreter, GPUs < sm_80)
    bf16 tensors arrive as their raw 16-bit patterns (``int16``), are widened to fp32 exactly,
    multiplied with ``tl.dot(..., input_precision="ieee")`` (a product of two bf16 numbers is
    exact in fp32) and rounded with
    :func:`kernels.numerics.triton_rounding.round_low` at the same points.

With ``LOG2`` (FA2 numerics, bf16/fp16, the ``exp2`` speed-up of :mod:`.launcher`)
the exponentials are computed in base 2, as FlashAttention's kernels do:
P̄ = 2^(QKᵀ·(scale·log₂e) − m·log₂e), one fused multiply-add per score, where ``tl.exp`` of
S − m would cost a multiplication more (it is 2^(x·log₂e) on a GPU). S, m, the offset rule and
L stay in natural units.

With ``MAX_FIRST`` (the ``max_first`` speed-up, the offset rule off) the running maximum is
taken over QKᵀ and scaled once per row, max(S) = max(QKᵀ)·scale: rounding a product is monotone
in it, so the two are equal to the bit.

fp32 inputs use ieee fp32 dots and no rounding; fp64 inputs compute everything in fp64
(``tl.dot`` accepts fp64 operands in Triton 3.6, in the interpreter and on sm_80+ GPUs).

:func:`flash_forward` is the host side: it checks nothing twice, allocates the outputs
(:func:`new_output`) and the parameters (:func:`kernel_params`, shared with the backward pass),
and reaches :mod:`.launcher` through one call, which plans, tunes, compiles and launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..numerics.rounding import work_dtype
from ..numerics.triton_rounding import round_low
from .launcher import (
    Launch,
    autotuners,
    base_two,
    cdiv,
    launcher,
    not_specialised,
    pick_blocks,
    switches,
    tma_usable,
)
from .options import LOW_CODES, AttentionOptions, checked_call, options_from
from .tile_ops import (
    BF16,
    accumulate,
    batch_head,
    load_block,
    load_row_tile,
    load_tile,
    mma,
    offset_update,
    program_tile,
    rnd_if,
    row_block,
    store_tile,
)


@triton.jit
def _fwd_tiles(q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
               m, rm, rs, ell, acc, rows, lo, hi, N_K, scale, beta, eps, cap,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, STABLE: tl.constexpr, CAP: tl.constexpr,
               PAPER: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
               ROUND_P: tl.constexpr, ELL_ROUNDED: tl.constexpr, TMA: tl.constexpr,
               LOG2: tl.constexpr, MAX_FIRST: tl.constexpr):
    """Key/value tiles [lo, hi): the online-softmax update. ``MASKED`` tiles may hold keys past
    the end of the sequence or (causal) keys after the query; the others are fully visible.
    ``k_src``, ``v_src``: this (batch, head)'s K and V, as base pointers or (``TMA``) as
    tensor descriptors; both read keys past ``N_K`` as 0."""
    cols0 = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + cols0
        in_seq = cols < N_K
        if TMA:
            k_t = tl.trans(load_block(k_src, start_n, LOW, EXPLICIT))      # Kᵀ: (D, BLOCK_N)
            v = load_block(v_src, start_n, LOW, EXPLICIT)                   # V: (BLOCK_N, D)
        else:
            k_t = load_tile(k_src + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                            in_seq[None, :], LOW, EXPLICIT, MASKED)
            v = load_tile(v_src + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                          in_seq[:, None], LOW, EXPLICIT, MASKED)
        # S = (Q Kᵀ)·scale; the paper's code rounds the product and the scaled scores
        qk = rnd_if(mma(q, k_t, LOW, EXPLICIT), PAPER, LOW, EXPLICIT)
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        # m_new: the offset this tile's P̄ = exp(S − m_new) uses (running max, or Algorithm 3)
        m_new, rm, rs = offset_update(qk, scale, m, rm, rs, beta, eps, cap, STABLE, CAP, PAPER,
                                      LOW, EXPLICIT, MAX_FIRST)
        # ℓ = α ℓ + rowsum(P̄),  Ō = α Ō + rnd(P̄) V_j,  α = exp(m − m_new)
        ell, acc = accumulate(qk, scale, v, m, m_new, ell, acc, PAPER, LOW, EXPLICIT, ROUND_P,
                              ELL_ROUNDED, LOG2)
        m = m_new
    return m, rm, rs, ell, acc


@triton.jit(do_not_specialize=not_specialised("N_Q", "N_K"))
def _flash_fwd_kernel(Q, K, V, O, LSE, ROW_OFFSET, PARAMS,
                      stride_qb, stride_qh, stride_qn, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_ob, stride_oh, stride_on, stride_od,
                      H, N_Q, N_K,
                      HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, STABLE: tl.constexpr,
                      CAP: tl.constexpr, PAPER: tl.constexpr, LOW: tl.constexpr,
                      EXPLICIT: tl.constexpr, ROUND_OUT: tl.constexpr,
                      ELL_ROUNDED: tl.constexpr, STORE_OFFSET: tl.constexpr,
                      SPLIT: tl.constexpr, TMA: tl.constexpr, LOG2: tl.constexpr,
                      MAX_FIRST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    bh, b, h = batch_head(H)
    # scale, beta, eps, cap as the working dtype (fp32, or fp64 for fp64 inputs), from memory
    scale = tl.load(PARAMS)
    beta = tl.load(PARAMS + 1)
    eps = tl.load(PARAMS + 2)
    cap = tl.load(PARAMS + 3)

    start_m, rows, row_ok = program_tile(BLOCK_M, N_Q)
    dims = tl.arange(0, HEAD_DIM)
    q = load_row_tile(Q, b, h, rows, row_ok, dims, stride_qb, stride_qh, stride_qn, stride_qd,
                      LOW, EXPLICIT)
    k_src = K + b * stride_kb + h * stride_kh
    v_src = V + b * stride_vb + h * stride_vh
    if TMA:   # the same matrices, read a tile at a time by the TMA engine (sm_90+)
        k_src = row_block(k_src, N_K, stride_kn, BLOCK_N, HEAD_DIM)
        v_src = row_block(v_src, N_K, stride_vn, BLOCK_N, HEAD_DIM)

    work = PARAMS.dtype.element_ty
    m = tl.full([BLOCK_M], float("-inf"), work)    # offset used for P̄ so far
    rm = tl.full([BLOCK_M], float("-inf"), work)   # raw running maximum
    rs = tl.zeros([BLOCK_M], work)                 # running tie count ("cross")
    ell = tl.zeros([BLOCK_M], work)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], work)

    # Stage 1: tiles every row of this block sees completely (no mask needed). Skipping the
    # mask there saves, per score, the index comparisons and the select, and lets the K/V
    # loads go without bounds checks; with SPLIT off (the ablation) every tile is masked.
    if CAUSAL:
        hi_full = (tl.minimum(start_m * BLOCK_M, N_K) // BLOCK_N) * BLOCK_N
    else:
        hi_full = (N_K // BLOCK_N) * BLOCK_N
    if not SPLIT:
        hi_full = 0
    m, rm, rs, ell, acc = _fwd_tiles(q, k_src, v_src, stride_kn, stride_kd, stride_vn,
                                     stride_vd, m, rm, rs, ell, acc, rows, 0, hi_full, N_K,
                                     scale, beta, eps, cap, BLOCK_N, HEAD_DIM, False, CAUSAL,
                                     STABLE, CAP, PAPER, LOW, EXPLICIT, ROUND_OUT, ELL_ROUNDED,
                                     TMA, LOG2, MAX_FIRST)
    # Stage 2: the diagonal tiles (causal) and the ragged last tile; tiles that are masked
    # for every row of the block (keys after the block's last query) are skipped.
    if CAUSAL:
        hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, N_K)
    else:
        hi = N_K
    m, rm, rs, ell, acc = _fwd_tiles(q, k_src, v_src, stride_kn, stride_kd, stride_vn,
                                     stride_vd, m, rm, rs, ell, acc, rows, hi_full, hi, N_K,
                                     scale, beta, eps, cap, BLOCK_N, HEAD_DIM, True, CAUSAL,
                                     STABLE, CAP, PAPER, LOW, EXPLICIT, ROUND_OUT, ELL_ROUNDED,
                                     TMA, LOG2, MAX_FIRST)

    out = acc / ell[:, None]
    if ROUND_OUT:
        out = round_low(out, LOW, EXPLICIT)
    store_tile(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on
               + dims[None, :] * stride_od, out, row_ok[:, None],
               ROUND_OUT and LOW == BF16 and EXPLICIT)
    stat = bh * N_Q + rows
    tl.store(LSE + stat, m + tl.log(ell), mask=row_ok)
    if STORE_OFFSET:
        tl.store(ROW_OFFSET + stat, m, mask=row_ok)


# --- the host side's buffers ---------------------------------------------------------------
_PARAMS_CACHE: dict = {}


def new_output(shape, dtype, device):
    """A buffer a kernel writes, NaN-filled while the ``poison_outputs`` switch is on (so a
    missed write shows)."""
    if switches.CURRENT.poison_outputs:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def kernel_params(opts: AttentionOptions, head_dim, dtype, device, cap=True) -> torch.Tensor:
    """The scale (at this head dim), beta, eps and the offset cap (0 with ``cap=False``) of
    ``opts`` as a tiny tensor of the working dtype of ``dtype`` inputs (fp64 stays exact for
    fp64); the kernels read them from ``PARAMS``.

    Cached per options object: building it each call would be a blocking host-to-GPU copy per
    attention call."""
    key = (opts, head_dim, dtype, device, cap)
    found = _PARAMS_CACHE.get(key)
    if found is None:
        values = (opts.scale_for(head_dim), opts.beta, opts.eps,
                  opts.kernel.cap_value if cap else 0.0)
        found = torch.tensor([float(x) for x in values], dtype=work_dtype(dtype), device=device)
        if len(_PARAMS_CACHE) > 256:
            _PARAMS_CACHE.clear()
        _PARAMS_CACHE[key] = found
    return found


# --- autotuning (CUDA, native bf16/fp16 only; the interpreter runs one fixed configuration) ---
# A configuration is (BLOCK_M query rows, BLOCK_N keys per tile, warps, pipeline stages).
# Larger tiles reuse each loaded K/V tile for more query rows (higher arithmetic intensity)
# but need more registers and shared memory; more stages prefetch more K/V tiles while the
# tensor cores work. Which is best depends on the head dim and the GPU, so Triton times them
# once per key (sequence length, head dim and the compile-time switches) and remembers; the
# Launcher shares the pick across a power-of-two bucket of lengths (the "tune_by_bucket"
# speed-up) and lends it to an untuned bucket nearby ("nearest_bucket").
# cache_results=True: Triton 3.6 also stores each key's timings on disk, in its cache folder
# (TRITON_CACHE_DIR, ~/.triton/cache), under a hash of the Triton version, the GPU target, the
# kernel's source, the key and the configurations; a later process tuning the same key reads
# the pick from there instead of timing again (runtime/autotuner.py, check_disk_cache).
_NARROW = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
_WIDE = [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3), (128, 64, 8, 3),
         (64, 64, 4, 3), (128, 32, 4, 3)]
_TUNE_KEY = ["N_K", "HEAD_DIM", "CAUSAL", "STABLE", "CAP", "PAPER", "LOW", "EXPLICIT",
             "ROUND_OUT", "ELL_ROUNDED"]     # SPLIT left out on purpose: the ablation
                                              # compares both loop shapes at one tile shape


def _fits(configs, named_args, **kwargs):
    """Drop tile shapes whose pipelined K and V tiles would not fit in ~200 KB of shared
    memory at this head dim (they would fail to compile and only cost tuning time)."""
    d = kwargs.get("HEAD_DIM", 64)
    kept = [c for c in configs
            if c.num_stages * 2 * c.kwargs["BLOCK_N"] * d * 2 + c.kwargs["BLOCK_M"] * d * 2
            <= 200 * 1024]
    return kept or configs[:1]


def _tuned(pairs):
    return triton.autotune(
        configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                 for bm, bn, w, s in pairs],
        key=_TUNE_KEY, prune_configs_by={"early_config_prune": _fits},
        cache_results=True)(_flash_fwd_kernel)


_flash_fwd_tuned = _tuned(_WIDE)
_flash_fwd_narrow = _tuned(_NARROW)       # the first, narrower configurations (ablation)
autotuners(_flash_fwd_tuned, _flash_fwd_narrow)
# the plan key holds the alignment of Q, K and V (the outputs are fresh, so aligned); the
# kernel builds tensor descriptors (TMA) and needs scratch memory for them on the GPU
FORWARD = launcher(_flash_fwd_kernel, aligned=3, scratch=True)


def autotune_tiles() -> list[tuple[int, int]]:
    """The (BLOCK_M, BLOCK_N) tile shapes the GPU autotuner chooses among now (they depend on
    the ``wide_tuning`` speed-up), sorted; the interpreter always runs 64×64."""
    tuned = _flash_fwd_tuned if switches.CURRENT.wide_tuning else _flash_fwd_narrow
    return sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in tuned.configs})


def flash_forward(q, k, v, opts: AttentionOptions | None = None, *, explicit=None,
                  round_out=True, return_offset=False, checked=False, **options):
    """Run the forward kernel on (batch, heads, seq, head_dim) tensors.

    ``opts`` (or the same fields as keywords: ``causal=True, stable="cross"``...) says what to
    compute. Returns ``(out, lse, row_offset)``: ``out`` in the inputs' dtype, or with
    ``round_out=False`` in fp32 for low-precision inputs (O without FA2's two roundings: P̄
    before P̄V, and acc/ℓ); ``lse`` (fp32, fp64 for fp64 inputs) of shape (batch, heads, seq_q);
    the final offset m per row if ``return_offset`` (else None). ``checked=True``: the caller has
    already checked the tensors and resolved ``explicit`` (the autograd function does).
    """
    if checked:
        opts = options_from(options) if opts is None else opts
    else:
        opts, explicit = checked_call(q, k, v, opts, options, explicit)
    kc = opts.kernel                      # validated once per options object
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    dtype, device = q.dtype, q.device
    params = kernel_params(opts, d, dtype, device)
    work = params.dtype
    low_out = round_out or dtype in (torch.float32, torch.float64)
    out = new_output(q.shape, dtype if low_out else work, device)
    lse = new_output((batch, heads, n_q), work, device)
    offset = new_output(lse.shape, work, device) if return_offset else lse
    if explicit and dtype == torch.bfloat16:
        q, k, v = (t.view(torch.int16) for t in (q, k, v))
        oa = out.view(torch.int16) if low_out else out
    else:
        oa = out
    args = (q, k, v, oa, lse, offset, params, *q.stride(), *k.stride(), *v.stride(),
            *oa.stride(), heads, n_q, n_k)
    # everything that decides what Triton compiles and how it is launched (the output
    # buffers are fresh, contiguous and aligned, so q's shape decides their strides; the
    # launcher adds q, k and v's alignment and the speed-ups)
    key = (opts, q.shape, n_k, q.stride(), k.stride(), v.stride(), dtype, device, explicit,
           low_out, return_offset)

    def first():
        consts = dict(HEAD_DIM=d, CAUSAL=kc.causal, STABLE=kc.stable, CAP=kc.cap,
                      PAPER=kc.paper, LOW=LOW_CODES[dtype], EXPLICIT=explicit,
                      ROUND_OUT=bool(low_out), ELL_ROUNDED=kc.ell_rounded,
                      STORE_OFFSET=bool(return_offset),
                      SPLIT=switches.CURRENT.causal_split,
                      TMA=tma_usable(k, v),   # decided by the key: switches, strides, alignment
                      LOG2=base_two(kc.paper, dtype),
                      MAX_FIRST=switches.CURRENT.max_first)
        blocks = pick_blocks(kc.block_m, kc.block_n, dtype, explicit)
        tuned = _flash_fwd_tuned if switches.CURRENT.wide_tuning else _flash_fwd_narrow
        return Launch(consts, lambda meta: (cdiv(n_q, meta["BLOCK_M"]), batch * heads),
                      None if blocks is None else dict(BLOCK_M=blocks[0], BLOCK_N=blocks[1]),
                      tuned, lengths=(n_k,))     # the length _TUNE_KEY holds

    FORWARD(key, args, first)
    return out, lse, (offset if return_offset else None)
