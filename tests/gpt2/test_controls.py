"""The δ controls that separate a biased error from a large one (kernels/gpt2/controls.py).

Each option must change δ exactly as its docstring says and nothing else; the end-to-end
checks go through autograd and use Eq. (1) of the paper: dQ_hp − dQ_lp = α diag(δ_lp − δ_hp) PK.
"""

import math

import numpy as np
import pytest
import torch

import kernels  # noqa: F401
from kernels.attention import AttentionOptions
from kernels.attention.emulator import (
    EmulatedAttention,
    flash_forward,
    paper_backward,
    paper_scores,
)
from kernels.gpt2 import GPT, GPTConfig, parse_spec
from kernels.gpt2.attention import attend
from kernels.gpt2.controls import ControlledAttention, control_delta, exact_output
from kernels.numerics.rounding import round_to_dtype


def _parts(b=2, h=2, n=16, d=8):
    """Random (dO, O_lp, O_hp, dP, P) with O_lp = O_hp + a small error."""
    d_out = torch.randn(b, h, n, d)
    out_high = torch.randn(b, h, n, d)
    out_low = out_high + 1e-2 * torch.randn(b, h, n, d)
    probs = torch.softmax(torch.randn(b, h, n, n), -1)
    return d_out, out_low, out_high, d_out @ torch.randn(b, h, d, n), probs


def test_sources_and_shift():
    d_out, lo, hi, dp, p = _parts()
    hp = (d_out * hi).sum(-1)
    lp = (d_out * lo).sum(-1)
    delta, ref = control_delta(d_out, lo, hi, dp, p, delta="o")
    assert torch.equal(ref, hp) and torch.equal(delta, lp)
    assert torch.equal(control_delta(d_out, lo, hi, dp, p, delta="dp")[0], (dp * p).sum(-1))
    c = float(np.random.uniform(1e-3, 1e-2))
    shifted, _ = control_delta(d_out, lo, hi, dp, p, delta="o_fp32", dshift=c)
    assert torch.equal(shifted, hp + c)  # a constant, in every row
    with pytest.raises(ValueError):
        control_delta(d_out, lo, hi, dp, p, delta="x")


def test_noise_is_the_seeded_normal_draw():
    d_out, lo, hi, dp, p = _parts()
    sigma, seed = 3e-3, int(np.random.randint(1 << 30))
    torch.manual_seed(seed)
    noisy, hp = control_delta(d_out, lo, hi, dp, p, delta="o_fp32", dnoise=sigma)
    torch.manual_seed(seed)
    z = torch.randn(hp.shape)
    assert torch.equal(noisy, hp + sigma * z)
    assert abs(float((noisy - hp).mean())) < 4 * sigma / math.sqrt(hp.numel())


def test_err_mean_keeps_the_sum_and_removes_the_spread():
    d_out, lo, hi, dp, p = _parts()
    lp = (d_out * lo).sum(-1)
    delta, hp = control_delta(d_out, lo, hi, dp, p, delta="o", derr="mean")
    err = delta - hp
    assert torch.equal(delta, hp + (lp - hp).mean(-1, keepdim=True))
    assert torch.allclose(
        err.std(-1), torch.zeros(err.shape[:-1]), atol=1e-6
    )  # one value per row block
    # Σ_T e[T] kept, up to fp32 rounding: e[T] = (hp[T] + mean) - hp[T] can be off by half an ulp
    # of hp[T] (a fixed atol of 1e-6 failed about once in 2,000 fresh draws)
    rounding = (torch.finfo(torch.float32).eps * hp.abs()).sum(-1)
    kept = (lp - hp).sum(-1)
    assert ((err.sum(-1) - kept).abs() <= 1e-6 + 1e-4 * kept.abs() + rounding).all()


def test_err_sign_keeps_each_size_and_flips_signs_at_random():
    d_out, lo, hi, dp, p = _parts(n=64)
    lp = (d_out * lo).sum(-1)
    seed = int(np.random.randint(1 << 30))
    torch.manual_seed(seed)
    delta, hp = control_delta(d_out, lo, hi, dp, p, delta="o", derr="sign")
    torch.manual_seed(seed)
    signs = torch.randint(0, 2, hp.shape).float() * 2 - 1
    assert torch.equal(delta, hp + signs * (lp - hp))
    assert torch.allclose((delta - hp).abs(), (lp - hp).abs(), rtol=1e-3, atol=1e-6)
    assert 0.35 < float((signs < 0).float().mean()) < 0.65


def test_spec_options_are_checked():
    for good in (
        "paper:delta=o_fp32,dshift=2e-9",
        "paper:delta=o_fp32,dnoise=1e-7",
        "paper:derr=mean",
        "paper:derr=sign,obits=4",
        "paper:out=exact",
    ):
        spec = parse_spec(good)
        assert spec.controlled and parse_spec(str(spec)) == spec, good
    assert not parse_spec("paper:delta=o_fp32").controlled
    for bad in (
        "sdpa:dshift=1",
        "paper:derr=mean,delta=o_fp32",
        "paper:derr=half",
        "paper:out=fp32",
        "paper:dnoise=-1",
        "triton:out=exact",
    ):
        with pytest.raises(ValueError):
            parse_spec(bad)


def _qkv(n=24, d=16):
    return [torch.randn(2, 2, n, d).requires_grad_() for _ in range(3)]


def _grads(spec_text, q, k, v, d_out, seed=0):
    spec = parse_spec(spec_text)
    torch.manual_seed(seed)
    out = attend(q, k, v, spec)
    return (out, *torch.autograd.grad(out, (q, k, v), d_out))


def test_shift_changes_dq_as_equation_1_says():
    q, k, v = _qkv()
    d_out = torch.randn(q.shape)
    c = 1e-2
    out_f, dq_f, dk_f, dv_f = _grads("paper:delta=o_fp32", q, k, v, d_out)
    out_c, dq_c, dk_c, dv_c = _grads(f"paper:delta=o_fp32,dshift={c}", q, k, v, d_out)
    assert torch.equal(out_f, out_c) and torch.equal(dv_f, dv_c)  # forward and dV untouched
    opts = parse_spec("paper").options(q.shape[-2])
    qw, kw = (round_to_dtype(t.detach(), torch.bfloat16) for t in (q, k))
    scale = 1 / math.sqrt(q.shape[-1])
    lse = flash_forward(q.detach(), k.detach(), v.detach(), opts).lse
    probs = torch.exp(paper_scores(qw, kw, scale, torch.bfloat16) - lse.unsqueeze(-1))
    # δ_lp − δ_hp = c in every row: dQ_hp − dQ_lp = α c P K
    assert torch.allclose(dq_f - dq_c, scale * c * (probs @ kw), atol=1e-5, rtol=1e-3)
    assert torch.allclose(
        dk_f - dk_c, scale * c * (probs.transpose(-1, -2) @ qw), atol=1e-5, rtol=1e-3
    )


def test_controlled_path_without_a_control_is_the_plain_one():
    q, k, v = _qkv()
    d_out = torch.randn(q.shape)
    opts = AttentionOptions(
        causal=True, numerics="paper", delta_source="o", block_n=q.shape[-2], acc_bits=4
    )
    plain = EmulatedAttention.apply(q, k, v, opts)
    g_plain = torch.autograd.grad(plain, (q, k, v), d_out)
    ctl = ControlledAttention.apply(q, k, v, opts, parse_spec("paper"), None)
    g_ctl = torch.autograd.grad(ctl, (q, k, v), d_out)
    assert torch.equal(plain, ctl)
    for a, b in zip(g_plain, g_ctl):
        assert torch.equal(a, b)


def test_a_delta_hook_changes_the_one_backward_as_the_control_does():
    """``dshift=c`` is the paper's backward with the hook δ ↦ δ + c, bit for bit."""
    leaves = _qkv()
    q, k, v = (t.detach() for t in leaves)
    d_out = torch.randn(q.shape)
    opts = parse_spec("paper:delta=o_fp32").options(q.shape[-2])
    res = flash_forward(q, k, v, opts)
    hooked = paper_backward(
        q, k, v, res.out, res.lse, d_out, opts, torch.bfloat16, delta_hook=lambda d, **_: d + 1e-2
    )
    _, *controlled = _grads("paper:delta=o_fp32,dshift=0.01", *leaves, d_out)
    for a, b in zip(hooked, controlled):
        assert torch.equal(a.to(b.dtype), b)


def test_out_exact_passes_the_exact_o_and_keeps_the_failing_delta():
    q, k, v = _qkv()
    d_out = torch.randn(q.shape)
    out_u, *g_u = _grads("paper:delta=o,obits=3", q, k, v, d_out)
    out_x, *g_x = _grads("paper:delta=o,obits=3,out=exact", q, k, v, d_out)
    opts = parse_spec("paper:obits=3").options(q.shape[-2])
    res = flash_forward(q.detach(), k.detach(), v.detach(), opts)
    want = exact_output(q.detach(), k.detach(), v.detach(), res.lse, opts, torch.bfloat16)
    assert torch.equal(out_x, want)  # the exact O goes downstream
    assert not torch.equal(out_x, out_u)  # ... not the rounded one
    for a, b in zip(g_u, g_x):  # same dO in: the same gradients,
        assert torch.equal(a, b)  # δ still from the rounded O


def test_every_control_trains_and_is_recorded():
    for spec in (
        "paper:delta=o_fp32,dshift=1e-6",
        "paper:delta=o_fp32,dnoise=1e-6",
        "paper:derr=mean,obits=3",
        "paper:derr=sign,obits=3",
        "paper:out=exact,obits=3",
    ):
        model = GPT(GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, attn=spec))
        model.set_monitoring(True)
        idx = torch.randint(0, 256, (2, 16))
        _, loss = model(idx, torch.randint(0, 256, (2, 16)))
        loss.backward()
        stats = model.layer_stats()[0]
        assert math.isfinite(loss.item()) and "delta_used_err" in stats, spec
        assert all(torch.isfinite(p.grad).all() for p in model.parameters()), spec
