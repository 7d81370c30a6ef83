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

It follows :mod:`kernels.emulate` operation by operation (the numerics contract), in both
numerics modes: ``PAPER=False`` is the FA2 recipe above; ``PAPER=True`` holds S, P̄, α, ℓ and
acc in the low format like the seed paper's PyTorch code. ``STABLE`` picks the offset rule:
0 = off, 1 = the paper's per-tile Algorithm 3, 2 = Algorithm 3 on the running (max, tie count)
of all tiles so far ("cross"), which also sees a tie split between two tiles.

The same source serves every machine through two compile-time switches:

``EXPLICIT=False`` (GPU >= sm_80)
    tiles stay bf16/fp16, ``tl.dot`` runs on tensor cores with fp32 accumulation and each
    rounding point is a hardware cast ``.to(tl.bfloat16)``.
``EXPLICIT=True`` (Triton interpreter, GPUs < sm_80)
    bf16 tensors arrive as their raw 16-bit patterns (``int16``), are widened to fp32 exactly,
    multiplied with ``tl.dot(..., input_precision="ieee")`` (a product of two bf16 numbers is
    exact in fp32) and rounded with :func:`kernels.rounding.round_low` at the same points.

fp32 inputs use ieee fp32 dots and no rounding; fp64 inputs compute everything in fp64
(``tl.dot`` accepts fp64 operands in Triton 3.6, in the interpreter and on sm_80+ GPUs).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .env import interpreting, native_bf16
from .rounding import LOW_CODES, round_low

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
STABLE_CODES = {"off": 0, "tile": 1, "cross": 2}
NUMERICS = ("fa2", "paper")
INTERPRETER_BLOCKS = (64, 64)   # fixed (block_m, block_n) in the CPU interpreter (the
                                # emulator's default block_n is 64 too)


# ----------------------------------------------------------------------------------------
# Small jit helpers shared with the backward kernels.
# ----------------------------------------------------------------------------------------
@triton.jit
def load_tile(ptrs, mask, LOW: tl.constexpr, EXPLICIT: tl.constexpr, MASKED: tl.constexpr):
    """Load a tile as the dtype ``tl.dot`` will take: low precision on the native path,
    fp32 (bf16/fp16/fp32 inputs) or fp64 on the explicit / high-precision paths."""
    if MASKED:
        x = tl.load(ptrs, mask=mask, other=0)
    else:
        x = tl.load(ptrs)
    if LOW == 0 and EXPLICIT:
        # raw bf16 bit patterns (int16): widen to the fp32 with the same value, exactly
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif LOW == 1 and EXPLICIT:
        x = x.to(tl.float32)
    return x


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
    if LOW == 0 and not EXPLICIT:
        return x.to(tl.bfloat16)
    elif LOW == 1 and not EXPLICIT:
        return x.to(tl.float16)
    else:
        return round_low(x, LOW, EXPLICIT)


@triton.jit
def mma(a, b, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """a @ b with fp32 accumulation (fp64 for fp64 inputs); ieee products off the native path."""
    if (LOW == 0 or LOW == 1) and not EXPLICIT:
        return tl.dot(a, b)
    else:
        return tl.dot(a, b, input_precision="ieee")


@triton.jit
def mma_acc(a, b, acc, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """acc + a @ b, the addition done inside the matmul (one fp32 accumulator)."""
    if (LOW == 0 or LOW == 1) and not EXPLICIT:
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
def _offset_rule(rm, rs, beta, PAPER: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """Algorithm 3: m = β·rm if rm > 0 and rs > 1; 0 if rm < 0 and rs > 1; rm otherwise."""
    tied = rs > 1
    m = tl.where(tied & (rm > 0), rnd_if(beta * rm, PAPER, LOW, EXPLICIT), rm)
    return tl.where(tied & (rm < 0), 0.0, m)


@triton.jit
def _fwd_tiles(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
               m, rm, rs, ell, acc, rows, lo, hi, N_K, scale, beta, eps,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
               CAUSAL: tl.constexpr, STABLE: tl.constexpr, PAPER: tl.constexpr,
               LOW: tl.constexpr, EXPLICIT: tl.constexpr, ROUND_P: tl.constexpr):
    """Key/value tiles [lo, hi): the online-softmax update. ``MASKED`` tiles may hold keys past
    the end of the sequence or (causal) keys after the query; the others are fully visible."""
    cols0 = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + cols0
        in_seq = cols < N_K
        k_t = load_tile(k_base + cols[None, :] * stride_kn + dims[:, None] * stride_kd,
                        in_seq[None, :], LOW, EXPLICIT, MASKED)             # Kᵀ: (D, BLOCK_N)
        v = load_tile(v_base + cols[:, None] * stride_vn + dims[None, :] * stride_vd,
                      in_seq[:, None], LOW, EXPLICIT, MASKED)               # V: (BLOCK_N, D)
        # S = (Q Kᵀ)·scale; the paper's code rounds the product and the scaled scores
        scores = rnd_if(mma(q, k_t, LOW, EXPLICIT), PAPER, LOW, EXPLICIT)
        scores = rnd_if(scores * scale, PAPER, LOW, EXPLICIT)
        if MASKED:
            visible = in_seq[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            scores = tl.where(visible, scores, float("-inf"))
        tile_max = tl.max(scores, 1)
        rm_new = tl.maximum(rm, tile_max)                  # raw running maximum of S
        if STABLE == 1:
            # the paper's rule on this tile alone: ties in other tiles are invisible
            near = rnd_if(tile_max - eps, PAPER, LOW, EXPLICIT)
            tile_ties = tl.sum(tl.where(scores >= near[:, None], 1.0, 0.0), 1)
            # a row whose keys are all masked in this tile has no tie (not "all tied at -inf")
            tile_ties = tl.where(tile_max == float("-inf"), 0.0, tile_ties).to(rm.dtype)
            m_new = tl.maximum(m, _offset_rule(tile_max, tile_ties, beta, PAPER, LOW, EXPLICIT))
        elif STABLE == 2:
            # the rule on the running maximum and running tie count of all tiles so far
            # (near is finite once a row has seen a key, so masked -inf scores never count)
            near = rnd_if(rm_new - eps, PAPER, LOW, EXPLICIT)
            carried = tl.where(rm >= near, rs, 0.0)        # old ties still within eps of the max?
            rs = carried + tl.sum(tl.where(scores >= near[:, None], 1.0, 0.0), 1).to(rm.dtype)
            # m never decreases (as in emulate.py): α = exp(m_old − m_new) <= 1 cannot overflow
            m_new = tl.maximum(m, _offset_rule(rm_new, rs, beta, PAPER, LOW, EXPLICIT))
        else:
            m_new = rm_new
        rm = rm_new
        # a row that has seen no key keeps m = -inf: use 0 so exp(-inf - m) is 0, not NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p_bar = tl.exp(rnd_if(scores - m_safe[:, None], PAPER, LOW, EXPLICIT))
        p_bar = rnd_if(p_bar, PAPER, LOW, EXPLICIT)
        alpha = rnd_if(tl.exp(rnd_if(m - m_safe, PAPER, LOW, EXPLICIT)), PAPER, LOW, EXPLICIT)
        if PAPER:
            pv = mma(to_operand(p_bar, LOW, EXPLICIT), v, LOW, EXPLICIT)   # P̄ V_j
            row_sum = round_low(tl.sum(p_bar, 1), LOW, EXPLICIT)
            ell = round_low(round_low(alpha * ell, LOW, EXPLICIT) + row_sum, LOW, EXPLICIT)
            acc = round_low(round_low(alpha[:, None] * acc, LOW, EXPLICIT)
                            + round_low(pv, LOW, EXPLICIT), LOW, EXPLICIT)
        else:
            ell = alpha * ell + tl.sum(p_bar, 1)
            # acc = α acc + rnd(P̄) V_j; the addition happens inside the fp32 MMA accumulator
            # (only the fp32 summation order differs from computing P̄ V_j first)
            if ROUND_P:
                acc = mma_acc(to_operand(p_bar, LOW, EXPLICIT), v, alpha[:, None] * acc,
                              LOW, EXPLICIT)
            else:
                # O in full precision (δ source "o_fp32"): P̄ unrounded, fp32 products
                acc = tl.dot(p_bar, v.to(p_bar.dtype), alpha[:, None] * acc,
                             input_precision="ieee", out_dtype=acc.dtype)
        m = m_new
    return m, rm, rs, ell, acc


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE, ROW_OFFSET, PARAMS,
                      stride_qb, stride_qh, stride_qn, stride_qd,
                      stride_kb, stride_kh, stride_kn, stride_kd,
                      stride_vb, stride_vh, stride_vn, stride_vd,
                      stride_ob, stride_oh, stride_on, stride_od,
                      H, N_Q, N_K,
                      HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, STABLE: tl.constexpr,
                      PAPER: tl.constexpr, LOW: tl.constexpr, EXPLICIT: tl.constexpr,
                      ROUND_OUT: tl.constexpr, STORE_OFFSET: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    # scale, beta, eps as the working dtype (fp32, or fp64 for fp64 inputs), read from memory
    scale = tl.load(PARAMS)
    beta = tl.load(PARAMS + 1)
    eps = tl.load(PARAMS + 2)

    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < N_Q
    q = load_tile(Q + b * stride_qb + h * stride_qh
                  + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
                  row_ok[:, None], LOW, EXPLICIT, True)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    work = PARAMS.dtype.element_ty
    m = tl.full([BLOCK_M], float("-inf"), work)    # offset used for P̄ so far
    rm = tl.full([BLOCK_M], float("-inf"), work)   # raw running maximum
    rs = tl.zeros([BLOCK_M], work)                 # running tie count ("cross")
    ell = tl.zeros([BLOCK_M], work)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], work)

    # Stage 1: tiles every row of this block sees completely (no mask needed).
    if CAUSAL:
        hi_full = (tl.minimum(start_m * BLOCK_M, N_K) // BLOCK_N) * BLOCK_N
    else:
        hi_full = (N_K // BLOCK_N) * BLOCK_N
    m, rm, rs, ell, acc = _fwd_tiles(q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                     stride_vd, m, rm, rs, ell, acc, rows, 0, hi_full, N_K,
                                     scale, beta, eps, BLOCK_N, HEAD_DIM, False, CAUSAL,
                                     STABLE, PAPER, LOW, EXPLICIT, ROUND_OUT)
    # Stage 2: the diagonal tiles (causal) and the ragged last tile; tiles that are masked
    # for every row of the block (keys after the block's last query) are skipped.
    if CAUSAL:
        hi = tl.minimum(start_m * BLOCK_M + BLOCK_M, N_K)
    else:
        hi = N_K
    m, rm, rs, ell, acc = _fwd_tiles(q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                                     stride_vd, m, rm, rs, ell, acc, rows, hi_full, hi, N_K,
                                     scale, beta, eps, BLOCK_N, HEAD_DIM, True, CAUSAL,
                                     STABLE, PAPER, LOW, EXPLICIT, ROUND_OUT)

    out = acc / ell[:, None]
    if ROUND_OUT:
        out = round_low(out, LOW, EXPLICIT)
    store_tile(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_on
               + dims[None, :] * stride_od, out, row_ok[:, None],
               ROUND_OUT and LOW == 0 and EXPLICIT)
    stat = bh * N_Q + rows
    tl.store(LSE + stat, m + tl.log(ell), mask=row_ok)
    if STORE_OFFSET:
        tl.store(ROW_OFFSET + stat, m, mask=row_ok)


def _autotune_configs():
    """A few tile shapes that suit an H100/A100 for head dims 64 and 128 (bf16/fp16 only)."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
            for bm, bn, warps, stages in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                                          (64, 64, 4, 3)]]


_flash_fwd_tuned = triton.autotune(configs=_autotune_configs(),
                                   key=["N_K", "HEAD_DIM", "CAUSAL", "STABLE", "PAPER", "LOW",
                                        "EXPLICIT", "ROUND_OUT"])(_flash_fwd_kernel)


# ----------------------------------------------------------------------------------------
# Python side: checks, path choice, launch.
# ----------------------------------------------------------------------------------------
def normalize_stable(stable) -> str:
    """False/'off' -> 'off', True/'cross' -> 'cross', 'tile' -> 'tile'."""
    if stable is False or stable is None:
        return "off"
    if stable is True:
        return "cross"
    if isinstance(stable, str) and stable in STABLE_CODES:
        return stable
    raise ValueError(f"stable must be False, True, 'off', 'tile' or 'cross', got {stable!r}")


def check_inputs(q, k, v, *, stable="off", beta=2.0, eps=1e-3, numerics="fa2",
                 block_m=None, block_n=None):
    """Raise a clear TypeError/ValueError for anything the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: bfloat16, float16, "
                            "float32, float64")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cuda" and interpreting():
        raise ValueError("TRITON_INTERPRET=1 is set but the tensors are on the GPU: move them "
                         "to the CPU or unset TRITON_INTERPRET before importing kernels")
    if q.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need the Triton interpreter (import kernels before triton "
                         "on a machine without a GPU), or move the tensors to the GPU")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, heads "
                         "and head_dim")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {q.shape[3]} is not supported; supported head dims: "
                         f"{SUPPORTED_HEAD_DIMS}")
    if q.shape[2] < 1 or k.shape[2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got {q.shape[2]} and {k.shape[2]}")
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    stable = normalize_stable(stable)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        raise TypeError(f"beta must be a number, got {type(beta).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a number, got {type(eps).__name__}")
    if stable != "off" and not beta > 1:
        raise ValueError(f"beta must be > 1 (got {beta}): with beta <= 1 tied maxima keep P̄ = 1")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if blk is not None and (not isinstance(blk, int) or blk < 16 or blk & (blk - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk!r}")
    return stable


@functools.lru_cache(maxsize=1)
def _native_bf16() -> bool:
    return native_bf16()   # cached: it queries the device, and this runs on every call


def use_explicit(explicit=None) -> bool:
    """The rounding path: explicit iff interpreting or the GPU is older than sm_80."""
    if explicit is None:
        return not _native_bf16()
    if not isinstance(explicit, bool):
        raise TypeError(f"explicit must be None, True or False, got {explicit!r}")
    if not explicit and not _native_bf16():
        raise ValueError("explicit=False needs a CUDA GPU with compute capability >= 8.0 "
                         "(the interpreter and older GPUs cannot round bf16 in hardware)")
    return explicit


def as_kernel_arg(t: torch.Tensor, explicit: bool) -> torch.Tensor:
    """On the explicit path bf16 tensors travel as their raw 16-bit patterns."""
    return t.view(torch.int16) if (explicit and t.dtype == torch.bfloat16) else t


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


_PARAMS_CACHE: dict = {}

# Fill outputs with NaN before each launch so a missed write shows (the tests turn it on; on a
# GPU it costs an extra memset per output, so it is off there by default).
POISON_OUTPUTS = interpreting()


def new_output(shape, dtype, device):
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def kernel_params(scale, beta, eps, dtype, device) -> torch.Tensor:
    """scale, beta, eps as a tiny tensor of the working dtype (fp64 stays exact for fp64).

    Cached: building it each call would be a blocking host-to-GPU copy per attention call."""
    key = (float(scale), float(beta), float(eps), work_dtype(dtype), str(device))
    if key not in _PARAMS_CACHE:
        if len(_PARAMS_CACHE) > 256:
            _PARAMS_CACHE.clear()
        _PARAMS_CACHE[key] = torch.tensor(key[:3], dtype=key[3], device=device)
    return _PARAMS_CACHE[key]


def pick_blocks(block_m, block_n, dtype, explicit):
    """Caller's blocks; else fixed small ones in the interpreter and for the fp32-dot paths
    (fp32, fp64, explicit rounding); else None: autotune (native bf16/fp16 on a GPU)."""
    if block_m is None and block_n is None and not interpreting() and not explicit \
            and dtype in (torch.bfloat16, torch.float16):
        return None
    if interpreting():
        dm, dn = INTERPRETER_BLOCKS
    elif dtype == torch.float64:
        dm, dn = 32, 32
    else:
        dm, dn = 64, 32
    return (block_m or dm, block_n or dn)


def flash_forward(q, k, v, *, causal=False, scale=None, stable="off", beta=2.0, eps=1e-3,
                  numerics="fa2", block_m=None, block_n=None, explicit=None, round_out=True,
                  return_offset=False):
    """Run the forward kernel on (batch, heads, seq, head_dim) tensors.

    Returns ``(out, lse, row_offset)``: ``out`` in the inputs' dtype, or with
    ``round_out=False`` in fp32 for low-precision inputs: O computed without FA2's two roundings
    (P̄ before P̄V, and acc/ℓ), ``lse`` (fp32, fp64 for fp64
    inputs) of shape (batch, heads, seq_q), and the final offset m per row if
    ``return_offset`` (else None).
    """
    stable = check_inputs(q, k, v, stable=stable, beta=beta, eps=eps, numerics=numerics,
                          block_m=block_m, block_n=block_n)
    explicit = use_explicit(explicit)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    work = work_dtype(q.dtype)
    low_out = round_out or q.dtype in (torch.float32, torch.float64)
    out = new_output(q.shape, q.dtype if low_out else work, q.device)
    lse = new_output((batch, heads, n_q), work, q.device)
    offset = new_output(lse.shape, work, q.device) if return_offset else lse
    params = kernel_params(scale, beta, eps, q.dtype, q.device)
    qa, ka, va = (as_kernel_arg(t, explicit) for t in (q, k, v))
    oa = as_kernel_arg(out, explicit)
    args = (qa, ka, va, oa, lse, offset, params, *qa.stride(), *ka.stride(), *va.stride(),
            *oa.stride(), heads, n_q, n_k)
    consts = dict(HEAD_DIM=d, CAUSAL=bool(causal), STABLE=STABLE_CODES[stable],
                  PAPER=numerics == "paper", LOW=LOW_CODES[q.dtype], EXPLICIT=explicit,
                  ROUND_OUT=bool(low_out), STORE_OFFSET=bool(return_offset))
    blocks = pick_blocks(block_m, block_n, q.dtype, explicit)
    if blocks is None:
        grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), batch * heads)  # noqa: E731
        _flash_fwd_tuned[grid](*args, **consts)
    else:
        grid = (triton.cdiv(n_q, blocks[0]), batch * heads)
        _flash_fwd_kernel[grid](*args, **consts, BLOCK_M=blocks[0], BLOCK_N=blocks[1])
    return out, lse, (offset if return_offset else None)
