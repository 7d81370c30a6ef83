"""The Triton backward kernels (kernels.attention.flash_bwd) through kernels.flash_attention.

Gradients dQ, dK, dV against fp64 autograd of the fp64 reference for all three δ sources, every
dtype and head dim (causal and not), lengths that are not tile multiples; δ itself: from dP ∘ P or
from an fp32 O it is far more accurate than from the stored bf16 O (the paper's point); every
gradient element written; strided inputs.
"""

from __future__ import annotations

import pytest
import torch

import kernels  # noqa: F401
from kernels import flash_attention
from kernels.attention.flash_bwd import flash_backward
from kernels.attention.flash_fwd import flash_forward
from kernels.attention.options import DELTA_SOURCES, OFFSET_RULES, AttentionOptions, use_explicit
from kernels.attention.reference import attention_fp64, relative_error
from kernels.env import native_bf16

ON_GPU = native_bf16()
DEVICE = "cuda" if ON_GPU else "cpu"
# fixed tiles: several key tiles even at CPU sizes, and no per-test autotuning on a GPU
BLOCKS = dict(block_m=64, block_n=32) if ON_GPU else dict(block_m=32, block_n=32)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 5e-5, torch.float64: 1e-11}


def leaf(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()


def grads_vs_fp64(n, d, dtype, causal, delta_source, batch=1, heads=2, **kw):
    q, k, v = (leaf(batch, heads, n, d, dtype=dtype) for _ in range(3))
    grad_out = torch.randn(batch, heads, n, d, device=DEVICE).to(dtype)
    # on a GPU fp32/fp64 take their own (smaller) fixed tiles
    blocks = BLOCKS if (dtype.itemsize == 2 or not ON_GPU) else {}
    out = flash_attention(q, k, v, causal=causal, delta_source=delta_source, **{**blocks, **kw})
    out.backward(grad_out)
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = attention_fp64(*ref_inputs, causal)
    ref.backward(grad_out.double())
    errors = [relative_error(t.grad, r.grad) for t, r in zip((q, k, v), ref_inputs)]
    for t in (q, k, v):
        assert t.grad.dtype == dtype and not torch.isnan(t.grad).any()
    return relative_error(out.detach(), ref.detach()), errors


CASES = [
    (torch.bfloat16, 64, False, "o"),
    (torch.bfloat16, 32, True, "dp"),
    (torch.bfloat16, 16, True, "o_fp32"),
    (torch.float16, 128, True, "o"),
    (torch.float16, 16, False, "dp"),
    (torch.float32, 32, False, "o_fp32"),
    (torch.float32, 128, True, "dp"),
    (torch.float64, 64, True, "o"),
    (torch.float64, 16, False, "o_fp32"),
    (torch.bfloat16, 128, False, "dp"),
    (torch.float32, 64, True, "o"),
    (torch.float64, 32, False, "dp"),
    (torch.float16, 32, False, "o_fp32"),
    (torch.float16, 64, True, "dp"),
    (torch.bfloat16, 16, False, "o"),
    (torch.float32, 16, True, "o_fp32"),
    (torch.float64, 128, False, "o"),
]


@pytest.mark.parametrize(
    "dtype,head_dim,causal,delta_source",
    CASES,
    ids=[f"{str(c[0])[6:]}-d{c[1]}-{'causal' if c[2] else 'full'}-{c[3]}" for c in CASES],
)
def test_gradients_match_fp64(dtype, head_dim, causal, delta_source):
    n = 197 if ON_GPU else 37
    fwd_err, errors = grads_vs_fp64(n, head_dim, dtype, causal, delta_source)
    assert fwd_err < TOLERANCE[dtype] / 2
    assert max(errors) < TOLERANCE[dtype], f"dq, dk, dv relative errors {errors}"


def test_cases_cover_every_dtype_head_dim_and_delta_source():
    for dtype in TOLERANCE:
        assert {c[2] for c in CASES if c[0] == dtype} == {False, True}
    for d in (16, 32, 64, 128):
        assert {c[2] for c in CASES if c[1] == d} == {False, True}
    for source in DELTA_SOURCES:
        assert {c[2] for c in CASES if c[3] == source} == {False, True}


@pytest.mark.parametrize("stable", OFFSET_RULES)
def test_gradients_with_the_offset_fix(stable):
    # L = m + log ℓ is the exact log-sum-exp whatever m was, so P = exp(S − L) is unchanged
    fwd_err, errors = grads_vs_fp64(45, 32, torch.bfloat16, True, "o", stable=stable, beta=4.0)
    assert max(errors) < TOLERANCE[torch.bfloat16]


def test_delta_from_dp_or_fp32_o_is_more_accurate():
    """δ = rowsum(dO ∘ O) with O rounded to bf16 carries O's rounding error; rowsum(dP ∘ P) and
    the fp32 O do not (the paper's isolation experiments)."""
    n, d = (256, 64) if ON_GPU else (64, 32)
    q, k, v = (torch.randn(1, 2, n, d, device=DEVICE).bfloat16() for _ in range(3))
    grad_out = torch.randn(1, 2, n, d, device=DEVICE).bfloat16()
    out, lse, _ = flash_forward(q, k, v, causal=True, **BLOCKS)
    out32, _, _ = flash_forward(q, k, v, causal=True, round_out=False, **BLOCKS)
    assert out32.dtype == torch.float32
    exact = (grad_out.double() * attention_fp64(q, k, v, True)).sum(-1)
    errors = {}
    for source in DELTA_SOURCES:
        opts = AttentionOptions(causal=True, delta_source=source, **BLOCKS)
        *_, delta = flash_backward(
            q, k, v, out, grad_out, lse, opts, explicit=use_explicit(None), out_fp32=out32
        )
        assert not torch.isnan(delta).any()
        errors[source] = relative_error(delta, exact)
    assert errors["dp"] < errors["o"] / 4, errors
    assert errors["o_fp32"] < errors["o"] / 4, errors
    assert max(errors["dp"], errors["o_fp32"]) < 1e-4, errors


def test_strided_inputs_and_gradients():
    q = torch.randn(1, 33, 2, 32, device=DEVICE).bfloat16().transpose(1, 2)
    k = torch.randn(1, 2, 33, 64, device=DEVICE).bfloat16()[..., ::2]
    v = torch.randn(1, 2, 33, 32, device=DEVICE).bfloat16()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    dense = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn(1, 2, 33, 32, device=DEVICE).bfloat16()
    flash_attention(*leaves, causal=True, block_m=16, block_n=16).backward(grad_out)
    flash_attention(*dense, causal=True, block_m=16, block_n=16).backward(grad_out)
    for a, b in zip(leaves, dense):
        assert torch.equal(a.grad, b.grad)
    # a non-contiguous output gradient too
    grad_t = torch.randn(1, 2, 32, 33, device=DEVICE).bfloat16().transpose(-1, -2)
    again = [t.detach().requires_grad_() for t in (q, k, v)]
    flash_attention(*again, causal=True, block_m=16, block_n=16).backward(grad_t)
    for a in again:
        assert not torch.isnan(a.grad).any()


def test_base_two_backward_moves_only_last_bits():
    """The "exp2" speed-up in the backward kernels: P = 2^(S·log₂e − L·log₂e) instead of e^(S − L).
    The gradients agree to a few bf16 ulps and are as close to fp64 either way."""
    from kernels.attention import speedups

    q, k, v = (leaf(1, 2, 197 if ON_GPU else 45, 64, dtype=torch.bfloat16) for _ in range(3))
    grad_out = torch.randn_like(q)
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    attention_fp64(*ref_inputs, True).backward(grad_out.double())
    got = {}
    for on in (False, True):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with speedups(exp2=on):
            out = flash_attention(*leaves, causal=True, **BLOCKS)
            out.backward(grad_out)
        got[on] = [t.grad for t in leaves]
        errors = [relative_error(g, r.grad) for g, r in zip(got[on], ref_inputs)]
        assert max(errors) < TOLERANCE[torch.bfloat16], f"exp2={on}: errors {errors}"
    for name, a, b in zip("qkv", got[False], got[True]):
        assert relative_error(b, a) < 2e-3, f"d{name} moved by more than rounding flips"
