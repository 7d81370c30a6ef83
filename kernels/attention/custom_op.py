"""The book's kernels as ``torch.library`` custom ops, so ``torch.compile`` can capture them.

Dynamo cannot look inside a Triton launch wrapped in a Python ``autograd.Function``: it breaks
the graph there, and a model compiled with the book's attention runs as many small graphs with
Python between them. A custom op is opaque instead. It carries two things:

* a *fake* implementation: the shapes and dtypes of the outputs without computing them, which
  is all the compiler needs to trace through the call;
* an autograd formula, here the book's backward kernels behind a second op.

:func:`kernels.attention.flash_attention` routes through these ops only while
``torch.compile`` traces (:func:`torch.compiler.is_compiling`); in eager mode it keeps its
direct :class:`~kernels.attention.autograd.FlashAttention` call, which costs less host time per
call. Both run the same kernels with the same options, so they compute the same bits.

The backward op runs the eager backward pass
(:func:`~kernels.attention.flash_bwd.backward_gradients`). An op's arguments must be tensors or
plain values, so the options travel as a string of their fields' values (:func:`options_key`,
read back by :func:`options_of`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools

import torch

from .flash_bwd import backward_gradients
from .flash_fwd import flash_forward
from .options import AttentionOptions


def options_key(opts: AttentionOptions) -> str:
    """``opts`` as the string an op receives: its fields' values, in order, as Python literals
    (built field by field, which ``torch.compile`` can trace; a dataclass ``repr`` it cannot)."""
    values = ", ".join(repr(getattr(opts, field.name)) for field in dataclasses.fields(opts))
    return f"({values},)"


@functools.lru_cache(maxsize=256)
def options_of(key: str) -> AttentionOptions:
    """The options a key stands for (one object per key, so its checks run once)."""
    return AttentionOptions(*ast.literal_eval(key))


@torch.library.custom_op("lpfa::flash_fwd", mutates_args=())
def flash_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key: str, explicit: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """O and L = m + log ℓ of the forward kernel (inputs checked by the caller)."""
    out, lse, _ = flash_forward(q, k, v, options_of(key), explicit=explicit, checked=True)
    return out, lse


@flash_fwd_op.register_fake
def _(q, k, v, key, explicit):
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=work)  # fresh and contiguous


@torch.library.custom_op("lpfa::flash_bwd", mutates_args=())
def flash_bwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    d_out: torch.Tensor,
    key: str,
    explicit: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV of the backward kernels."""
    g = backward_gradients(q, k, v, out, lse, d_out, options_of(key), explicit)
    return g.dq, g.dk, g.dv


@flash_bwd_op.register_fake
def _(q, k, v, out, lse, d_out, key, explicit):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, key, explicit = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.key, ctx.explicit = key, explicit


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = flash_bwd_op(q, k, v, out, lse, grad_out.contiguous(), ctx.key, ctx.explicit)
    return dq, dk, dv, None, None


flash_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def flash_attention_op(q, k, v, opts: AttentionOptions, explicit: bool) -> torch.Tensor:
    """O through the custom ops (differentiable; what ``torch.compile`` sees)."""
    out, _ = flash_fwd_op(q, k, v, options_key(opts), explicit)
    return out
