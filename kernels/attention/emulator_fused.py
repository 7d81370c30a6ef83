"""The paper's bf16 attention, the same bits in fewer passes over the scores (CUDA only).

The emulator forms S, P̄ and the backward pass's P with one torch op per rounding. On the GPT-2
chapter's shapes (64 sequences × 4 heads × 256 × 256 scores per layer) every op is a full pass
over a 67 MB tensor, and a training step makes about 800 kernel launches. The kernels below
fuse each *elementwise* chain into one pass:

    scores     S  = rnd(rnd(QKᵀ) · scale), −inf above the diagonal   (in place on QKᵀ)
    p_bar      P̄  = rnd(exp(rnd(S − m)))                             (m: one offset per row)
    probs      P  = exp(rnd(rnd(QKᵀ) · scale) − L)                    (backward, in place on QKᵀ)
    d_scores   dS = P ∘ (dP − δ)                                      (backward, in place on dP)

Matmuls and row reductions stay torch's own, so every sum is added in the order it was before;
rounding is the explicit round-to-nearest-even of :mod:`kernels.numerics.triton_rounding`
(bit-identical to the hardware's), and ``exp`` is libdevice's ``expf``, the function torch's
CUDA ``exp`` calls. So the fused path must give the *same bits* as the emulator:
``python -m kernels.gpt2.fast_step_check`` checks that on the GPU before any run relies on it, the
``fused`` speed-up (:mod:`.launcher`) switches the path off, and ``FUSED_EXP = False`` keeps
torch's own ``exp`` (one more pass) should the two ever differ.
On a CPU the emulator never calls these kernels (the interpreter would be slower than torch);
the unit tests run them through the interpreter on small tensors.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..numerics.triton_rounding import round_to_bf16
from .launcher import switches

BLOCK = 1024
FUSED_EXP = True  # False: the kernels stop before exp, torch.exp_ runs in place after
# the interpreter has no libdevice: there (CPU tests only) exp is NumPy's, through tl.exp
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def usable(x: torch.Tensor, low: torch.dtype) -> bool:
    """True where the fused kernels apply: a CUDA tensor, bf16 rounding, the ``fused`` speed-up
    on (off, the emulator runs op by op, as on a CPU)."""
    return switches.CURRENT.fused and x.is_cuda and low == torch.bfloat16


@triton.jit
def _exp(x, INTERPRETED: tl.constexpr):
    if INTERPRETED:
        return tl.exp(x)
    return libdevice.exp(x)  # expf, the function torch's CUDA exp calls


@triton.jit
def _row_col(offs, n_q, n_k, col0):
    return (offs // n_k) % n_q, col0 + offs % n_k


@triton.jit
def _scores_kernel(x_ptr, total, n_q, n_k, col0, scale, CAUSAL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    s = round_to_bf16(round_to_bf16(tl.load(x_ptr + offs, mask=inside)) * scale)
    if CAUSAL:
        row, col = _row_col(offs, n_q, n_k, col0)
        s = tl.where(col > row, float("-inf"), s)
    tl.store(x_ptr + offs, s, mask=inside)


@triton.jit
def _p_bar_kernel(
    s_ptr,
    m_ptr,
    out_ptr,
    total,
    n_k,
    EXP: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    shifted = round_to_bf16(
        tl.load(s_ptr + offs, mask=inside) - tl.load(m_ptr + offs // n_k, mask=inside)
    )
    if EXP:
        shifted = round_to_bf16(_exp(shifted, INTERPRETED))
    tl.store(out_ptr + offs, shifted, mask=inside)


@triton.jit
def _probs_kernel(
    x_ptr,
    lse_ptr,
    total,
    n_q,
    n_k,
    scale,
    CAUSAL: tl.constexpr,
    EXP: tl.constexpr,
    INTERPRETED: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    s = round_to_bf16(round_to_bf16(tl.load(x_ptr + offs, mask=inside)) * scale)
    if CAUSAL:
        row, col = _row_col(offs, n_q, n_k, 0)
        s = tl.where(col > row, float("-inf"), s)
    shifted = s - tl.load(lse_ptr + offs // n_k, mask=inside)
    if EXP:
        shifted = _exp(shifted, INTERPRETED)
    tl.store(x_ptr + offs, shifted, mask=inside)


@triton.jit
def _round_kernel(x_ptr, total, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    tl.store(x_ptr + offs, round_to_bf16(tl.load(x_ptr + offs, mask=inside)), mask=inside)


@triton.jit
def _d_scores_kernel(dp_ptr, p_ptr, delta_ptr, total, n_k, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < total
    dp = tl.load(dp_ptr + offs, mask=inside)
    p = tl.load(p_ptr + offs, mask=inside)
    tl.store(dp_ptr + offs, p * (dp - tl.load(delta_ptr + offs // n_k, mask=inside)), mask=inside)


def _grid(t: torch.Tensor):
    return (triton.cdiv(t.numel(), BLOCK),)


def _check(*tensors):
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(
                f"fused kernels take contiguous fp32 tensors, got {t.dtype}, "
                f"contiguous={t.is_contiguous()}"
            )


def scores(q, k, scale: float, causal: bool, col0: int = 0) -> torch.Tensor:
    """S = rnd(rnd(Q Kᵀ)·scale), −inf where key col0 + j lies after query i (fp32 in, fp32 out)."""
    s = (q @ k.transpose(-1, -2)).contiguous()
    _check(s)
    _scores_kernel[_grid(s)](
        s, s.numel(), s.shape[-2], s.shape[-1], col0, scale, causal, BLOCK=BLOCK
    )
    return s


def p_bar(s, m) -> torch.Tensor:
    """P̄ = rnd(exp(rnd(S − m))) with one m per row."""
    m = m.contiguous()
    _check(s, m)
    out = torch.empty_like(s)
    _p_bar_kernel[_grid(s)](s, m, out, s.numel(), s.shape[-1], FUSED_EXP, _INTERPRETED, BLOCK=BLOCK)
    if not FUSED_EXP:
        out.exp_()
        _round_kernel[_grid(out)](out, out.numel(), BLOCK=BLOCK)
    return out


def probs(q, k, lse, scale: float, causal: bool) -> torch.Tensor:
    """P = exp(S − L) of the backward pass, S formed as the forward formed it."""
    p = (q @ k.transpose(-1, -2)).contiguous()
    lse = lse.contiguous()
    _check(p, lse)
    _probs_kernel[_grid(p)](
        p,
        lse,
        p.numel(),
        p.shape[-2],
        p.shape[-1],
        scale,
        causal,
        FUSED_EXP,
        _INTERPRETED,
        BLOCK=BLOCK,
    )
    return p if FUSED_EXP else p.exp_()


def d_scores(d_probs, p, delta) -> torch.Tensor:
    """dS = P ∘ (dP − δ), written over dP."""
    delta = delta.contiguous()
    _check(d_probs, p, delta)
    _d_scores_kernel[_grid(p)](d_probs, p, delta, p.numel(), p.shape[-1], BLOCK=BLOCK)
    return d_probs
