"""Triton helpers shared by the forward and backward kernels (inlined where they are called).

Two compile-time switches run through all of them:

``LOW``       the low-precision format: :data:`BF16`, :data:`FP16`, or fp32/fp64 (no rounding);
``EXPLICIT``  bf16 carried in fp32 registers and rounded with integer arithmetic (Triton's CPU
              interpreter and GPUs older than sm_80), instead of hardware bf16.

The two steps of the forward pass's tile loop are here too, named as the emulator names them:
:func:`offset_update` (which offset m the new tile is exponentiated against) and
:func:`accumulate` (the online-softmax update of ℓ and Ō).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..numerics.triton_rounding import round_low
from .options import LOW_BF16, LOW_FP16, STABLE_CROSS, STABLE_OFF, STABLE_TILE

# named compile-time codes (kernels compare ``LOW == BF16``, never ``LOW == 0``)
BF16 = tl.constexpr(LOW_BF16)
FP16 = tl.constexpr(LOW_FP16)
OFF = tl.constexpr(STABLE_OFF)
TILE = tl.constexpr(STABLE_TILE)
CROSS = tl.constexpr(STABLE_CROSS)
LOG2E = tl.constexpr(1.4426950408889634)   # log₂ e: e^x = 2^(x·log₂e)
NEG_LOG2E = tl.constexpr(-1.4426950408889634)


@triton.jit
def widen(x, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """A loaded tile as the dtype ``tl.dot`` will take: low precision on the native path,
    fp32 (bf16/fp16/fp32 inputs) or fp64 on the explicit / high-precision paths."""
    if LOW == BF16 and EXPLICIT:
        # raw bf16 bit patterns (int16): widen to the fp32 with the same value, exactly
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif LOW == FP16 and EXPLICIT:
        x = x.to(tl.float32)
    return x


@triton.jit
def load_tile(ptrs, mask, LOW: tl.constexpr, EXPLICIT: tl.constexpr, MASKED: tl.constexpr):
    """Load a tile through pointers (entries outside ``mask`` read as 0 when ``MASKED``), as
    the dtype ``tl.dot`` will take (:func:`widen`)."""
    if MASKED:
        x = tl.load(ptrs, mask=mask, other=0)
    else:
        x = tl.load(ptrs)
    return widen(x, LOW, EXPLICIT)


@triton.jit
def row_block(base, n_rows, stride_row, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A tensor descriptor over the (n_rows × HEAD_DIM) matrix at ``base`` (rows ``stride_row``
    apart, unit stride along a row) that reads ``BLOCK`` rows at a time. On sm_90+ GPUs its
    loads are done by the TMA copy engine (one instruction moves a whole tile, no per-element
    addresses in registers); rows past ``n_rows`` read as 0, as a masked load's would."""
    return tl.make_tensor_descriptor(base, shape=[n_rows, HEAD_DIM], strides=[stride_row, 1],
                                     block_shape=[BLOCK, HEAD_DIM])


@triton.jit
def load_block(desc, row, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """Rows [row, row + BLOCK) of a :func:`row_block` descriptor, as :func:`load_tile` gives."""
    return widen(desc.load([row, 0]), LOW, EXPLICIT)


@triton.jit
def store_tile(ptrs, x, mask, BITS: tl.constexpr):
    """Store a tile whose values are already representable in the destination format;
    ``BITS``: the destination holds bf16 as raw 16-bit patterns (explicit path)."""
    if BITS:
        # bf16 as raw bits: the top half of the fp32 pattern (x is already rounded)
        bits = (x.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
        tl.store(ptrs, bits, mask=mask)
    else:
        tl.store(ptrs, x.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def to_operand(x, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """Round a working-precision tile to the low format and give it the dtype of a dot operand."""
    if LOW == BF16 and not EXPLICIT:
        return x.to(tl.bfloat16)
    elif LOW == FP16 and not EXPLICIT:
        return x.to(tl.float16)
    else:
        return round_low(x, LOW, EXPLICIT)


@triton.jit
def mma(a, b, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """a @ b with fp32 accumulation (fp64 for fp64 inputs); ieee products off the native path."""
    if (LOW == BF16 or LOW == FP16) and not EXPLICIT:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def mma_acc(a, b, acc, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """acc + a @ b, the addition done inside the matmul (one fp32 accumulator)."""
    if (LOW == BF16 or LOW == FP16) and not EXPLICIT:
        return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision="ieee", out_dtype=acc.dtype)


@triton.jit
def rnd_if(x, DO: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """A rounding point that exists only in some numerics mode (``DO``)."""
    if DO:
        return round_low(x, LOW, EXPLICIT)
    else:
        return x


@triton.jit
def offset_rule(rm, rs, beta, cap, CAP: tl.constexpr, PAPER: tl.constexpr, LOW: tl.constexpr,
                EXPLICIT: tl.constexpr):
    """Algorithm 3: m = β·rm if rm > 0 and rs > 1; 0 if rm < 0 and rs > 1; rm otherwise.
    ``CAP``: m <= rm + cap, so a tied P̄ = exp(rm − m) >= exp(−cap) cannot underflow."""
    tied = rs > 1
    m = tl.where(tied & (rm > 0), rnd_if(beta * rm, PAPER, LOW, EXPLICIT), rm)
    m = tl.where(tied & (rm < 0), 0.0, m)
    if CAP:
        m = tl.minimum(m, rnd_if(rm + cap, PAPER, LOW, EXPLICIT))
    return m


@triton.jit
def offset_update(qk, scale, m, rm, rs, beta, eps, cap, STABLE: tl.constexpr,
                  CAP: tl.constexpr, PAPER: tl.constexpr, LOW: tl.constexpr,
                  EXPLICIT: tl.constexpr, MAX_FIRST: tl.constexpr):
    """The offset m_new this tile's P̄ = exp(S − m_new) uses, S = ``qk``·``scale``; also the
    raw running maximum rm and (``CROSS``) the running tie count rs. Returns
    (m_new, rm_new, rs). A rule other than ``OFF``, ``TILE`` and ``CROSS`` does not compile."""
    tl.static_assert(STABLE == OFF or STABLE == TILE or STABLE == CROSS,
                     "offset_update: unknown offset rule (STABLE must be OFF, TILE or CROSS)")
    if STABLE == OFF and not PAPER and MAX_FIRST:
        # max(S) = max(QKᵀ)·scale exactly: rounding is monotone and scale > 0, so the row's
        # maximum costs one multiplication per row instead of one per score
        rm_new = tl.maximum(rm, tl.max(qk, 1) * scale)
        return rm_new, rm_new, rs
    scores = rnd_if(qk * scale, PAPER, LOW, EXPLICIT)   # the paper's code rounds S
    tile_max = tl.max(scores, 1)
    rm_new = tl.maximum(rm, tile_max)                  # raw running maximum of S
    if STABLE == TILE:
        # the paper's rule on this tile alone: ties in other tiles are invisible
        near = rnd_if(tile_max - eps, PAPER, LOW, EXPLICIT)
        tile_ties = tl.sum(tl.where(scores >= near[:, None], 1.0, 0.0), 1)
        # a row whose keys are all masked in this tile has no tie (not "all tied at -inf")
        tile_ties = tl.where(tile_max == float("-inf"), 0.0, tile_ties).to(rm.dtype)
        m_new = tl.maximum(m, offset_rule(tile_max, tile_ties, beta, cap, CAP, PAPER, LOW,
                                          EXPLICIT))
    elif STABLE == CROSS:
        # the rule on the running maximum and running tie count of all tiles so far
        # (near is finite once a row has seen a key, so masked -inf scores never count)
        near = rnd_if(rm_new - eps, PAPER, LOW, EXPLICIT)
        carried = tl.where(rm >= near, rs, 0.0)        # old ties still within eps of the max?
        rs = carried + tl.sum(tl.where(scores >= near[:, None], 1.0, 0.0), 1).to(rm.dtype)
        # m never decreases (as in the emulator): α = exp(m_old − m_new) <= 1 cannot overflow
        m_new = tl.maximum(m, offset_rule(rm_new, rs, beta, cap, CAP, PAPER, LOW, EXPLICIT))
    else:
        m_new = rm_new
    return m_new, rm_new, rs


@triton.jit
def exp_shifted(x, scale, shift, LOG2: tl.constexpr):
    """e^(x·scale − shift) for a tile ``x`` (a product QKᵀ, -inf where masked) and a ``shift``
    already broadcast against it (each row's offset m, or its log-sum-exp L). The exponent is
    one fused multiply-add, one rounding, as FlashAttention's kernels compute it; written out
    because a GPU compiler fuses x·scale − shift by itself only where nothing stands between
    the two, so a masked tile and a full one would round differently. ``LOG2``: log₂e folded
    into the scale and the shift, and 2^x: the same number, one multiply per entry fewer
    (``tl.exp`` is 2^(x·log₂e) on a GPU); m and L stay in natural units."""
    if LOG2:
        return tl.exp2(tl.fma(x, scale * LOG2E, shift * NEG_LOG2E))
    else:
        return tl.exp(tl.fma(x, scale, -shift))


@triton.jit
def accumulate(qk, scale, v, m, m_new, ell, acc, PAPER: tl.constexpr, LOW: tl.constexpr,
               EXPLICIT: tl.constexpr, ROUND_P: tl.constexpr, ELL_ROUNDED: tl.constexpr,
               LOG2: tl.constexpr):
    """The online-softmax update for one tile: P̄ = exp(S − m_new), α = exp(m_old − m_new),
    ℓ = α ℓ + rowsum(P̄), Ō = α Ō + rnd(P̄) V, with S = ``qk``·``scale``. Returns (ℓ, Ō).
    ``ELL_ROUNDED``: ℓ sums rnd(P̄), the values the matmul multiplies V by. ``LOG2``: both
    exponentials as 2^(x·log₂e) (FA2 numerics only; see :func:`exp_shifted`)."""
    # a row that has seen no key keeps m = -inf: use 0 so exp(-inf - m) is 0, not NaN
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if PAPER:   # the paper's code rounds S, S − m and P̄ to the low format
        shifted = round_low(round_low(qk * scale, LOW, EXPLICIT) - m_safe[:, None], LOW,
                            EXPLICIT)
        p_bar = round_low(tl.exp(shifted), LOW, EXPLICIT)
    else:
        p_bar = exp_shifted(qk, scale, m_safe[:, None], LOG2)
    shift = rnd_if(m - m_safe, PAPER, LOW, EXPLICIT)     # α = e^shift
    if LOG2:
        alpha = tl.exp2(shift * LOG2E)
    else:
        alpha = tl.exp(shift)
    alpha = rnd_if(alpha, PAPER, LOW, EXPLICIT)
    if PAPER:
        pv = mma(to_operand(p_bar, LOW, EXPLICIT), v, LOW, EXPLICIT)   # P̄ V_j
        row_sum = round_low(tl.sum(p_bar, 1), LOW, EXPLICIT)
        ell = round_low(round_low(alpha * ell, LOW, EXPLICIT) + row_sum, LOW, EXPLICIT)
        acc = round_low(round_low(alpha[:, None] * acc, LOW, EXPLICIT)
                        + round_low(pv, LOW, EXPLICIT), LOW, EXPLICIT)
    else:
        # Ō = α Ō + rnd(P̄) V_j; the addition happens inside the fp32 MMA accumulator
        # (only the fp32 summation order differs from computing P̄ V_j first)
        if ROUND_P:
            p_low = to_operand(p_bar, LOW, EXPLICIT)
            if ELL_ROUNDED:
                ell = alpha * ell + tl.sum(p_low.to(alpha.dtype), 1)
            else:
                ell = alpha * ell + tl.sum(p_bar, 1)
            acc = mma_acc(p_low, v, alpha[:, None] * acc, LOW, EXPLICIT)
        else:
            ell = alpha * ell + tl.sum(p_bar, 1)
            # O in full precision (δ source "o_fp32"): P̄ unrounded, fp32 products
            acc = tl.dot(p_bar, v.to(p_bar.dtype), alpha[:, None] * acc,
                         input_precision="ieee", out_dtype=acc.dtype)
    return ell, acc


@triton.jit
def batch_head(H):
    """This program's (batch, head) pair: the grid's second axis runs over batch × heads."""
    bh = tl.program_id(1)
    return bh, bh // H, bh % H


@triton.jit
def program_tile(BLOCK: tl.constexpr, N):
    """This program's tile along the grid's first axis: its index, its BLOCK row (or key)
    indices, and which of them are inside N."""
    tile = tl.program_id(0)
    rows = tile * BLOCK + tl.arange(0, BLOCK)
    return tile, rows, rows < N


@triton.jit
def load_row_tile(ptr, b, h, rows, ok, dims, stride_b, stride_h, stride_n, stride_d,
                  LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """The (rows × head_dim) tile of one (batch, head) of a (B, H, N, D) tensor; rows past the
    end (``ok`` false) read as 0."""
    return load_tile(ptr + b * stride_b + h * stride_h + rows[:, None] * stride_n
                     + dims[None, :] * stride_d, ok[:, None], LOW, EXPLICIT, True)


@triton.jit
def load_tile_pair(A, B, b, h, rows, ok, dims, strides_a, strides_b, LOW_A: tl.constexpr,
                   LOW_B: tl.constexpr, EXPLICIT: tl.constexpr):
    """The same rows of two (B, H, N, D) tensors: (Q, dO), (K, V) or (O, dO); ``strides_a``,
    ``strides_b``: each tensor's (batch, head, row, dim) strides, a tuple."""
    a = load_row_tile(A, b, h, rows, ok, dims, strides_a[0], strides_a[1], strides_a[2],
                      strides_a[3], LOW_A, EXPLICIT)
    b_tile = load_row_tile(B, b, h, rows, ok, dims, strides_b[0], strides_b[1], strides_b[2],
                           strides_b[3], LOW_B, EXPLICIT)
    return a, b_tile


@triton.jit
def load_rows(Q, DO, LSE, b, h, bh, rows, ok, dims, strides_q, strides_do, N_Q,
              LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """A query tile's Q, dO and L (the backward kernels that walk over key tiles)."""
    q, do = load_tile_pair(Q, DO, b, h, rows, ok, dims, strides_q, strides_do, LOW, LOW,
                           EXPLICIT)
    lse = tl.load(LSE + bh * N_Q + rows, mask=ok, other=0.0)
    return q, do, lse
