"""A vectorised CPU emulator of the book's tiled flash-attention forward pass.

This is the *numerics contract* of the book. It computes, with plain torch ops in fp32 (fp64
when ``low`` is fp64), the same sequence of operations as the Triton kernel in
:mod:`kernels.attention.flash_fwd`, and rounds to the low-precision format (``low``) at exactly
the same points. Rows are independent, so it vectorises over batch, heads and *all* query rows
at once and loops only over key/value tiles of ``block_n`` columns: fast enough for interactive
sliders.

Two numerics modes mirror two real implementations.

The steps of each mode are the constants ``FA2_STEPS`` and ``PAPER_STEPS`` below (chapter 3
prints them). ``rnd(x)`` means "round the fp32 value ``x`` to the nearest ``low`` value, ties to
even"; everything else is fp32.

The offset rule (``stable``), with rm the row maximum, rs the number of scores within ε of it::

    "off"    m = running max of S                              (standard online softmax)
    "tile"   the paper's Algorithm 3 applied to each tile alone: rm, rs of this tile;
             c = β·rm if rm > 0 and rs > 1;  c = 0 if rm < 0 and rs > 1;  c = rm otherwise;
             m_new = max(m_old, c).   Ties that fall in different tiles are never seen.
    "cross"  the same rule on the running (rm, rs) of all tiles so far, so a tie split
             between tiles is detected. rs is carried across tiles: when a new tile raises
             the maximum by more than ε the old count drops to 0, otherwise it is kept; the
             count can then over-count, but "rs > 1" is decided exactly. As in "tile",
             m_new = max(m_old, rule): m never decreases, so α <= 1 always (a decreasing m
             gave α = inf and NaN outputs after a tied maximum below about −88 set m = 0).
    "always" (emulator only, Appendix C) the cross rule without the tie condition.
    "offset" (emulator only, Appendix C) m = running max + ``offset`` (a fixed shift, any sign).

Inputs are rounded to ``low`` first, so fp32 tensors holding arbitrary values are accepted.
Tensors may live on any device: on a GPU this is also the book's PyTorch implementation of the
paper's numerics (torch's bf16 casts round to nearest-even on every device).

The backward pass of the paper's numerics (:class:`EmulatedAttention`, :func:`paper_backward`) is
FA2's Algorithm 2 in PyTorch with a selectable source of δ; the GPT-2 chapter trains with it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..numerics.rounding import (
    round_mantissa,
    round_mantissa_stochastic,
    round_to_dtype,
    work_dtype,
)
from . import emulator_fused
from .options import AttentionOptions, check_tensors

FA2_STEPS = """``numerics="fa2"``  (FlashAttention-2, torch SDPA's flash backend, the Triton \
tutorial)
    per key tile j::

        S      = (Q K_jᵀ) * scale                 # fp32 accumulation, no rounding
        m_new  = offset rule (below) on the running maximum
        P̄      = exp(S - m_new)                   # fp32
        α      = exp(m_old - m_new)
        ℓ      = α ℓ + rowsum(P̄)                  # fp32, from the *unrounded* P̄
        acc    = α acc + rnd(P̄) V_j               # P̄ rounded to low before the matmul
    end::

        O = rnd(acc / ℓ)                          # the only rounding of the output
        L = m + log ℓ                             # fp32, kept for the backward pass"""

PAPER_STEPS = """``numerics="paper"``  (the paper's released pure-PyTorch FA2, every tensor held \
in bf16)
    per key tile j::

        S      = rnd(rnd(Q K_jᵀ) * scale)
        m_new  = offset rule on S (β·rm rounded to low as well)
        P̄      = rnd(exp(rnd(S - m_new)))
        α      = rnd(exp(rnd(m_old - m_new)))
        ℓ      = rnd(rnd(α ℓ) + rnd(rowsum(P̄)))
        acc    = rnd(rnd(α acc) + rnd(P̄ V_j))    # Ō itself lives in low precision
    end::

        O = rnd(acc / ℓ)                          # Ō rounded before the division
        L = m + log ℓ                             # fp32"""


@dataclass
class ForwardResult:
    out: torch.Tensor  # O, as ``low`` dtype
    lse: torch.Tensor  # L = m + log ℓ, working dtype (fp32 or fp64)
    row_offset: torch.Tensor  # the final m of each row (the value P̄ = exp(S - m) used)
    row_sum: torch.Tensor  # the final ℓ of each row
    ties: torch.Tensor  # bool: did the rule see a repeated maximum (rs > 1) at the end
    out_fp32: torch.Tensor  # Ō / ℓ before the final rounding (working dtype): "O in fp32"
    offset_growths: torch.Tensor | None = None  # per row: how often m grew after its first
    # visible tile (each growth rescales by α < 1)


_WATCHERS: list[list] = []


@contextlib.contextmanager
def watch():
    """``with watch() as seen:`` — ``seen`` gets the :class:`ForwardResult` of every
    :func:`flash_forward` call inside the block, in order (chapter 8 counts the growths of m
    with it: :func:`kernels.golden.implementations.count_offset_changes`)."""
    seen: list = []
    _WATCHERS.append(seen)
    try:
        yield seen
    finally:
        _WATCHERS.remove(seen)


class _Rounding:
    """The rounding points of one call: ``rnd`` exists in both modes, ``paper`` only when tensors
    are held in low precision, ``acc`` where Ō is rounded (bf16 or the amplifier format)."""

    def __init__(self, opts: AttentionOptions, low: torch.dtype):
        self.low, self.is_paper, self.opts = low, opts.numerics == "paper", opts

    def rnd(self, x):
        return round_to_dtype(x, self.low)

    def paper(self, x):
        return round_to_dtype(x, self.low) if self.is_paper else x

    def acc(self, x):
        bits = self.opts.acc_bits
        if bits is None:
            return self.rnd(x)
        if self.opts.acc_rounding == "sr":
            return round_mantissa_stochastic(x, bits)
        return round_mantissa(x, bits)


def rounding_points(numerics: str = "fa2", low: torch.dtype = torch.bfloat16) -> _Rounding:
    """The rounding points of ``numerics`` (``.rnd``, ``.paper``), for code outside the
    emulator that must round as it does (the lab's sliders)."""
    return _Rounding(AttentionOptions(numerics=numerics), low)


def _exp_offset(x, r: _Rounding):
    """exp(x) at the rounding points of ``r``: P̄ = exp(S − m) and α = exp(m_old − m_new)."""
    return r.paper(torch.exp(r.paper(x)))


def p_bar(s, m, numerics: str = "fa2", low: torch.dtype = torch.bfloat16):
    """P̄ = exp(S − m) as :func:`accumulate` computes it, rounded to ``low`` as it multiplies V
    (``m`` broadcasts against ``s``)."""
    r = rounding_points(numerics, low)
    return r.rnd(_exp_offset(s - m, r))


def offset_rule(rm, rs, beta, rnd, cap=None):
    """Algorithm 3's choice of m from a row maximum rm and a tie count rs; with ``cap``, m is
    at most rm + cap (the tied P̄ = e^(rm − m) stays ≥ e^−cap: ℓ cannot underflow)."""
    tied = rs > 1
    m = torch.where(tied & (rm > 0), rnd(beta * rm), rm)
    m = torch.where(tied & (rm < 0), torch.zeros_like(m), m)
    return m if cap is None else torch.minimum(m, rnd(rm + cap))


def offset_update(s, m, rm, rs, opts: AttentionOptions, r: _Rounding):
    """The offset m_new of this tile (the kernel's ``offset_update``). Returns
    (m_new, rm_new, rs, ties_now) with ties_now None where the rule does not track ties."""
    rm_tile = s.amax(-1)
    rm_new = torch.maximum(rm, rm_tile)  # raw running maximum of S
    ties_now = None
    if opts.stable == "tile":
        # masked (-inf) scores are never ties, even in a tile where every key is masked
        near_tile = r.paper(rm_tile - opts.eps).unsqueeze(-1)
        rs_tile = ((s >= near_tile) & torch.isfinite(s)).sum(-1).to(m.dtype)
        m_new = torch.maximum(m, offset_rule(rm_tile, rs_tile, opts.beta, r.paper, opts.offset_cap))
        ties_now = rs_tile > 1
    elif opts.stable in ("cross", "always"):
        near = r.paper(rm_new - opts.eps)
        carried = torch.where(rm >= near, rs, torch.zeros_like(rs))
        rs = carried + ((s >= near.unsqueeze(-1)) & torch.isfinite(s)).sum(-1).to(m.dtype)
        forced = torch.full_like(rs, 2.0) if opts.stable == "always" else rs
        # never lower m: a lower m would scale the old sums by α = exp(m_old − m_new) > 1,
        # which overflows to inf when an old tied maximum sat far below 0 (m_old = 0)
        m_new = torch.maximum(m, offset_rule(rm_new, forced, opts.beta, r.paper, opts.offset_cap))
        ties_now = rs > 1
    elif opts.stable == "offset":
        m_new = r.paper(rm_new + opts.offset)
    else:
        m_new = rm_new
    return m_new, rm_new, rs, ties_now


def accumulate(s, v_j, m, m_new, ell, acc, r: _Rounding):
    """ℓ = α ℓ + rowsum(P̄) and Ō = α Ō + rnd(P̄) V_j (the kernel's ``accumulate``)."""
    # A row with no visible key yet keeps m = -inf; exp(-inf - -inf) must give 0, not NaN.
    m_safe = torch.where(torch.isinf(m_new) & (m_new < 0), torch.zeros_like(m_new), m_new)
    if r.is_paper and emulator_fused.usable(s, r.low):  # the same bits in one pass (CUDA)
        p = emulator_fused.p_bar(s, m_safe)
    else:
        p = _exp_offset(s - m_safe.unsqueeze(-1), r)
    alpha = _exp_offset(m - m_safe, r)
    if r.is_paper:
        tile_sum = r.rnd(p.sum(-1))
        if r.opts.ell_clamp is not None and r.opts.ell_clamp_at == "tiles":
            tile_sum = r.rnd(tile_sum.clamp(min=r.opts.ell_clamp))  # the released code's clamp
        ell = r.rnd(r.rnd(alpha * ell) + tile_sum)
        acc = r.acc(r.acc(alpha.unsqueeze(-1) * acc) + r.acc(p @ v_j))
    else:
        p_low = r.rnd(p)  # what the matmul multiplies V by
        ell = alpha * ell + (p_low if r.opts.ell_rounded else p).sum(-1)
        acc = alpha.unsqueeze(-1) * acc + p_low @ v_j
    return ell, acc


def flash_forward(
    q, k, v, opts: AttentionOptions | None = None, *, low=torch.bfloat16, **options
) -> ForwardResult:
    """Emulate the tiled forward pass. Shapes (..., N, D); returns a :class:`ForwardResult`.

    ``opts`` (or its fields as keywords) says what to compute; ``block_n`` defaults to 64 keys
    (``block_m`` does not matter: rows are independent). ``acc_bits`` (paper numerics with
    ``low`` = bf16 only) holds Ō, and each tile's P̄V, in a float with bf16's exponent and only
    ``acc_bits`` mantissa bits (bf16 has 7): the GPT-2 chapter's amplifier."""
    opts = AttentionOptions(**options) if opts is None else opts
    check_tensors(q, k, v, kernel=False)
    if opts.acc_bits is not None and low != torch.bfloat16:
        raise ValueError(f"acc_bits needs low=torch.bfloat16, got {low}")
    r = _Rounding(opts, low)
    block_n = opts.block_n or 64
    work = work_dtype(low)
    q, k, v = (r.rnd(t.to(work)) for t in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = opts.scale_for(q.shape[-1])
    rows = torch.arange(n_q, device=q.device).unsqueeze(-1)
    m = torch.full((*q.shape[:-2], n_q), -math.inf, dtype=work, device=q.device)
    rm = torch.full_like(m, -math.inf)  # raw running max ("cross")
    rs = torch.zeros_like(m)  # running tie count ("cross")
    ell = torch.zeros_like(m)
    acc = torch.zeros(q.shape, dtype=work, device=q.device)
    ties = torch.zeros_like(m, dtype=torch.bool)
    grew = torch.zeros_like(m)
    for start in range(0, n_k, block_n):
        k_j, v_j = k[..., start : start + block_n, :], v[..., start : start + block_n, :]
        if r.is_paper and emulator_fused.usable(q, low):  # the same bits in one pass (CUDA)
            s = emulator_fused.scores(q, k_j, scale, opts.causal, col0=start)
        else:
            s = r.paper(r.paper(q @ k_j.transpose(-1, -2)) * scale)
            if opts.causal:
                cols = torch.arange(start, start + k_j.shape[-2], device=q.device)
                s = s.masked_fill(cols > rows, -math.inf)
        m_new, rm, rs, ties_now = offset_update(s, m, rm, rs, opts, r)
        if ties_now is not None:
            ties = (ties | ties_now) if opts.stable == "tile" else ties_now
        ell, acc = accumulate(s, v_j, m, m_new, ell, acc, r)
        grew += (torch.isfinite(m) & (m_new > m)).to(grew.dtype)
        m = m_new
    clamp_out = opts.ell_clamp is not None and opts.ell_clamp_at == "out"
    denominator = ell.clamp(min=opts.ell_clamp) if clamp_out else ell
    out_fp32 = acc / denominator.unsqueeze(-1)
    result = ForwardResult(
        out=r.rnd(out_fp32).to(low),
        lse=m + torch.log(ell),
        row_offset=m,
        row_sum=ell,
        ties=ties,
        out_fp32=out_fp32,
        offset_growths=grew,
    )
    for seen in _WATCHERS:
        seen.append(result)
    return result


# ----------------------------------------------------------------------------------------------
# The backward pass of the emulated numerics (FA2's Algorithm 2 in PyTorch)
# ----------------------------------------------------------------------------------------------
def paper_scores(q, k, scale, low, causal=True):
    """S as the paper's bf16 code forms it: rnd(rnd(QKᵀ)·scale), causal mask applied."""
    s = round_to_dtype(round_to_dtype(q @ k.transpose(-1, -2), low) * scale, low)
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(mask, -math.inf)
    return s


def delta_rowsum(source: str, d_out, *, out=None, out_fp32=None, d_probs=None, probs=None):
    """δ per row, as ``source`` says; the one place its formula is written in PyTorch (the
    kernels' δ pre-pass, :mod:`.flash_bwd`, computes the same in Triton):

    * "o": rowsum(dO ∘ O) from the rounded output ``out`` (FlashAttention-2's, the failing path);
    * "o_fp32": rowsum(dO ∘ O) from the unrounded output ``out_fp32`` (the stable control);
    * "o_hilo": rowsum(dO ∘ O_hi) + rowsum(dO ∘ O_lo), the fp32 output stored as two bf16 halves;
    * "dp": rowsum(dP ∘ P) from ``d_probs`` = dO Vᵀ and ``probs`` (never reads O).

    Operands in the caller's working dtype; only the ones its source reads are needed."""
    needs = {"o": ("out",), "o_fp32": ("out_fp32",), "o_hilo": ("out_fp32",),
             "dp": ("d_probs", "probs")}  # fmt: skip
    given = dict(out=out, out_fp32=out_fp32, d_probs=d_probs, probs=probs)
    if source not in needs:
        raise ValueError(f"unknown δ source {source!r}; one of {tuple(needs)}")
    missing = [name for name in needs[source] if given[name] is None]
    if missing:
        raise ValueError(f"δ source {source!r} needs {', '.join(missing)}")
    if source == "o":
        return (d_out * out).sum(-1)
    if source == "o_fp32":
        return (d_out * out_fp32).sum(-1)
    if source == "o_hilo":
        o_hi = round_to_dtype(out_fp32, torch.bfloat16)
        o_lo = round_to_dtype(out_fp32 - o_hi, torch.bfloat16)
        return (d_out * o_hi).sum(-1) + (d_out * o_lo).sum(-1)
    return (d_probs * probs).sum(-1)


def paper_backward(q, k, v, out_low, lse, d_out, opts: AttentionOptions, low, delta_hook=None):
    """dQ, dK, dV (working precision) of the emulated attention, δ taken as ``opts.delta_source``
    says: "o" rowsum(dO ∘ O_low) (the failing path), "dp" rowsum(dP ∘ P), "o_fp32" rowsum(dO ∘ PV)
    with PV in fp32 (the paper's stable control).

    ``delta_hook`` (or None) may replace or perturb δ before it enters dS: it is called as
    ``delta_hook(delta, d_out=, out_low=, probs=, values=)`` with the working-precision tensors
    (``values`` is V rounded as the forward saw it) and returns the δ to use. The GPT-2 chapter's
    δ controls (:mod:`kernels.gpt2.controls`) are such hooks. A hooked backward runs op by op even
    on a GPU (no fused kernels), as the controls' stored runs did, so their checkpoints resume on
    the same bits."""
    work = work_dtype(low)
    use_fused = delta_hook is None
    qw, kw, vw = (round_to_dtype(t.to(work), low) for t in (q, k, v))
    d_out = d_out.to(work)
    scale = opts.scale_for(q.shape[-1])
    if use_fused and emulator_fused.usable(qw, low):  # the same bits, fewer passes
        probs = emulator_fused.probs(qw, kw, lse.to(work), scale, opts.causal)
    else:
        scores = paper_scores(qw, kw, scale, low, opts.causal)  # recompute S as the forward did
        probs = torch.exp(scores - lse.to(work).unsqueeze(-1))  # P = exp(S - L)
    d_v = probs.transpose(-1, -2) @ d_out  # dV = Pᵀ dO
    d_probs = d_out @ vw.transpose(-1, -2)  # dP = dO Vᵀ
    source, out_work = opts.delta_source, out_low.to(work)
    delta = delta_rowsum(
        source,
        d_out,
        out=out_work,
        out_fp32=(probs @ vw) if source == "o_fp32" else None,  # PV in the working dtype
        d_probs=d_probs,
        probs=probs,
    )
    if delta_hook is not None:
        delta = delta_hook(delta, d_out=d_out, out_low=out_work, probs=probs, values=vw)
    if use_fused and emulator_fused.usable(probs, low):
        d_scores = emulator_fused.d_scores(d_probs, probs, delta)  # written over dP
    else:
        d_scores = probs * (d_probs - delta.unsqueeze(-1))  # dS = P ∘ (dP − δ)
    d_q = (d_scores @ kw) * scale  # dQ = α dS K
    d_k = (d_scores.transpose(-1, -2) @ qw) * scale  # dK = α dSᵀ Q
    return d_q, d_k, d_v


class EmulatedAttention(torch.autograd.Function):
    """Emulated forward (:func:`flash_forward`), Algorithm 2 backward (:func:`paper_backward`).

    Inputs (B, H, N, D) in any float dtype. With fp64 inputs nothing is rounded (``low`` = fp64),
    which is how the tests check the backward algebra against fp64 autograd."""

    @staticmethod
    def forward(ctx, q, k, v, opts: AttentionOptions):
        low = torch.float64 if q.dtype == torch.float64 else torch.bfloat16
        if low == torch.float64 and opts.acc_bits is not None:
            opts = opts.replace(acc_bits=None, acc_rounding="rne")
        with torch.autocast(device_type=q.device.type, enabled=False):
            res = flash_forward(q, k, v, opts, low=low)
        ctx.save_for_backward(q, k, v, res.out, res.lse)
        ctx.opts, ctx.low = opts, low
        return res.out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out_low, lse = ctx.saved_tensors
        with torch.autocast(device_type=q.device.type, enabled=False):
            d_q, d_k, d_v = paper_backward(q, k, v, out_low, lse, grad_out, ctx.opts, ctx.low)
        return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype), None
