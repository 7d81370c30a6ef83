"""Controls that tell a *biased* error in δ from a merely *large* one (GPT-2 chapter, issue §3).

The failing path takes δ = rowsum(dO ∘ O_lp) from the low-precision O; its fp32-O control takes
δ_hp = rowsum(dO ∘ PV) with PV recomputed in fp32. Per row T the failing path adds
e[T] = δ_lp[T] − δ_hp[T] to δ. Two things about e could break training: its mean (the paper's
bias, Eq. 3) or its size. And dO is computed downstream of the rounded O, so dO and O_lp − O_hp
are correlated even when the rounding itself is unbiased. The controls below change δ, or the O
a layer passes on, in exactly one way each (attention spec options of the ``paper`` kind):

``dshift=c``      δ = δ_source + c in every row: a constant bias and nothing else (the fp32-O
                  run with ``dshift`` = the failing run's mean e is "bias alone")
``dnoise=σ``      δ = δ_source + σ z, z ~ N(0, 1) drawn per row: zero-mean noise of a chosen size
``derr=mean``     δ = δ_hp + mean_T e[T] per sequence and head: keeps Σ_T e[T], the sum that
                  Eq. (3) says drives the failure, and removes every token-to-token difference
``derr=sign``     δ = δ_hp + s[T] e[T] with random signs s = ±1: the failing run's error sizes,
                  row by row, with zero mean (its variance matched at every step, automatically)
``out=exact``     the layer passes on O_hp = PV in fp32 (cast to the model's dtype) while δ is
                  still taken from O_lp: dO then comes from the exact-O path and cannot be
                  correlated with the rounding error of O_lp

``derr`` needs ``delta=o`` (it rewrites the failing path's error). The random draws use torch's
global generator, so they are seeded with the run and saved in its checkpoints.

:func:`control_delta` is the rule itself (a pure function, tested on tiny tensors);
:class:`ControlledAttention` is the emulated paper attention whose backward is the paper's own
(:func:`kernels.attention.emulator.paper_backward`) with that rule as its δ hook.
"""

from __future__ import annotations

import functools

import torch

from ..attention.emulator import delta_rowsum, flash_forward, paper_backward, paper_scores
from ..attention.options import AttentionOptions
from ..numerics.rounding import round_to_dtype

ERR_MODES = ("keep", "mean", "sign")
OUT_MODES = ("low", "exact")


def check_control(kind: str, delta: str, dshift: float, dnoise: float, derr: str, out: str):
    """Raise ValueError for a control that is unknown or does not apply."""
    if derr not in ERR_MODES:
        raise ValueError(f"derr must be one of {ERR_MODES}, got {derr!r}")
    if out not in OUT_MODES:
        raise ValueError(f"out must be one of {OUT_MODES}, got {out!r}")
    if not dnoise >= 0:
        raise ValueError(f"dnoise is a standard deviation (>= 0), got {dnoise:g}")
    if dshift != dshift:
        raise ValueError("dshift must be a number, got NaN")
    active = dshift != 0 or dnoise != 0 or derr != "keep" or out != "low"
    if active and kind != "paper":
        raise ValueError(f"the δ controls belong to the 'paper' kind, got {kind!r}")
    if derr != "keep" and delta != "o":
        raise ValueError(
            f"derr={derr} rewrites the failing path's error: it needs delta=o, got delta={delta}"
        )
    return active


def control_delta(
    d_out,
    out_low,
    out_high,
    d_probs,
    probs,
    *,
    delta: str = "o",
    dshift: float = 0.0,
    dnoise: float = 0.0,
    derr: str = "keep",
):
    """(δ, δ_hp): the δ the backward pass uses, and δ_hp = rowsum(dO ∘ O_hp) for reference.

    Shapes: d_out, out_low, out_high (..., N, D); d_probs, probs (..., N, N); δ (..., N)."""
    if delta not in ("o", "dp", "o_fp32"):
        raise ValueError(f"delta must be o, dp or o_fp32, got {delta!r}")
    delta_hp = delta_rowsum("o_fp32", d_out, out_fp32=out_high)
    if delta == "o_fp32":
        base = delta_hp
    else:  # "o": the failing path
        base = delta_rowsum(delta, d_out, out=out_low, d_probs=d_probs, probs=probs)
    return perturb_delta(base, delta_hp, dshift=dshift, dnoise=dnoise, derr=derr), delta_hp


def perturb_delta(base, delta_hp, *, dshift: float = 0.0, dnoise: float = 0.0, derr="keep"):
    """The δ a control uses, from the δ of the chosen source (``base``) and δ_hp: the error
    rewritten (``derr``), then the constant shift and the noise added."""
    if derr == "mean":
        base = delta_hp + (base - delta_hp).mean(-1, keepdim=True)
    elif derr == "sign":
        signs = torch.randint(0, 2, base.shape, device=base.device).to(base.dtype) * 2 - 1
        base = delta_hp + signs * (base - delta_hp)
    if dshift:
        base = base + dshift
    if dnoise:
        base = base + dnoise * torch.randn(base.shape, dtype=base.dtype, device=base.device)
    return base


def exact_output(q, k, v, lse, opts: AttentionOptions, low):
    """O_hp = PV in the working precision, P = exp(S − L) from the forward's S and L: the O the
    fp32-O control's δ uses (the paper's "PV recomputed in fp32")."""
    work = torch.float64 if low == torch.float64 else torch.float32
    qw, kw, vw = (round_to_dtype(t.to(work), low) for t in (q, k, v))
    scores = paper_scores(qw, kw, opts.scale_for(q.shape[-1]), low, opts.causal)
    return torch.exp(scores - lse.to(work).unsqueeze(-1)) @ vw


class ControlledAttention(torch.autograd.Function):
    """The emulated paper attention (forward of :func:`flash_forward`, FA2's Algorithm 2 backward)
    with δ chosen by :func:`control_delta` and, with ``out="exact"``, the exact O passed on.

    ``control`` is the spec (:class:`kernels.gpt2.attention.AttnSpec`); ``probe`` (or None)
    receives Σ_T(δ_used − δ_hp) on monitoring steps as ``delta_used_err``."""

    @staticmethod
    def forward(ctx, q, k, v, opts: AttentionOptions, control, probe=None):
        low = torch.float64 if q.dtype == torch.float64 else torch.bfloat16
        if low == torch.float64 and opts.acc_bits is not None:
            opts = opts.replace(acc_bits=None, acc_rounding="rne")
        with torch.autocast(device_type=q.device.type, enabled=False):
            res = flash_forward(q, k, v, opts, low=low)
            out = res.out
            if control.out == "exact":
                out = exact_output(q, k, v, res.lse, opts, low)
        ctx.save_for_backward(q, k, v, res.out, res.lse)
        ctx.opts, ctx.low, ctx.control, ctx.probe = opts, low, control, probe
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out_low, lse = ctx.saved_tensors
        hook = functools.partial(_control_hook, control=ctx.control, probe=ctx.probe)
        with torch.autocast(device_type=q.device.type, enabled=False):
            d_q, d_k, d_v = paper_backward(
                q, k, v, out_low, lse, grad_out, ctx.opts, ctx.low, delta_hook=hook
            )
        return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype), None, None, None


def _control_hook(delta, *, d_out, out_low, probs, values, control, probe):
    """The δ hook of :func:`kernels.attention.emulator.paper_backward` for one control: δ from
    the spec's source, perturbed by :func:`perturb_delta`; on monitoring steps ``probe`` gets
    Σ_T(δ_used − δ_hp)."""
    delta_hp = delta_rowsum("o_fp32", d_out, out_fp32=probs @ values)  # PV in fp32
    used = perturb_delta(
        delta, delta_hp, dshift=control.dshift, dnoise=control.dnoise, derr=control.derr
    )
    if probe is not None and probe.active:
        error = (used - delta_hp).float()
        probe.stats["delta_used_err"] = float(error.sum(-1).mean(0).sum())
        probe.stats["delta_used_abs"] = float(error.abs().sum(-1).mean(0).sum())
    return used
