"""``flash_attention``: the book's Triton FlashAttention-2 as a differentiable torch function.

Usage mirrors ``torch.nn.functional.scaled_dot_product_attention`` on (batch, heads, seq,
head_dim) tensors::

    from kernels import flash_attention
    out = flash_attention(q, k, v, causal=True)               # plain FA2
    out = flash_attention(q, k, v, causal=True, stable=True)  # with the (β, ε) offset fix
    out.sum().backward()

:func:`backward_pass` runs the backward kernels on their own and also returns δ (chapter 4 uses
it). The forward kernel is :mod:`.flash_fwd`, the backward kernels and the eager backward pass
:mod:`.flash_bwd`; a new shape's first forward call has the launcher compile the backward's
kernels ahead, in the background. On a GPU with compute capability >= 8.0 bf16 runs natively;
in the CPU interpreter and on older GPUs the explicit-rounding path gives the same numbers (pass
``explicit=`` to force a path).
"""

from __future__ import annotations

import torch

from .custom_op import flash_attention_op
from .flash_bwd import Gradients, backward_gradients, compile_backward_ahead
from .flash_fwd import FORWARD, flash_forward
from .options import AttentionOptions, checked_call


class FlashAttention(torch.autograd.Function):
    """Forward: one kernel launch that stores O and L. Backward: δ, then dK/dV and dQ.

    Nothing is checked here: :func:`flash_attention` checked the inputs once, and the
    backward pass reuses the forward's options and rounding path as they are."""

    @staticmethod
    def forward(ctx, q, k, v, opts: AttentionOptions, explicit: bool):
        planned = FORWARD.first_launches
        out, lse, _ = flash_forward(q, k, v, opts, explicit=explicit, checked=True)
        if FORWARD.first_launches != planned and any(ctx.needs_input_grad[:3]):
            # a new shape: the backward's kernels compile in the background meanwhile
            compile_backward_ahead(q, k, v, out, lse, opts, explicit=explicit)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts, ctx.explicit = opts, explicit
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        g = backward_gradients(q, k, v, out, lse, grad_out, ctx.opts, ctx.explicit)
        return g.dq, g.dk, g.dv, None, None


def flash_attention(q, k, v, opts: AttentionOptions | None = None, *, explicit=None, **options):
    """softmax(Q Kᵀ · scale) V with the tiled FlashAttention-2 kernels; differentiable.

    Args:
        q, k, v: (batch, heads, seq, head_dim) tensors, one dtype (bf16, fp16, fp32, fp64),
            one device; head_dim in (16, 32, 64, 128); any strides.
        opts, **options: an :class:`AttentionOptions`, or its fields as keywords: ``causal``,
        ``scale``, ``stable``
            (False/"off", "tile": Algorithm 3 per key tile as in the paper, True/"cross": ties
            across tiles detected too), ``beta``, ``eps``, ``numerics`` ("fa2" or "paper"),
            ``delta_source`` ("o", "dp", "o_fp32"), ``block_m``, ``block_n`` (powers of two
            >= 16; default: autotuned on a GPU, 64×64 in the interpreter).
        explicit: force the explicit-rounding path (True) or hardware bf16 (False).
    """
    opts, explicit = checked_call(q, k, v, opts, options, explicit)
    if torch.compiler.is_compiling():  # the custom op: torch.compile captures it whole
        return flash_attention_op(q, k, v, opts, explicit)
    return FlashAttention.apply(q, k, v, opts, explicit)


def backward_pass(
    q,
    k,
    v,
    d_out,
    opts: AttentionOptions | None = None,
    *,
    out=None,
    lse=None,
    explicit=None,
    **options,
) -> Gradients:
    """The backward kernels on their own: dQ, dK, dV and δ for the upstream gradient ``d_out``.

    The forward pass runs first unless ``out`` and ``lse`` are given; giving another ``out``
    (an fp32 O, or O rounded differently) is how chapter 4 measures what the rounding of O does to
    δ and the gradients."""
    opts, explicit = checked_call(q, k, v, opts, options, explicit)
    if (out is None) != (lse is None):
        raise ValueError("give both out and lse (from the same forward pass), or neither")
    if out is None:
        out, lse, _ = flash_forward(q, k, v, opts, explicit=explicit, checked=True)
    return backward_gradients(q, k, v, out, lse, d_out, opts, explicit)
