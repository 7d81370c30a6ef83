"""Chapter 10's models: the roofline (:func:`intensity`, :func:`attainable_tflops`,
:func:`plot_roofline`) and what an ``exp2`` rewrite would change in P̄ (:func:`exp2_changes`,
computed with :func:`p_bar`, the one place this rewrite is written)."""

from __future__ import annotations

import math

import numpy as np

from ..attention.reference import default_scale
from ..tools.style import WIDTH_IN
from .records import HBM_TB_S, PEAK_TFLOPS


def intensity(n, d, impl="fused", bytes_per_value=2) -> float:
    """FLOPs per byte of HBM traffic of one attention head (forward, no mask) in a simple model.

    ``fused``: Q, K, V read once and O written once (the ideal a flash kernel approaches);
    ``math``: also S written, read by the softmax, P written and read by P V (N×N each)."""
    flops = 4.0 * n * n * d
    traffic = 4 * n * d * bytes_per_value
    if impl == "math":
        traffic += 4 * n * n * bytes_per_value
    elif impl != "fused":
        raise ValueError(f"impl must be 'fused' or 'math', got {impl!r}")
    return flops / traffic


def attainable_tflops(intensity_flop_per_byte, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S):
    """The roofline: min(peak, bandwidth × intensity)."""
    return min(peak, bandwidth_tb_s * intensity_flop_per_byte)


def plot_roofline(series, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S, measured=None):
    """The roofline with ``series`` placed on it: ``[(label, intensities, TFLOP/s, style)]``
    (FLOP/byte and TFLOP/s may be numbers or lists; the style dict is optional). TFLOP/s None:
    the model's ceiling at those intensities, drawn as open markers on the roof. ``measured``
    (label, TFLOP/s), e.g. what a large matmul reached on the GPU: a dashed line under the
    peak."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.4), layout="constrained")
    xs = np.logspace(0.5, 4.3, 200)
    ax.plot(
        xs,
        [attainable_tflops(x, peak, bandwidth_tb_s) for x in xs],
        color="black",
        lw=1.5,
        label=f"roof: min({peak:.0f} TFLOP/s, {bandwidth_tb_s:.2f} TB/s × intensity)",
    )
    if measured is not None:
        ax.axhline(measured[1], color="gray", ls="--", lw=1, label=measured[0])
    ridge = peak / bandwidth_tb_s
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.annotate(
        f"ridge {ridge:.0f} FLOP/B",
        (ridge, 14),
        fontsize=9,
        color="gray",
        xytext=(4, 0),
        textcoords="offset points",
    )
    for i, entry in enumerate(series):
        label, x, y = entry[:3]
        style = dict(color=f"C{i}", marker="*", ms=11)
        style.update(entry[3] if len(entry) > 3 else {})
        x = np.atleast_1d(np.asarray(x, dtype=float))
        line = "-" if len(x) > 1 else "none"
        if y is None:
            y = [attainable_tflops(v, peak, bandwidth_tb_s) for v in x]
            style.update(mfc="none", mew=1.5)
            line = "none"
        ax.plot(x, np.atleast_1d(y), ls=line, lw=1, label=label, **style)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity [FLOP per byte of HBM]",
        ylabel="TFLOP/s",
        ylim=(10, peak * 1.6),
    )
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2)
    return fig


# --- exp2: what folding log2(e) into the scale changes ------------------------------------
def p_bar(s, scale, fold: bool):
    """P̄ = exp(S·scale − m) in fp32 (``fold=False``: ``tl.exp`` of the shifted score), or as
    the kernels compute it with the "exp2" speed-up (``fold=True``): 2^(S·(scale·log₂e) − m·log₂e)
    with the argument from one fused multiply-add (one rounding, emulated in fp64) and m, the
    row maximum, in natural units."""
    import torch

    scaled = s * scale
    m = scaled.amax(-1, keepdim=True)
    if fold:
        log2e = torch.tensor(math.log2(math.e), dtype=torch.float32)
        c = torch.tensor(scale, dtype=torch.float32) * log2e  # fp32, as in the kernel
        m2 = m * log2e  # fp32, per row
        return torch.exp2((s.double() * c.double() - m2.double()).float())  # fma: one rounding
    return torch.exp(scaled - m)


def exp2_changes(rows=256, keys=256, d=64, seed=0) -> dict:
    """P̄ = exp(S·scale − m) against the exp2 rewrite the kernels use (:func:`p_bar`): the
    share of fp32 P̄ values that change, and of their bf16 roundings (the P̄ that multiplies
    V)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d, generator=gen).bfloat16().float()
    k = torch.randn(keys, d, generator=gen).bfloat16().float()
    s = q @ k.T  # bf16 products, fp32 sums (as the MMA)
    scale = default_scale(d)
    p_exp, p_exp2 = p_bar(s, scale, False), p_bar(s, scale, True)
    differ = (p_exp.view(torch.int32) != p_exp2.view(torch.int32)).double().mean().item()
    low_a, low_b = p_exp.bfloat16(), p_exp2.bfloat16()
    flips = (low_a.view(torch.int16) != low_b.view(torch.int16)).double().mean().item()
    rel = ((p_exp2.double() - p_exp.double()).abs() / p_exp.double()).max().item()
    return dict(
        values=rows * keys, fp32_changed=differ, bf16_changed=flips, max_relative_change=rel
    )
