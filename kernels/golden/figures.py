"""The chapter's figures. Each takes records (computed now, or loaded from ``results/``)
and a matplotlib axis, so the same code draws a CPU measurement and a stored GPU one."""

from __future__ import annotations

import numpy as np

from . import training
from .implementations import SHORT
from .microbench import one, pick

COLOURS = {
    "baseline": "0.45",
    "baseline_fp32": "0.75",
    "ideal": "k",
    "fa2": "tab:blue",
    "paper": "tab:red",
    "fa1": "tab:orange",
    "triton": "tab:cyan",
    "sdpa_flash": "tab:green",
    "torch_math": "tab:brown",
}
PAIR_COLOURS = {
    "attention: fused SDPA vs exact": "tab:blue",
    "attention: all-BF16 flash vs exact": "tab:red",
    "initialisation seed": "k",
    "precision: BF16 vs fp32": "tab:purple",
    "one weight, one BF16 ulp": "tab:green",
    "failing path vs its control": "tab:red",
    "initialisation seed (control)": "k",
}
FORMAT_ORDER = ("bf16", "fp16", "fp32", "fp64")
TILE_COLOURS = ("tab:purple", "tab:brown", "tab:green", "tab:olive", "tab:pink", "tab:gray")
TILE_MARKERS = ("v", "s", "o", "D", "^", "P", "X")


def plot_precision(
    ax,
    records,
    inputs="gaussian",
    measure="max_abs",
    impls=("baseline", "baseline_fp32", "fa2", "paper", "fa1"),
):
    """Golden et al.'s Fig. 4: each implementation's deviation from the golden value,
    grouped by format (log scale, a marker each). Implementations missing in a format (a GPU kernel
    without fp64) are left out of that group."""
    formats = [f for f in FORMAT_ORDER if pick(records, inputs=inputs, format=f)]
    impls = [i for i in impls if pick(records, inputs=inputs, impl=i)]
    width = 0.8 / len(impls)
    for j, name in enumerate(impls):
        xs, ys = [], []
        for i, fmt in enumerate(formats):
            found = pick(records, inputs=inputs, format=fmt, impl=name)
            if found and found[0]["vs_golden"][measure] > 0:
                xs.append(i + (j - (len(impls) - 1) / 2) * width)
                ys.append(found[0]["vs_golden"][measure])
        # points, not bars: on a log axis a bar has no base, its length would mean nothing
        ax.plot(
            xs,
            ys,
            marker=TILE_MARKERS[j % len(TILE_MARKERS)],
            linestyle="none",
            markersize=7,
            color=COLOURS.get(name, None),
            label=SHORT.get(name, name),
        )
    ax.set_yscale("log")
    ax.set_xlim(-0.6, len(formats) - 0.4)
    ax.set_xticks(range(len(formats)), formats)
    word = {"max_abs": "max |O − O_golden|", "rel_norm": "‖O − O_golden‖ / ‖O_golden‖"}[measure]
    ax.set(xlabel="number format of inputs and intermediates", ylabel=word)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))


def plot_bias_vs_size(ax, records, settings, impls=("baseline", "fa2", "paper", "fa1")):
    """Sink rows: Golden's measure (max |O − O_golden| relative to the ideal's) against
    the mean signed error beyond the ideal (ulps), one marker per implementation and
    setting."""
    markers = "osD^v"
    sizes = {"paper": 110, "fa1": 35}  # the two all-low paths often coincide
    for k, setting in enumerate(settings):
        best = one(records, inputs=setting, impl="ideal", format="bf16")["vs_golden"]["max_abs"]
        for name in impls:
            r = one(records, inputs=setting, impl=name, format="bf16")
            ax.scatter(
                r["vs_golden"]["max_abs"] / best,
                r["bias_beyond_ideal_ulps"],
                s=sizes.get(name, 55),
                color=COLOURS[name],
                marker=markers[k % len(markers)],
                label=SHORT[name] if k == 0 else None,
            )
    for k, setting in enumerate(settings):
        ax.scatter(
            [],
            [],
            facecolor="none",
            edgecolor="k",
            marker=markers[k % len(markers)],
            label=setting.replace("sink: ", ""),
        )
    ax.axhline(0, color="k", lw=0.8)
    ax.set(
        xlabel="max |O − O_golden| / the ideal's (Golden's measure)",
        ylabel="mean error beyond the ideal (ulp)",
    )
    ax.legend(fontsize=9, loc="center left", bbox_to_anchor=(1.01, 0.5))


def plot_seqlen(axes, records, impls=("fa2", "paper", "fa1")):
    """Golden et al.'s Fig. 5, two panels: (left) max and mean ± std of |O_flash −
    O_baseline| against N; (right) each implementation's relative error against the
    golden value."""
    left, right = axes
    for name in impls:
        rows = sorted(pick(records, impl=name), key=lambda r: r["n"])
        if not rows:
            continue
        n = np.array([r["n"] for r in rows])
        colour = COLOURS.get(name)
        mean = np.array([r["vs_baseline"]["mean_abs"] for r in rows])
        std = np.array([r["vs_baseline"]["std_abs"] for r in rows])
        left.plot(n, [r["vs_baseline"]["max_abs"] for r in rows], "--", marker="^", color=colour)
        left.errorbar(
            n, mean, yerr=std, marker="o", color=colour, capsize=3, label=SHORT.get(name, name)
        )
        right.plot(
            n,
            [r["vs_golden"]["rel_norm"] for r in rows],
            marker="o",
            color=colour,
            label=SHORT.get(name, name),
        )
    ideal = sorted(pick(records, impl="ideal"), key=lambda r: r["n"])
    if ideal:
        right.plot(
            [r["n"] for r in ideal],
            [r["vs_golden"]["rel_norm"] for r in ideal],
            "k:",
            label="ideal",
        )
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (keys)")
    left.set_yscale("log")
    left.set_ylabel("|O_flash − O_baseline|:\nmax (dashed), mean ± std")
    right.set_ylabel("‖O − O_golden‖ / ‖O_golden‖")
    right.set_yscale("log")
    # below both panels: inside the right one it would hide the all-low curves
    handles, labels = right.get_legend_handles_labels()
    right.figure.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9)


def plot_rescalings(axes, records, by_count):
    """(left) measured running-maximum growths per row against N, with their expectation
    for i.i.d. scores (exercise 8.1's answer, left unnamed); (right) each row's relative
    error grouped by its number of growths, at one N."""
    left, right = axes
    rows = sorted(pick(records, impl="fa2"), key=lambda r: r["n"])
    n = [r["n"] for r in rows]
    left.plot(
        n, [r["rescalings_mean"] for r in rows], "o-", color="tab:blue", label="emulator (mean)"
    )
    expected = [r["rescalings_expected"] for r in rows]
    left.plot(n, expected, "k--", label="expected, i.i.d. scores")
    left.plot(n, [r["tiles"] for r in rows], ":", color="0.5", label="key tiles T")
    left.set(
        xscale="log", yscale="log", xlabel="sequence length N (keys)", ylabel="per row (count)"
    )
    left.set_xscale("log", base=2)
    # head room on the log axis so the legend sits above every line
    left.set_ylim(top=8 * max(r["tiles"] for r in rows))
    left.legend(loc="upper left", fontsize=9)
    for name, table in by_count.items():
        counts = sorted(int(c) for c in table)
        keep = [c for c in counts if table[c][0] >= 20]  # groups of >= 20 rows
        right.plot(
            keep,
            [table[c][1] for c in keep],
            "o-",
            color=COLOURS.get(name),
            label=SHORT.get(name, name),
        )
    right.set(
        yscale="log",
        xlabel="times the running max grew (row)",
        ylabel="mean relative error of the row",
    )
    right.legend()


def plot_tiles(ax, records, fmt="bf16", marks=None):
    """Golden et al.'s Fig. 6: max |O − O_golden| against the block area B_r·B_c for FA1
    (one colour per B_c, every B_r), with the FA2 emulator per B_c as horizontal lines;
    ``marks`` {label: area or list of areas} draws vertical lines where a kernel's tiles
    sit."""
    fa1 = pick(records, impl="fa1", format=fmt)
    widths = sorted({r["block_n"] for r in fa1})
    heights = sorted({r["block_m"] for r in fa1})
    # colour = B_c (the key tile), marker = B_r (the query block): no text labels to collide
    markers = dict(zip(heights, TILE_MARKERS))
    for i, bc in enumerate(widths):
        rows = sorted((r for r in fa1 if r["block_n"] == bc), key=lambda r: r["area"])
        colour = TILE_COLOURS[i % len(TILE_COLOURS)]
        ax.plot(
            [r["area"] for r in rows],
            [r["vs_golden"]["max_abs"] for r in rows],
            "-",
            color=colour,
            label=f"FA1, B_c = {bc}",
        )
        for r in rows:
            ax.plot(
                r["area"],
                r["vs_golden"]["max_abs"],
                markers[r["block_m"]],
                color=colour,
                ms=7,
                mec="black",
                mew=0.5,
            )
    for bm in heights:
        ax.plot([], [], markers[bm], color="0.6", mec="black", mew=0.5, ms=7, label=f"B_r = {bm}")
    for r in pick(records, impl="fa2", format=fmt):
        ax.axhline(r["vs_golden"]["max_abs"], color=COLOURS["fa2"], lw=0.8, ls="-")
    ax.plot([], [], color=COLOURS["fa2"], lw=0.8, label=f"{SHORT['fa2']} (every B_c)")
    # the first mark (the kernel's own tile) in colour and on top, so a later mark at the
    # same area (an autotuner option) cannot hide it
    looks = ((":", "tab:red", 2.0, 3), ("--", "0.3", 1.2, 2), ("-.", "0.3", 1.2, 2))
    for (label, areas), (style, colour, width, z) in zip((marks or {}).items(), looks):
        for i, area in enumerate(np.atleast_1d(areas)):
            ax.axvline(area, color=colour, ls=style, lw=width, zorder=z,
                       label=label if i == 0 else None)  # fmt: skip
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="block area B_r × B_c (elements)",
        ylabel="max |O − O_golden|",
    )
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)


def plot_weight_distance(
    ax, record, metric="wasserstein", matrices="median", labels=None, mark_explosion=True
):
    """Golden et al.'s Figs. 7–8: one pair's weight distance over training per curve
    (median over the weight matrices, the largest, or one matrix by name)."""
    labels = labels or [c["label"] for c in record["pairs"]]
    for label in labels:
        colour = PAIR_COLOURS.get(label)
        steps, values = training.curve(record, label, metric, matrices)
        keep = values > 0
        ax.plot(steps[keep], values[keep], marker=".", color=colour, label=label)
    if mark_explosion:
        for name, step in record.get("explosion", {}).items():
            if step is not None:
                ax.axvline(step, color="0.3", ls="--", lw=1)
                ax.annotate(
                    f"loss of '{name}' explodes",
                    (step, 0.02),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=9,
                    ha="right",
                    color="0.3",
                )
    word = {"wasserstein": "Wasserstein distance", "max_diff": "max |W_a − W_b|"}[metric]
    which = {"median": "median over matrices", "max": "largest over matrices"}.get(
        matrices, matrices
    )
    ax.set(yscale="log", xlabel="training step", ylabel=f"{word}\n({which})")
    ax.legend(fontsize=9)


def plot_stored_band(ax, steps, dist, band, explosion=None, departures=None, label=""):
    """The failing run's W₁ from its control (line) over the controls' seed band
    (shaded), with its explosion (dashed) and the GPT-2 chapter's departure steps
    marked."""
    ax.fill_between(steps, 0, band, color="0.8", label="seed noise (controls, 3 seeds)")
    ax.plot(steps, dist, color="tab:red", lw=1.3, label=label or "failing path vs its control")
    if explosion is not None:
        ax.axvline(explosion, color="k", ls="--", lw=1.2, label="loss explodes")
    for (name, step), style in zip((departures or {}).items(), (":", "-.")):
        if step is not None and np.isfinite(step):
            ax.axvline(step, color="0.3", ls=style, lw=1.2, label=name)
    ax.set_yscale("symlog", linthresh=0.01)
    top = max(float(np.nanmax(dist)), float(np.nanmax(band)))
    ax.set_ylim(0, top * 2)
