"""The book's kernels under ``torch.compile``: captured whole through the custom ops of
:mod:`kernels.attention.custom_op`, and computing the same bits as in eager mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.attention import AttentionOptions, flash_attention
from kernels.attention.custom_op import flash_fwd_op, options_key, options_of
from kernels.attention.options import STABLE_OFF_ON
from kernels.gpt2 import GPT, GPTConfig
from kernels.interpreter import interpreting

DEVICE = "cpu" if interpreting() else "cuda"  # kernels.gpu.check runs this file on a GPU


def fresh(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()


def test_options_survive_the_trip_through_a_string():
    opts = AttentionOptions(
        causal=True, stable="cross", beta=float(torch.rand(1)) + 1.5, eps=2.0**-9, block_n=32
    )
    back = options_of(options_key(opts))
    assert back == opts
    assert [f.name for f in dataclasses.fields(back)] == [f.name for f in dataclasses.fields(opts)]


def test_fake_implementation_gives_the_real_shapes_strides_and_dtypes():
    # transposed views, as a model's q, k, v are: the outputs are fresh and contiguous anyway
    q, k, v = (fresh(2, 48, 2, 16).detach().transpose(1, 2) for _ in "qkv")
    key = options_key(AttentionOptions(causal=True))
    out, lse = flash_fwd_op(q, k, v, key, True)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = flash_fwd_op(*(mode.from_tensor(t) for t in (q, k, v)), key, True)
    for real, traced in zip((out, lse), fake):
        assert (traced.shape, traced.stride(), traced.dtype) == (
            real.shape,
            real.stride(),
            real.dtype,
        )
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()


@pytest.mark.parametrize("stable", STABLE_OFF_ON)
def test_compiled_attention_has_no_graph_break_and_the_same_bits(stable):
    q, k, v = (fresh(1, 2, 64, 16) for _ in "qkv")
    call = lambda q, k, v: flash_attention(q, k, v, causal=True, stable=stable)  # noqa: E731
    explained = torch._dynamo.explain(call)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    d_out = torch.randn(q.shape, device=DEVICE).bfloat16()
    eager = call(q, k, v)
    grads_eager = torch.autograd.grad(eager, (q, k, v), d_out)
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)(q, k, v)
    grads_compiled = torch.autograd.grad(compiled, (q, k, v), d_out)
    assert torch.equal(eager, compiled)
    for name, a, b in zip("qkv", grads_eager, grads_compiled):
        assert torch.equal(a, b), f"d{name} differs between eager and compiled"


def test_a_compiled_gpt2_block_with_the_books_attention_matches_eager():
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, attn="triton")
    model = GPT(config).to(DEVICE)
    tokens = torch.randint(0, 256, (2, 32), device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        eager_loss = model(tokens, tokens)[1]
        eager_grads = torch.autograd.grad(eager_loss, list(model.parameters()))
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        compiled_loss = compiled(tokens, tokens)[1]
        compiled_grads = torch.autograd.grad(compiled_loss, list(model.parameters()))
    assert torch.equal(eager_loss, compiled_loss)
    for (name, _), a, b in zip(model.named_parameters(), eager_grads, compiled_grads):
        assert torch.equal(a, b), f"the gradient of {name} differs between eager and compiled"


def test_bad_input_is_named_under_compile_too():
    q, k, v = (fresh(1, 2, 32, 24) for _ in "qkv")  # head_dim 24: no kernel for it
    call = torch.compile(lambda q, k, v: flash_attention(q, k, v), backend="aot_eager")
    with pytest.raises(Exception, match="head_dim"):
        call(q, k, v)
