"""Figures of the chapter "The fixes and what they cost": δ's bias per fix, what a fix does to
O, the worst case on the GPU, and the time each costs. Records come from
:func:`kernels.rounding_lab.fixes.measure_fixes` (CPU), ``results/bias_sources_gpu.json`` and
``results/fix_speed.json``."""

from __future__ import annotations

import unicodedata

import numpy as np

from ..attention.registry import FIX_SPEED
from .fixes import FIXES
from .sweep import FAR_ULPS


def display_width(text: str) -> int:
    """Columns ``text`` takes in a monospaced table: combining marks (the macron of P̄) take
    none, so ``len`` overcounts them."""
    return sum(not unicodedata.combining(ch) for ch in text)


def pad(text: str, width: int, align: str = "<") -> str:
    """``text`` padded with spaces to ``width`` display columns (see :func:`display_width`),
    left-aligned (``"<"``) or right-aligned (``">"``): ``f"{text:<{width}s}"`` that counts a
    combining mark as zero width."""
    fill = " " * max(0, width - display_width(text))
    return text + fill if align == "<" else fill + text


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


def plot_worst_case(bias_records, setting=(2, 0.0, -1.0), keys=tuple(FIXES), gpu="GPU"):
    """Worst |error| of O per fix in the book's Triton kernel on the GPU ``gpu`` (its name, from
    the record's provenance), log scale."""
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
        xlabel=f"worst |O − O_exact| over 4,096 rows [ulp], {gpu}",
        title=f"k = {setting[0]}, tied V ≈ {setting[1]:+g}, other V ≈ {setting[2]:+g}",
    )
    ax.legend(loc="lower right")
    return fig


def speed_table(rows, n=4096, mode="fwd+bwd"):
    """{impl: TFLOP/s} for one shape and mode of ``fix_speed.json``."""
    return {r["impl"]: r["tflops"] for r in rows if r["n"] == n and r["mode"] == mode}


def plot_fix_speed(rows, n=4096, gpu="GPU"):
    """Forward+backward TFLOP/s of the book's kernel with each fix on the GPU ``gpu`` (its name,
    from the record's provenance); SDPA flash and cuDNN as lines."""
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
        title=f"what each fix costs in the book's kernel ({gpu})",
    )
    _legend_below(fig, ax)
    return fig


# ----------------------------------------------------------------------------------------------
# the paper's Appendix C, measured (small live scans: kernels.rounding_lab.sweep)
# ----------------------------------------------------------------------------------------------
APPENDIX_C_LABELS = {
    "ideal": "ideal bf16(O_exact)",
    "fa2": "FA2 numerics",
    "paper": "the paper's bf16 path",
    "fa2/off": "FA2, no rule",
    "fa2/cross": "FA2, the rule (m = 0)",
    "fa2/always": "FA2, rule on every row",
}


def _errorbars(ax, x, rows, label, ms=4, **kw):
    ax.errorbar(
        x,
        [r["mean"] for r in rows],
        yerr=[1.96 * r["se"] for r in rows],
        marker="o",
        ms=ms,
        capsize=2,
        label=APPENDIX_C_LABELS.get(label, label),
        **kw,
    )


def plot_fixed_offset(offsets, fixed, rounding):
    """Appendix C's fixed offset m = r_m + c: the mean error of O per numerics against c (top),
    and how the tied P̄ = e^−c is rounded to BF16 (bottom), from :func:`fixed_offset_bias` and
    :func:`offset_rounding`."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.8, 5.6), layout="constrained", sharex=True)
    for num, rows in fixed.items():
        _errorbars(top, offsets, rows, num)
    top.axhline(0, color="black", lw=0.8)
    top.set(ylabel="mean error of O [ulp]", title="a fixed offset m = r_m + c")
    top.legend()
    bottom.plot(offsets, np.asarray(rounding) * 1e3, marker="o", ms=4, color="C2")
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set(
        xlabel=r"offset c above the row maximum (tied $\bar P = e^{-c}$)",
        ylabel=r"$\mathrm{bf16}(e^{-c})/e^{-c} - 1$ [10⁻³]",
        title=r"how the tied $\bar P = e^{-c}$ is rounded (the same in every row)",
    )
    return fig


SCAN_PANELS = {
    "mean": "mean error of O [ulp]",
    "same": "outputs equal to the ideal [%]",
    "wrong": f"outputs NaN, 0 or > {FAR_ULPS} ulp off [%]",
}


def plot_rule_scan(
    scans, title, panels=("mean", "same"), xscale="linear", xlabel=None, predicted=None
):
    """Rows whose tied maximum sits at r_m (:func:`row_max_scan`), one line per entry of
    ``scans``, drawn against |r_m|: the mean error of the outputs (where none is wrong), the
    share equal to the ideal and the share wrong (``row_max_scan``'s ``wrong``), one panel each.
    ``predicted`` (:func:`tied_rounding_scan`) adds its mean and share equal to the ideal as
    black crosses."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(panels), 1, figsize=(6.8, 2.9 * len(panels) + 0.4), layout="constrained", sharex=True
    )
    axes = np.atleast_1d(axes)
    for i, (label, rows) in enumerate(scans.items()):
        # earlier lines get larger markers, so one that a later line covers still shows
        line = dict(ls=("-", "--", ":")[i % 3], color=f"C{i}", ms=4 + 2 * (len(scans) - 1 - i))
        for ax, panel in zip(axes, panels):
            ok = [r for r in rows if panel == "wrong" or r["wrong"] == 0]
            x = [abs(r["rm"]) for r in ok]
            if panel == "mean":
                _errorbars(ax, x, ok, label, **line)
            else:
                key = "same_as_ideal" if panel == "same" else "wrong"
                name = APPENDIX_C_LABELS.get(label, label)
                ax.plot(x, [100 * r[key] for r in ok], marker="o", label=name, **line)
    for ax, panel in zip(axes, panels):
        if predicted is not None and panel in ("mean", "same"):
            scale, key = (1, "mean") if panel == "mean" else (100, "same_as_ideal")
            y = [scale * r[key] for r in predicted]
            x = [abs(r["rm"]) for r in predicted]
            label = "predicted: the tied P̄'s rounding alone"
            ax.plot(x, y, "x", color="black", ms=7, mew=1.2, label=label, zorder=3)
        ax.set_ylabel(SCAN_PANELS[panel])
        if panel == "mean":
            ax.axhline(0, color="black", lw=0.8)
    axes[0].set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    last = sorted(range(len(labels)), key=lambda i: labels[i].startswith("predicted"))
    handles, labels = [handles[i] for i in last], [labels[i] for i in last]
    fig.legend(handles, labels, loc="outside lower center", ncols=1)
    axes[-1].set(xscale=xscale, xlabel=xlabel or "size of the tied row maximum |r_m|")
    return fig
