"""Figures of the chapter "The fixes and what they cost": δ's bias per fix, what a fix does to
O, the worst case on the GPU, and the time each costs. Records come from
:func:`kernels.lab.fixes.measure_fixes` (CPU), ``results/bias_sources_gpu.json`` and
``results/fix_speed.json``."""

from __future__ import annotations

import numpy as np

from ..attention.registry import FIX_SPEED
from .fixes import FIXES


def _bars(ax, cases, keys, value, labels):
    width = 0.8 / len(cases)
    y = np.arange(len(keys))
    for i, case in enumerate(cases):
        ax.barh(
            y + (i - (len(cases) - 1) / 2) * width,
            [value(case, k) for k in keys],
            width,
            label=labels[i],
        )
    ax.set_yticks(y, [FIXES[k].label for k in keys])
    ax.invert_yaxis()


def _points(ax, cases, keys, value, labels):
    """Like :func:`_bars`, with a marker per value: for an axis that does not start at 0 (a zoom
    or a log scale), where a bar's length would mean nothing."""
    width = 0.8 / len(cases)
    y = np.arange(len(keys))
    for i, (case, marker) in enumerate(zip(cases, "osD^v")):
        ax.plot(
            [value(case, k) for k in keys],
            y + (i - (len(cases) - 1) / 2) * width,
            marker=marker,
            linestyle="none",
            markersize=7,
            label=labels[i],
        )
    ax.set_yticks(y, [FIXES[k].label for k in keys])
    ax.set_ylim(len(keys) - 0.5, -0.5)  # the first fix on top


def _legend_below(fig, ax, **kw):
    """The axes' legend in one row under the figure, where it covers no bar or line."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), **kw)


def plot_delta_bias(records, keys=tuple(FIXES)):
    """Mean error of δ per fix and case, with the ideal δ of a stored-bf16 O as a dashed tick."""
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in records))
    by = {(r["case"], r["fix"]): r for r in records}
    fig, ax = plt.subplots(figsize=(6.8, 4.6), layout="constrained")
    _bars(ax, cases, keys, lambda c, k: by[(c, k)]["delta"]["bias"], cases)
    for i, case in enumerate(cases):
        ideal = by[(case, keys[0])]["delta_ideal"]["bias"]
        ax.axvline(ideal, color=f"C{i}", ls="--", lw=1.2)
    ax.axvline(0, color="black", lw=0.8)
    ax.set(xlabel="mean error of δ = rowsum(dO ∘ O)  [bf16 ulp of δ]")
    ax.plot([], [], color="gray", ls="--", label="δ from bf16(O_exact)")
    _legend_below(fig, ax, title="V tied / other")
    return fig


def plot_output_cost(records, keys=tuple(FIXES)):
    """Share of outputs equal to the ideal bf16(O_exact), per fix and case."""
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in records))
    by = {(r["case"], r["fix"]): r for r in records}
    fig, ax = plt.subplots(figsize=(6.8, 4.6), layout="constrained")
    _points(ax, cases, keys, lambda c, k: 100 * by[(c, k)]["out"]["same_as_ideal"], cases)
    ax.set(xlabel="outputs equal to the ideal bf16(O_exact) [%]", xlim=(50, 101))
    _legend_below(fig, ax, title="V tied / other")
    return fig


def plot_worst_case(bias_records, setting=(2, 0.0, -1.0), keys=tuple(FIXES)):
    """Worst |error| of O per fix in the book's Triton kernel on the GPU, log scale."""
    import matplotlib.pyplot as plt

    rows = {r["impl"]: r for r in bias_records if (r["ties"], r["vmax"], r["vrest"]) == setting}
    fig, ax = plt.subplots(figsize=(6.8, 4.2), layout="constrained")
    worst = [rows[f"triton/{k}"]["out"]["worst"] for k in keys]
    y = np.arange(len(keys))
    ax.scatter(worst, y, s=60, color=["tab:red" if w > 1 else "tab:blue" for w in worst])
    ax.axvline(rows["ideal"]["out"]["worst"], color="gray", ls="--", label="ideal: 0.5 ulp")
    ax.set_yticks(y, [FIXES[k].label for k in keys])
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set(
        xscale="log",
        xlabel="worst |O − O_exact| over 4,096 rows [ulp], H100",
        title=f"k = {setting[0]}, tied V ≈ {setting[1]:+g}, other V ≈ {setting[2]:+g}",
    )
    ax.legend(loc="lower right")
    return fig


def speed_table(rows, n=4096, mode="fwd+bwd"):
    """{impl: TFLOP/s} for one shape and mode of ``fix_speed.json``."""
    return {r["impl"]: r["tflops"] for r in rows if r["n"] == n and r["mode"] == mode}


def plot_fix_speed(rows, n=4096):
    """Forward+backward TFLOP/s of the book's kernel with each fix; SDPA flash and cuDNN as
    lines."""
    import matplotlib.pyplot as plt

    table = speed_table(rows, n)
    mine = {k: v for k, v in table.items() if not k.startswith("SDPA")}
    fig, ax = plt.subplots(figsize=(6.8, 3.8), layout="constrained")
    y = np.arange(len(mine))
    ax.barh(y, list(mine.values()), color="tab:blue")
    for name, style in zip(FIX_SPEED.values(), ("--", ":")):  # SDPA flash, SDPA cudnn
        ax.axvline(table[name], color="black", ls=style, label=f"{name}: {table[name]:.0f}")
    ax.set_yticks(y, list(mine))
    ax.invert_yaxis()
    ax.set(
        xlabel=f"forward + backward [TFLOP/s], causal, B·H = 64, N = {n:,}, d = 64",
        title="what each fix costs in the book's kernel (H100)",
    )
    _legend_below(fig, ax)
    return fig
