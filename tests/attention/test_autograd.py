"""kernels.flash_attention, the public entry point: behaves like torch's
scaled_dot_product_attention, accepts every documented option, and refuses bad input with a
clear message."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernels  # noqa: F401
from kernels import flash_attention
from kernels.attention.options import KERNEL_STABLE_MODES
from kernels.attention.reference import attention_fp64, relative_error, standard_attention
from kernels.env import native_bf16

ON_GPU = native_bf16()
DEVICE = "cuda" if ON_GPU else "cpu"


def qkv(n=29, d=32, dtype=torch.float32, batch=2, heads=2):
    return [torch.randn(batch, heads, n, d, device=DEVICE).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(causal):
    q, k, v = qkv()
    ours = flash_attention(q, k, v, causal=causal)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert relative_error(ours, theirs) < 2e-5
    assert relative_error(standard_attention(q, k, v, causal), theirs) < 2e-5


def test_bf16_error_is_like_standard_attention():
    # both round the output to bf16 once: errors of the same size against fp64
    q, k, v = qkv(n=64, dtype=torch.bfloat16)
    ref = attention_fp64(q, k, v, True)
    ours = relative_error(flash_attention(q, k, v, causal=True), ref)
    standard = relative_error(standard_attention(q, k, v, True), ref)
    assert ours < 1e-2 and ours < 2 * standard, (ours, standard)


@pytest.mark.parametrize("stable", [False, True, *KERNEL_STABLE_MODES])
@pytest.mark.parametrize("numerics", ["fa2", "paper"])
def test_options_are_accepted(stable, numerics):
    q, k, v = qkv(n=20, d=16, dtype=torch.bfloat16, batch=1, heads=1)
    out = flash_attention(
        q,
        k,
        v,
        causal=True,
        stable=stable,
        numerics=numerics,
        beta=3.0,
        eps=0.0,
        block_m=16,
        block_n=16,
    )
    assert relative_error(out, attention_fp64(q, k, v, True)) < 2e-2


def test_gradient_flows_like_sdpa():
    q, k, v = (t.requires_grad_() for t in qkv(n=24, d=16))
    flash_attention(q, k, v, causal=True, scale=0.2).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2).sum().backward()
    for a, t in zip(ours, (q, k, v)):
        assert relative_error(a, t.grad) < 1e-4


def test_explicit_path_can_be_forced():
    q, k, v = qkv(n=20, d=16, dtype=torch.bfloat16, batch=1, heads=1)
    out = flash_attention(q, k, v, explicit=True, block_m=16, block_n=16)
    assert relative_error(out, attention_fp64(q, k, v)) < 1e-2
    if not ON_GPU:
        with pytest.raises(ValueError, match="compute capability"):
            flash_attention(q, k, v, explicit=False)


def bad(match, error=ValueError, **changes):
    q, k, v = qkv(n=8, d=16, batch=1, heads=1)
    args = dict(q=q, k=k, v=v)
    args.update({name: changes.pop(name) for name in ("q", "k", "v") if name in changes})
    with pytest.raises(error, match=match):
        flash_attention(args["q"], args["k"], args["v"], **changes)


def test_bad_inputs_are_named():
    x = torch.randn(1, 1, 8, 16, device=DEVICE)
    bad("4-D", q=x[0])
    bad("must be a torch.Tensor", TypeError, k=x.tolist())
    bad("share a dtype", TypeError, v=x.double())
    bad("dtype torch.int32", TypeError, q=x.int(), k=x.int(), v=x.int())
    bad(
        "head_dim 24 is not supported.*16, 32, 64, 128",
        q=torch.randn(1, 1, 8, 24, device=DEVICE),
        k=torch.randn(1, 1, 8, 24, device=DEVICE),
        v=torch.randn(1, 1, 8, 24, device=DEVICE),
    )
    bad("same shape", v=torch.randn(1, 1, 9, 16, device=DEVICE))
    bad(
        "batch, heads",
        k=torch.randn(1, 2, 8, 16, device=DEVICE),
        v=torch.randn(1, 2, 8, 16, device=DEVICE),
    )
    bad("beta must be > 1", stable=True, beta=1.0)
    bad("eps must be >= 0", stable="tile", eps=-1e-3)
    bad("numerics must be one of", numerics="bf16")
    bad("stable must be", stable="sometimes")
    bad("delta_source must be one of", delta_source="O")
    bad("block_n must be a power of two", block_n=24)
    bad("scale must be a positive", scale=-1.0)
    bad("scale must be a number", TypeError, scale="big")
    bad("explicit must be", TypeError, explicit="yes")
    bad("one device", v=torch.randn(1, 1, 8, 16, device="meta"))


def test_beta_is_checked_only_when_the_fix_is_on():
    q, k, v = qkv(n=8, d=16, batch=1, heads=1)
    out = flash_attention(q, k, v, beta=0.5)  # stable=False: beta unused
    assert not torch.isnan(out).any()
