"""Figures of the chapter "Where the bias comes from": the ideal's bias, what kernels add beyond
it, the paper's path, and a map of where each source matters. Each takes stored or freshly
measured records and returns the figure; the chapter prints the numbers behind it."""

from __future__ import annotations

import numpy as np

from ..attention.registry import BIAS_SOURCES, label
from ..numerics.stats import is_biased

V_SETTINGS = ((-1.0, 0.0), (-1.0, -1.0), (0.0, -1.0), (1.0, 0.0))
KERNELS = tuple(BIAS_SOURCES[n] for n in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "triton"))
# the stored rows' labels, from the registry
KERNEL_LABELS = {stored: label(name) for name, stored in BIAS_SOURCES.items()}
# the chapter's names for the same rows, in its figures and tables alike
NAMES = {
    **KERNEL_LABELS,
    BIAS_SOURCES["triton"]: "book kernel",
    BIAS_SOURCES["paper-untiled"]: "paper's all-BF16 path (one tile)",
}
SOURCE_NAMES = ("no bias", "storage (the ideal's)", "accumulation (beyond the ideal)")


def _v_title(vt, vr):
    return f"tied V ≈ {vt:+g}, other V ≈ {vr:+g}"


def plot_ideal_bias(records, ax=None):
    """Bias of the ideal bf16(O_exact) against the gap, one line per number of ties, for the
    V setting where it is largest (tied V ≈ −1, other V ≈ 0)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.8, 3.6), layout="constrained")
    vt, vr = V_SETTINGS[0]
    for k in sorted({r["ties"] for r in records}):
        rows = sorted(
            (
                r
                for r in records
                if r["impl"] == "ideal"
                and r["ties"] == k
                and r["v_tied_mean"] == vt
                and r["v_rest_mean"] == vr
            ),
            key=lambda r: r["gap"],
        )
        ax.errorbar(
            [r["gap"] for r in rows],
            [r["mean"] for r in rows],
            yerr=[1.96 * r["se"] for r in rows],
            marker="o",
            capsize=3,
            label=f"k = {k} tied maxima",
        )
    ax.axhline(0, color="gray", lw=0.8)
    ax.set(
        xlabel="gap: how far the other scores sit below the tied maximum",
        ylabel="mean error of bf16(O_exact) [ulp]",
        title=_v_title(vt, vr),
    )
    ax.legend(loc="upper left")
    return ax.figure


def kernel_excess(bias_records, settings):
    """{(ties, vmax, vrest): {impl: (bias, bias − ideal's bias)}} from bias_sources_gpu."""
    table = {}
    for key in settings:
        rows = {
            r["impl"]: r["out"]["bias"]
            for r in bias_records
            if (r["ties"], r["vmax"], r["vrest"]) == key
        }
        table[key] = {impl: (b, b - rows["ideal"]) for impl, b in rows.items()}
    return table


def plot_kernel_excess(stored, settings, impls=KERNELS, ax=None):
    """What each GPU kernel adds to the mean error beyond the ideal, per setting, from the
    stored result of bias_sources_gpu (its records, and its GPU for the title)."""
    import matplotlib.pyplot as plt

    from ..results import gpu_short

    if ax is None:
        _, ax = plt.subplots(figsize=(6.8, 3.8), layout="constrained")
    table = kernel_excess(stored["data"]["records"], settings)
    width = 0.8 / len(impls)
    x = np.arange(len(settings))
    for i, impl in enumerate(impls):
        ax.bar(
            x + (i - (len(impls) - 1) / 2) * width,
            [table[s][impl][1] for s in settings],
            width,
            label=NAMES[impl],
        )
    ax.axhline(0, color="gray", lw=0.8)
    top = max(abs(table[s][impl][1]) for s in settings for impl in impls)
    for xi, s in zip(x, settings):  # bars of height 0 are invisible: say what they mean
        if all(abs(table[s][impl][1]) < 5e-4 for impl in impls):
            ax.text(xi, 0.04 * top, "all equal\nthe ideal", ha="center", va="bottom", color="0.3")
    ax.set_xticks(x, [f"k={k}\nV {vt:+g} / {vr:+g}" for k, vt, vr in settings])
    ax.set(
        ylabel="kernel bias − ideal's bias [ulp]",
        title=f"what GPU kernels add beyond the ideal ({gpu_short(stored)})",
    )
    ax.legend(ncols=2, loc="upper left")
    return ax.figure


def plot_paper_path(bias_records, settings, ax=None):
    """The paper's all-bf16 path next to the ideal, per setting."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.8, 3.6), layout="constrained")
    table = kernel_excess(bias_records, settings)
    x = np.arange(len(settings))
    for i, impl in enumerate((BIAS_SOURCES["ideal"], BIAS_SOURCES["paper-untiled"])):
        ax.bar(
            x + (i - 0.5) * 0.38,
            [table[s][impl][0] for s in settings],
            0.38,
            label=NAMES[impl],
            color=("tab:gray", "tab:red")[i],
        )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [f"k={k}\nV {vt:+g} / {vr:+g}" for k, vt, vr in settings])
    ax.set(ylabel="mean error of O [ulp]", title="the paper's all-BF16 path against the ideal")
    ax.legend()
    return ax.figure


def source_map(records, kernel=BIAS_SOURCES["sdpa-flash"], threshold=0.02):
    """For each (V setting, ties, gap) of the GPU sweep: 0 no bias, 1 the ideal's (storage)
    bias and the kernel adds nothing that matters, 2 the kernel adds ≥ threshold beyond it."""
    by = {
        (r["impl"], r["v_tied_mean"], r["v_rest_mean"], r["ties"], r["gap"]): r
        for r in records
        if "mean" in r
    }
    ties = sorted({r["ties"] for r in records})
    gaps = sorted({r["gap"] for r in records})
    maps = {}
    for vt, vr in V_SETTINGS:
        grid = np.zeros((len(ties), len(gaps)), dtype=int)
        for i, k in enumerate(ties):
            for j, g in enumerate(gaps):
                ideal, kern = by[("ideal", vt, vr, k, g)], by[(kernel, vt, vr, k, g)]
                if abs(kern["mean"] - ideal["mean"]) >= threshold:
                    grid[i, j] = 2
                elif is_biased(ideal):
                    grid[i, j] = 1
        maps[(vt, vr)] = grid
    return maps, ties, gaps


def plot_source_map(records, kernel=BIAS_SOURCES["sdpa-flash"]):
    """Four small maps (one per V setting) of which source dominates, k against gap; one colour
    bar under them names the three sources."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    maps, ties, gaps = source_map(records, kernel)
    cmap = ListedColormap(["#e8e8e8", "#4c72b0", "#dd8452"])
    fig, axes = plt.subplots(
        2, 2, figsize=(6.8, 6.4), layout="constrained", sharex=True, sharey=True
    )
    for ax, ((vt, vr), grid) in zip(axes.flat, maps.items()):
        im = ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=2.5, aspect="auto", origin="lower")
        ax.set_xticks(range(len(gaps)), [f"{g:g}" for g in gaps])
        ax.set_yticks(range(len(ties)), [str(k) for k in ties])
        ax.set_title(_v_title(vt, vr))
        ax.grid(False)
    for ax in axes[-1]:
        ax.set_xlabel("gap")
    for ax in axes[:, 0]:
        ax.set_ylabel("tied maxima k")
    bar = fig.colorbar(
        im,
        ax=axes,
        ticks=[0, 1, 2],
        orientation="horizontal",
        location="bottom",
        fraction=0.05,
        aspect=40,
    )
    bar.ax.set_xticklabels(SOURCE_NAMES)
    bar.ax.set_xlabel(f"which source dominates {KERNEL_LABELS[kernel]}'s error")
    return fig


def plot_running_error(run, sums, title):
    """The paper's Fig. 6c for one output (top): the error of the running sum Ō(t) along the
    keys (Eq. 5) and of the exact running sum rounded once (the ideal), in ulps of the final Ō,
    from :func:`kernels.rounding_lab.running_error`; and (bottom) the mean error of the final Ō
    over all outputs, ``sums`` = {setting: {"error": ..., "ideal": ...}} from
    :func:`kernels.rounding_lab.sum_errors`."""
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.8, 6.0), layout="constrained")
    unit = float(2.0 ** (np.floor(np.log2(abs(run["hp"][-1]))) - 7))
    t = np.arange(run["error"].size)
    top.plot(
        t,
        run["ideal"] / unit,
        color="C1",
        lw=3,
        alpha=0.6,
        label="exact sum rounded once (the lines coincide)",
    )
    top.plot(
        t,
        run["error"] / unit,
        color="C0",
        lw=1,
        label="Eq. 5: the fp32 running sum, rounded to BF16 at each key t",
    )
    ones = run["p_is_one"]
    top.plot(ones, run["error"][ones] / unit, "rv", ms=7, label="P̄ = 1 (a tied maximum)")
    top.axhline(0, color="black", lw=0.6)
    top.set(xlabel="key position t", ylabel="Ō_lp(t) − Ō_hp(t) [ulp of final Ō]")
    top.set_title(title)
    top.legend(loc="lower left")
    names = list(sums)
    x = np.arange(len(names))
    series = (
        ("error", "Eq. 5: rounded to BF16 at each key"),
        ("ideal", "ideal: the exact Ō rounded once"),
    )
    for j, (key, name) in enumerate(series):
        means = [float(np.mean(sums[n][key])) for n in names]
        bottom.bar(x + (j - 0.5) * 0.38, means, 0.38, label=name, color=f"C{j}")
    bottom.axhline(0, color="black", lw=0.8)
    bottom.set_xticks(x, names)
    bottom.set(ylabel="mean error of final Ō [ulp]", title="every output, at the last key")
    bottom.legend()
    return fig


def largest_excess(records: list, impl: str) -> float:
    """The largest |mean error| that ``impl`` adds beyond the ideal, over the sweep's cells (ulps):
    the kernel's own bias, with the ideal's storage bias taken out cell by cell."""
    ideal = {r["cell"]: r["mean"] for r in records if r["impl"] == "ideal" and "mean" in r}
    excess = [abs(r["mean"] - ideal[r["cell"]]) for r in records
              if r["impl"] == impl and "mean" in r and r["cell"] in ideal]  # fmt: skip
    if not excess:
        raise ValueError(f"no cell has both {impl!r} and the ideal")
    return max(excess)
