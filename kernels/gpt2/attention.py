"""Causal self-attention, switchable per layer, for the GPT-2 chapter.

An attention *spec* is a short string ``kind[:key=value,...]``:

``sdpa``        torch ``scaled_dot_product_attention`` (FlashAttention-2 on a CUDA GPU under bf16)
``math32``      plain softmax(QKᵀ/√d)V computed in fp32 (autocast switched off)
``triton``      the book's Triton FA2 (``kernels.flash_attention``); options numerics=fa2|paper,
                delta, stable=off|cross|tile, beta, eps, block (key tile width)
``paper``       the seed paper's bf16 PyTorch FA2: forward = :func:`kernels.emulate.flash_forward`
                with ``numerics="paper"`` (S, P̄, Ō, ℓ held in bf16), backward = FA2's Algorithm 2
                in PyTorch. Options:
                  delta=o | dp | o_fp32   where δ comes from (§3.2 of the paper):
                      o       rowsum(dO ∘ O) with the bf16 O of the forward pass (the failing path)
                      dp      rowsum(dP ∘ P)                      (mathematically equal, no O)
                      o_fp32  rowsum(dO ∘ PV) with PV recomputed in fp32 (the paper's stable control)
                  stable=off | cross | tile, beta=2, eps=1e-3   (Algorithm 3's offset, §4)
                  block=0 (untiled: one tile of the whole sequence, the paper's setup) or a tile width
                  obits=7 mantissa bits of Ō and of P̄V (7 = bf16; fewer magnifies their rounding,
                      the chapter's amplifier; the exponent stays bf16's)
                  oround=rne | sr  how Ō is rounded at obits < 7: to nearest-even, or stochastically
                      (unbiased, same error size: the control for "biased, not just large")

Examples: ``"paper"``, ``"paper:delta=o_fp32"``, ``"paper:stable=cross,beta=2"``, ``"paper:obits=3"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..emulate import flash_forward, round_to
from ..reference import standard_attention

KINDS = ("sdpa", "math32", "triton", "paper")
DELTAS = ("o", "dp", "o_fp32")


@dataclass(frozen=True)
class AttnSpec:
    kind: str = "sdpa"
    delta: str = "o"
    stable: str = "off"
    beta: float = 2.0
    eps: float = 1e-3
    block: int = 0
    numerics: str = "fa2"      # only for kind="triton"
    obits: int = 7             # only for kind="paper": mantissa bits of Ō (7 = bf16)
    oround: str = "rne"        # only for kind="paper" with obits < 7: "rne" or "sr"

    def __str__(self):
        if self.kind in ("sdpa", "math32"):
            return self.kind
        opts = [f"delta={self.delta}"] + ([f"numerics={self.numerics}"] if self.kind == "triton" else [])
        opts.append(f"stable={self.stable}")
        if self.stable != "off":
            opts += [f"beta={self.beta:g}", f"eps={self.eps:g}"]
        if self.block:
            opts.append(f"block={self.block}")
        if self.obits != 7:
            opts.append(f"obits={self.obits}")
        if self.oround != "rne":
            opts.append(f"oround={self.oround}")
        return f"{self.kind}:" + ",".join(opts)


def parse_spec(text: str) -> AttnSpec:
    """Parse ``"paper:delta=o_fp32,stable=cross"`` into an :class:`AttnSpec` (clear errors)."""
    if isinstance(text, AttnSpec):
        return text
    if not isinstance(text, str):
        raise TypeError(f"an attention spec is a string like 'paper:delta=o', got {type(text).__name__}")
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise ValueError(f"attention kind must be one of {KINDS}, got {kind!r} (in {text!r})")
    fields = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"attention option {item!r} in {text!r} is not key=value")
        key = key.strip()
        if key in ("beta", "eps"):
            fields[key] = float(value)
        elif key in ("block", "obits"):
            fields[key] = int(value)
        elif key in ("delta", "stable", "numerics", "oround"):
            fields[key] = value.strip()
        else:
            raise ValueError(f"unknown attention option {key!r} in {text!r}")
    spec = AttnSpec(kind=kind, **fields)
    if spec.delta not in DELTAS:
        raise ValueError(f"delta must be one of {DELTAS}, got {spec.delta!r}")
    if spec.stable not in ("off", "cross", "tile"):
        raise ValueError(f"stable must be off, cross or tile, got {spec.stable!r}")
    if spec.numerics not in ("fa2", "paper"):
        raise ValueError(f"numerics must be fa2 or paper, got {spec.numerics!r}")
    if not 1 <= spec.obits <= 7:
        raise ValueError(f"obits must be 1..7 (bf16 keeps 7 mantissa bits), got {spec.obits}")
    if spec.obits != 7 and spec.kind != "paper":
        raise ValueError(f"obits applies to the 'paper' kind only, got it with {spec.kind!r}")
    if spec.oround not in ("rne", "sr"):
        raise ValueError(f"oround must be rne or sr, got {spec.oround!r}")
    if spec.oround == "sr" and spec.obits == 7:
        raise ValueError("oround=sr needs obits < 7 (it rounds the narrower amplifier format)")
    return spec


def paper_scores(q, k, scale, low):
    """S as the paper's bf16 code forms it: rnd(rnd(QKᵀ)·scale), causal mask applied."""
    s = round_to(round_to(q @ k.transpose(-1, -2), low) * scale, low)
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, -math.inf)


class PaperFlashAttention(torch.autograd.Function):
    """The paper's bf16 FA2: emulated forward, Algorithm 2 backward with a selectable δ.

    Inputs (B, H, N, D) in any float dtype. With fp64 inputs nothing is rounded (``low`` = fp64),
    which is how the tests check the backward algebra against fp64 autograd.
    """

    @staticmethod
    def forward(ctx, q, k, v, delta, stable, beta, eps, block, obits=7, oround="rne"):
        low = torch.float64 if q.dtype == torch.float64 else torch.bfloat16
        n = q.shape[-2]
        acc_bits = obits if (obits != 7 and low == torch.bfloat16) else None
        with torch.autocast(device_type=q.device.type, enabled=False):
            res = flash_forward(q, k, v, causal=True, numerics="paper", low=low,
                                block_n=block or n, stable=stable, beta=beta, eps=eps, acc_bits=acc_bits,
                                acc_rounding=oround if acc_bits else "rne")
        ctx.save_for_backward(q, k, v, res.out, res.lse)
        ctx.delta, ctx.low = delta, low
        return res.out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out_low, lse = ctx.saved_tensors
        work = torch.float64 if ctx.low == torch.float64 else torch.float32
        with torch.autocast(device_type=q.device.type, enabled=False):
            qw, kw, vw = (round_to(t.to(work), ctx.low) for t in (q, k, v))
            d_out = grad_out.to(work)
            scale = 1.0 / math.sqrt(q.shape[-1])
            scores = paper_scores(qw, kw, scale, ctx.low)          # recompute S as the forward did
            probs = torch.exp(scores - lse.to(work).unsqueeze(-1))  # P = exp(S - L)
            d_v = probs.transpose(-1, -2) @ d_out                   # dV = Pᵀ dO
            d_probs = d_out @ vw.transpose(-1, -2)                  # dP = dO Vᵀ
            if ctx.delta == "o":
                delta = (d_out * out_low.to(work)).sum(-1)          # δ = rowsum(dO ∘ O_lp)
            elif ctx.delta == "dp":
                delta = (d_probs * probs).sum(-1)                   # δ = rowsum(dP ∘ P)
            else:
                delta = (d_out * (probs @ vw)).sum(-1)              # δ = rowsum(dO ∘ PV), PV in fp32
            d_scores = probs * (d_probs - delta.unsqueeze(-1))      # dS = P ∘ (dP − δ)
            d_q = (d_scores @ kw) * scale                           # dQ = α dS K
            d_k = (d_scores.transpose(-1, -2) @ qw) * scale         # dK = α dSᵀ Q
        return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype), None, None, None, None, None, None, None


def _triton_attention(q, k, v, spec: AttnSpec):
    try:
        from .. import flash_attention  # the book's Triton FA2 (another chapter's module)
    except ImportError as err:
        raise RuntimeError("attention kind 'triton' needs kernels.flash_attention, which this "
                           "checkout does not have yet; use 'paper' or 'sdpa'") from err
    return flash_attention(q, k, v, causal=True, numerics=spec.numerics, stable=spec.stable,
                           beta=spec.beta, eps=spec.eps, delta_source=spec.delta,
                           block_n=spec.block or None)


def attend(q, k, v, spec: AttnSpec):
    """softmax(QKᵀ/√d)V, causal, computed the way ``spec`` says. Shapes (B, H, N, D)."""
    if spec.kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if spec.kind == "math32":
        with torch.autocast(device_type=q.device.type, enabled=False):
            return exact_attention(q.float(), k.float(), v.float())
    if spec.kind == "paper":
        return PaperFlashAttention.apply(q, k, v, spec.delta, spec.stable, spec.beta, spec.eps, spec.block,
                                         spec.obits, spec.oround)
    return _triton_attention(q, k, v, spec)


def exact_attention(q, k, v):
    """Causal softmax attention in the dtype of the inputs (no rounding inside)."""
    return standard_attention(q, k, v, causal=True)
