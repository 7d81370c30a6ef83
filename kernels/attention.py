"""``flash_attention``: the book's Triton FlashAttention-2 as a differentiable torch function.

Usage mirrors ``torch.nn.functional.scaled_dot_product_attention`` on (batch, heads, seq,
head_dim) tensors::

    from kernels import flash_attention
    out = flash_attention(q, k, v, causal=True)            # plain FA2
    out = flash_attention(q, k, v, causal=True, stable=True)  # with the (β, ε) offset fix
    out.sum().backward()

The forward kernel is :mod:`kernels.flash_fwd`, the backward kernels :mod:`kernels.flash_bwd`.
On a GPU with compute capability >= 8.0 bf16 runs natively; in the CPU interpreter and on older
GPUs the explicit-rounding path gives the same numbers (pass ``explicit=`` to force a path).
"""
from __future__ import annotations

import math

import torch

from .flash_bwd import DELTA_SOURCES, flash_backward
from .flash_fwd import check_inputs, flash_forward, kernel_params, use_explicit


class FlashAttention(torch.autograd.Function):
    """Forward: one kernel launch that stores O and L. Backward: δ, then dK/dV and dQ."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, stable, beta, eps, numerics, delta_source,
                block_m, block_n, explicit):
        out, lse, _ = flash_forward(q, k, v, causal=causal, scale=scale, stable=stable,
                                    beta=beta, eps=eps, numerics=numerics, block_m=block_m,
                                    block_n=block_n, explicit=explicit)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.settings = dict(causal=causal, scale=scale, stable=stable, beta=beta, eps=eps,
                            numerics=numerics, delta_source=delta_source, block_m=block_m,
                            block_n=block_n, explicit=explicit)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        s = ctx.settings
        grad_out = grad_out.to(q.dtype)
        out_fp32 = None
        if s["delta_source"] == "o_fp32":
            # the same forward pass again, acc/ℓ stored without rounding it to bf16/fp16
            out_fp32, _, _ = flash_forward(q, k, v, causal=s["causal"], scale=s["scale"],
                                           stable=s["stable"], beta=s["beta"], eps=s["eps"],
                                           numerics=s["numerics"], block_m=s["block_m"],
                                           block_n=s["block_n"], explicit=s["explicit"],
                                           round_out=False)
        params = kernel_params(s["scale"], s["beta"], s["eps"], q.dtype, q.device)
        dq, dk, dv, _ = flash_backward(q, k, v, out, grad_out, lse, params, causal=s["causal"],
                                       delta_source=s["delta_source"], explicit=s["explicit"],
                                       block_m=s["block_m"], block_n=s["block_n"],
                                       out_fp32=out_fp32)
        return dq, dk, dv, *([None] * 10)


def flash_attention(q, k, v, *, causal=False, scale=None, stable=False, beta=2.0, eps=1e-3,
                    numerics="fa2", delta_source="o", block_m=None, block_n=None, explicit=None):
    """softmax(Q Kᵀ · scale) V with the tiled FlashAttention-2 kernels; differentiable.

    Args:
        q, k, v: (batch, heads, seq, head_dim) tensors, one dtype (bf16, fp16, fp32, fp64),
            one device; head_dim in (16, 32, 64, 128); any strides.
        causal: hide key j from query i when j > i.
        scale: multiplies QKᵀ; default 1/sqrt(head_dim).
        stable: the softmax-offset fix: False/"off", "tile" (Algorithm 3 per key tile, as in
            the paper), True/"cross" (ties across tiles detected too).
        beta, eps: the fix's parameters (beta > 1, eps >= 0).
        numerics: "fa2" (fp32 accumulation) or "paper" (S, P̄, ℓ, Ō held in bf16).
        delta_source: "o" (FA2), "dp" (rowsum(dP∘P)) or "o_fp32" (O recomputed in fp32).
        block_m, block_n: tile sizes (powers of two >= 16); default: autotuned on a GPU,
            64×64 in the interpreter.
        explicit: force the explicit-rounding path (True) or hardware bf16 (False).
    """
    stable = check_inputs(q, k, v, stable=stable, beta=beta, eps=eps, numerics=numerics,
                          block_m=block_m, block_n=block_n)
    if delta_source not in DELTA_SOURCES:
        raise ValueError(f"delta_source must be one of {DELTA_SOURCES}, got {delta_source!r}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a number or None, got {type(scale).__name__}")
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive finite number, got {scale}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    explicit = use_explicit(explicit)
    return FlashAttention.apply(q, k, v, bool(causal), scale, stable, float(beta), float(eps),
                                numerics, delta_source, block_m, block_n, explicit)
