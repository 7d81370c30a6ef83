"""A vectorised CPU emulator of the book's tiled flash-attention forward pass.

This is the *numerics contract* of the book. It computes, with plain torch ops in fp32 (fp64
when ``low`` is fp64), the same sequence of operations as the Triton kernel in
:mod:`kernels.flash_fwd`, and rounds to the low-precision format (``low``) at exactly the same
points. Rows are independent, so it vectorises over batch, heads and *all* query rows at once
and loops only over key/value tiles of ``block_n`` columns: fast enough for interactive sliders.

Two numerics modes mirror two real implementations. ``rnd(x)`` below means "round the fp32
value ``x`` to the nearest ``low`` value, ties to even"; everything else is fp32.

``numerics="fa2"``  (FlashAttention-2, torch SDPA's flash backend, the Triton tutorial)
    per key tile j::

        S      = (Q K_jᵀ) * scale                 # fp32 accumulation, no rounding
        m_new  = offset rule (below) on the running maximum
        P̄      = exp(S - m_new)                   # fp32
        α      = exp(m_old - m_new)
        ℓ      = α ℓ + rowsum(P̄)                  # fp32, from the *unrounded* P̄
        acc    = α acc + rnd(P̄) V_j               # P̄ rounded to low before the matmul
    end::

        O = rnd(acc / ℓ)                          # the only rounding of the output
        L = m + log ℓ                             # fp32, kept for the backward pass

``numerics="paper"``  (the seed paper's pure-PyTorch FA2, every tensor held in bf16)
    per key tile j::

        S      = rnd(rnd(Q K_jᵀ) * scale)
        m_new  = offset rule on S (β·rm rounded to low as well)
        P̄      = rnd(exp(rnd(S - m_new)))
        α      = rnd(exp(rnd(m_old - m_new)))
        ℓ      = rnd(rnd(α ℓ) + rnd(rowsum(P̄)))
        acc    = rnd(rnd(α acc) + rnd(P̄ V_j))    # Ō itself lives in low precision
    end::

        O = rnd(acc / ℓ)                          # Ō rounded before the division
        L = m + log ℓ                             # fp32

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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

STABLE_MODES = ("off", "tile", "cross", "always", "offset")
NUMERICS = ("fa2", "paper")


def _dropped_bits(x: torch.Tensor, bits: int, who: str) -> int:
    """How many of fp32's 23 mantissa bits rounding to ``bits`` drops (checks dtype and range)."""
    if x.dtype != torch.float32:
        raise TypeError(f"{who} works on fp32 tensors, got {x.dtype}")
    if not 0 <= int(bits) <= 23:
        raise ValueError(f"an fp32 value has 0..23 mantissa bits to keep, got {bits}")
    return 23 - int(bits)


def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round fp32 ``x`` to ``bits`` explicit mantissa bits, ties to even, keeping fp32's exponent.

    ``bits=7`` is bf16 exactly (same exponent range); smaller ``bits`` give the narrower formats the
    GPT-2 chapter uses as an *amplifier* (bf16's range with fewer mantissa bits). Works on the bit
    pattern: add half an ulp minus one plus the kept last bit, then clear the dropped bits; a carry
    into the exponent is the correct rounding up, and inf stays inf.
    """
    drop = _dropped_bits(x, bits, "round_mantissa")
    if drop == 0:
        return x
    pattern = x.contiguous().view(torch.int32)
    kept_lsb = (pattern >> drop) & 1
    rounded = (pattern + ((1 << (drop - 1)) - 1) + kept_lsb) & ~((1 << drop) - 1)
    out = rounded.view(torch.float32)
    return torch.where(torch.isnan(x), x, out)


def round_mantissa_stochastic(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Stochastic rounding of fp32 ``x`` to ``bits`` mantissa bits: round away from zero with
    probability (distance to the lower neighbour) / ulp, so that E[result] = x. An unbiased
    rounding at the same width as :func:`round_mantissa` (its error spread is a little larger:
    standard deviation ≈ 0.41 ulp against 0.29): the control that tells a *biased* error from a
    merely large one. Draws from torch's global generator."""
    drop = _dropped_bits(x, bits, "round_mantissa_stochastic")
    if drop == 0:
        return x
    pattern = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << drop, x.shape, dtype=torch.int32, device=x.device)
    out = ((pattern + noise) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def round_to(x: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """Round ``x`` to the nearest ``low`` value (ties to even), keeping ``x``'s dtype."""
    if low == x.dtype or (low == torch.float64):
        return x
    return x.to(low).to(x.dtype)


@dataclass
class ForwardResult:
    out: torch.Tensor        # O, as ``low`` dtype
    lse: torch.Tensor        # L = m + log ℓ, working dtype (fp32 or fp64)
    row_offset: torch.Tensor  # the final m of each row (the value P̄ = exp(S - m) used)
    row_sum: torch.Tensor    # the final ℓ of each row
    ties: torch.Tensor       # bool: did the rule see a repeated maximum (rs > 1) at the end


def _offset_rule(rm, rs, beta, rnd):
    """Algorithm 3's choice of m from a row maximum rm and a tie count rs."""
    tied = rs > 1
    m = torch.where(tied & (rm > 0), rnd(beta * rm), rm)
    return torch.where(tied & (rm < 0), torch.zeros_like(m), m)


def _check(q, k, v, numerics, stable, beta, eps, block_n):
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    if stable not in STABLE_MODES:
        raise ValueError(f"stable must be one of {STABLE_MODES}, got {stable!r}")
    if stable != "off" and stable != "offset" and not beta > 1:
        raise ValueError(f"beta must be > 1 (got {beta}): with beta <= 1 the tied maxima keep P̄ = 1")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if block_n < 1:
        raise ValueError(f"block_n must be a positive number of keys, got {block_n}")
    if q.shape[:-2] != k.shape[:-2] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def flash_forward(q, k, v, *, causal=False, scale=None, numerics="fa2", low=torch.bfloat16,
                  block_n=64, stable="off", beta=2.0, eps=1e-3, offset=0.0,
                  acc_bits=None, acc_rounding="rne") -> ForwardResult:
    """Emulate the tiled forward pass. Shapes (..., N, D); returns a :class:`ForwardResult`.

    ``acc_bits`` (paper numerics with ``low`` = bf16 only) holds the unnormalised output Ō, and
    each tile's P̄V, in a float with bf16's exponent and only ``acc_bits`` mantissa bits (bf16 has
    7). The GPT-2 chapter uses it to magnify the rounding of Ō; everything else is unchanged.
    ``acc_rounding="sr"`` rounds Ō stochastically instead of to nearest-even (same width, no bias)."""
    _check(q, k, v, numerics, stable, beta, eps, block_n)
    if acc_bits is not None:
        if numerics != "paper" or low != torch.bfloat16:
            raise ValueError("acc_bits needs numerics='paper' and low=torch.bfloat16 "
                             f"(got numerics={numerics!r}, low={low})")
        if not 1 <= int(acc_bits) <= 7:
            raise ValueError(f"acc_bits must be 1..7 (bf16 keeps 7 mantissa bits), got {acc_bits}")
    if acc_rounding not in ("rne", "sr"):
        raise ValueError(f"acc_rounding must be 'rne' or 'sr', got {acc_rounding!r}")
    if acc_rounding == "sr" and acc_bits is None:
        raise ValueError("acc_rounding='sr' needs acc_bits (1..7): it rounds the amplifier format")
    work = torch.float64 if low == torch.float64 else torch.float32
    paper = numerics == "paper"

    def rnd(x):          # a rounding point that exists in both modes
        return round_to(x, low)

    def rnd_paper(x):    # a rounding point that exists only when tensors are held in low precision
        return round_to(x, low) if paper else x

    def rnd_acc(x):      # where Ō is rounded (bf16, or the narrower amplifier format)
        if acc_bits is None:
            return rnd(x)
        if acc_rounding == "sr":
            return round_mantissa_stochastic(x, acc_bits)
        return round_mantissa(x, acc_bits)

    q, k, v = (rnd(t.to(work)) for t in (q, k, v))
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    batch = q.shape[:-2]
    dev = q.device
    rows = torch.arange(n_q, device=dev).unsqueeze(-1)

    m = torch.full((*batch, n_q), -math.inf, dtype=work, device=dev)   # offset used so far
    rm = torch.full_like(m, -math.inf)                         # raw running max ("cross")
    rs = torch.zeros_like(m)                                   # running tie count ("cross")
    ell = torch.zeros_like(m)
    acc = torch.zeros((*batch, n_q, d), dtype=work, device=dev)
    ties = torch.zeros_like(m, dtype=torch.bool)

    for start in range(0, n_k, block_n):
        k_j, v_j = k[..., start:start + block_n, :], v[..., start:start + block_n, :]
        cols = torch.arange(start, start + k_j.shape[-2], device=dev)
        s = rnd_paper(rnd_paper(q @ k_j.transpose(-1, -2)) * scale)
        if causal:
            s = s.masked_fill(cols > rows, -math.inf)
        rm_tile = s.amax(-1)
        rm_new = torch.maximum(rm, rm_tile)          # raw running maximum of S
        if stable == "tile":
            # masked (-inf) scores are never ties, even in a tile where every key is masked
            near_tile = rnd_paper(rm_tile - eps).unsqueeze(-1)
            rs_tile = ((s >= near_tile) & torch.isfinite(s)).sum(-1).to(work)
            m_new = torch.maximum(m, _offset_rule(rm_tile, rs_tile, beta, rnd_paper))
            ties |= rs_tile > 1
        elif stable in ("cross", "always"):
            near = rnd_paper(rm_new - eps)
            carried = torch.where(rm >= near, rs, torch.zeros_like(rs))
            rs = carried + ((s >= near.unsqueeze(-1)) & torch.isfinite(s)).sum(-1).to(work)
            forced = torch.full_like(rs, 2.0) if stable == "always" else rs
            # never lower m: a lower m would scale the old sums by α = exp(m_old − m_new) > 1,
            # which overflows to inf when an old tied maximum sat far below 0 (m_old = 0)
            m_new = torch.maximum(m, _offset_rule(rm_new, forced, beta, rnd_paper))
            ties = rs > 1
        elif stable == "offset":
            m_new = rnd_paper(rm_new + offset)
        else:
            m_new = rm_new
        rm = rm_new
        # A row with no visible key yet keeps m = -inf; exp(-inf - -inf) must give 0, not NaN.
        m_safe = torch.where(torch.isinf(m_new) & (m_new < 0), torch.zeros_like(m_new), m_new)
        p_bar = rnd_paper(torch.exp(rnd_paper(s - m_safe.unsqueeze(-1))))
        alpha = rnd_paper(torch.exp(rnd_paper(m - m_safe)))
        if paper:
            ell = rnd(rnd(alpha * ell) + rnd(p_bar.sum(-1)))
            acc = rnd_acc(rnd_acc(alpha.unsqueeze(-1) * acc) + rnd_acc(p_bar @ v_j))
        else:
            ell = alpha * ell + p_bar.sum(-1)
            acc = alpha.unsqueeze(-1) * acc + rnd(p_bar) @ v_j
        m = m_new
    out = rnd(acc / ell.unsqueeze(-1)).to(low)
    lse = m + torch.log(ell)
    return ForwardResult(out=out, lse=lse, row_offset=m, row_sum=ell, ties=ties)
