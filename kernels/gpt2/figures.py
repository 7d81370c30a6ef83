"""The GPT-2 chapter's figures of stored runs: one message each, fonts of at least ``FONT`` points
at the column's width. The data they draw come from :mod:`.report` (reading and measuring runs).
"""

from __future__ import annotations

import textwrap

import numpy as np

from .report import (
    CONTROL_ORDER,
    FIX_ORDER,
    FONT,
    VARIANT_COLOURS,
    VARIANT_NAMES,
    monitor_series,
    obits_of,
    outcome,
    pair_departures,
    parse_name,
    ratio_to_control,
    rolling_mean,
    smooth,
)


def plot_steps_to_failure(ax, table, variants=("U", "R", "F", "S")):
    """Steps to failure against the mantissa bits of Ō; a run that did not fail is drawn as an
    open marker at the step it reached, with an arrow up (failure, if any, comes later)."""
    offsets = {v: (i - (len(variants) - 1) / 2) * 0.12 for i, v in enumerate(variants)}
    for variant in variants:
        rows = table[table.variant == variant]
        failed, alive = rows[rows.step.notna()], rows[rows.step.isna()]
        colour = VARIANT_COLOURS[variant]
        if len(failed):
            ax.scatter(
                failed.obits + offsets[variant],
                failed.step,
                color=colour,
                s=30,
                marker="o",
                label=f"{VARIANT_NAMES[variant]}: failed",
            )
        if len(alive):
            ax.scatter(
                alive.obits + offsets[variant],
                alive.steps,
                facecolor="none",
                edgecolor=colour,
                s=40,
                marker="^",
                label=f"{VARIANT_NAMES[variant]}: still training",
            )
    ax.set(
        yscale="log",
        xlabel="mantissa bits of Ō (7 = bf16)",
        ylabel="training steps",
        title="steps to loss explosion or NaN",
    )
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _schedule_label(run: dict) -> str:
    bits = obits_of(run)
    name = "bf16" if bits == 7 else f"{bits} bits"
    steps = run["config"]["steps"]
    return name if steps == 20_000 else f"{name}, {steps // 1000}k-step schedule"


def outcome_rows(runs: dict, order="UTLPRSF"):
    """One row per (Ō width and schedule, variant): label in words and the runs it holds, in
    the order a reader scans them (narrowest Ō first, the failing path first)."""
    groups = {}
    for name, run in runs.items():
        variant = parse_name(name)[1]
        key = (obits_of(run), run["config"]["steps"], variant)
        groups.setdefault(key, []).append(name)
    keys = sorted(groups, key=lambda k: (k[0], k[1], order.index(k[2]) if k[2] in order else 99))
    return [
        (f"{_schedule_label(runs[groups[k][0]])}: {VARIANT_NAMES[k[2]]}", k[2], groups[k])
        for k in keys
    ]


OUTCOME_MARKERS = {
    "explosion": dict(marker="o", s=36),
    "NaN": dict(marker="X", s=46),
    None: dict(marker=">", s=40),
}
OUTCOME_WORDS = {
    "explosion": "loss exploded",
    "NaN": "went NaN",
    None: "still training when its time ran out",
}


def plot_outcomes(ax, runs: dict, departures: dict | None = None):
    """Every run as a dot: where its loss exploded (filled circle), where it went NaN (cross), or
    the last step it reached while still training (open triangle). One row per Ō width,
    schedule and variant; seeds share a row. Colour = variant, shape = outcome.
    ``departures`` {run name: step} adds a bar where a run's ‖W_Q‖ left its control's."""
    from matplotlib.lines import Line2D

    rows = outcome_rows(runs)
    departures = departures or {}
    for y, (_, variant, names) in enumerate(rows):
        colour = VARIANT_COLOURS[variant]
        for name in names:
            o = outcome(runs[name])
            x = o["step"] if o["step"] is not None else o["steps"]
            style = dict(OUTCOME_MARKERS[o["event"]])
            if o["event"] is None:
                style.update(facecolor="none", edgecolor=colour)
            else:
                style.update(color=colour)
            ax.scatter(x, y, zorder=3, **style)
            if departures.get(name) is not None:
                ax.scatter(departures[name], y, marker="|", s=120, lw=2, color="0.25", zorder=2)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=FONT)
    ax.invert_yaxis()
    ax.set(xscale="log", xlim=(700, 5e4))
    ax.set_xlabel("training step (log scale)", fontsize=FONT)
    proxies = [
        Line2D(
            [],
            [],
            ls="",
            marker=OUTCOME_MARKERS[e]["marker"],
            ms=7,
            markerfacecolor="none" if e is None else "0.35",
            markeredgecolor="0.35",
            label=OUTCOME_WORDS[e],
        )
        for e in OUTCOME_MARKERS
    ]
    if departures:
        proxies.append(
            Line2D(
                [],
                [],
                ls="",
                marker="|",
                ms=10,
                mew=2,
                color="0.25",
                label="‖W_Q‖ left the control's",
            )
        )
    ax.legend(
        handles=proxies, fontsize=FONT, loc="upper center", ncol=2, bbox_to_anchor=(0.3, -0.09)
    )


def _mark(ax, step, colour, style):
    if step is not None:
        ax.axvline(step, color=colour, ls=style, lw=1.2)


def departure_legend(ax, keys=("rows_tied_bf16", "wq"), target=None, **kw):
    """A legend for the vertical lines that mark departures, added to ``ax``'s own entries and
    drawn on ``target`` (an axis or a figure; default ``ax``)."""
    from matplotlib.lines import Line2D

    words = {
        "rows_tied_bf16": ("--", "tie share leaves the control's"),
        "wq": (":", "‖W_Q‖ leaves the control's"),
        "rank1_token_cos": ("-.", "similarity leaves the control's"),
    }
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="0.3", ls=words[k][0], label=words[k][1]) for k in keys]
    (target or ax).legend(handles=handles, fontsize=FONT, **kw)


def plot_precondition(axes, failing: dict, control: dict, layer: int = 0, width: int = 25):
    """Three stacked panels over training steps, failing run (red) and its control (blue): the
    loss, the share of rows with repeated maxima (exactly tied maxima of a bf16 S, the paper's
    App. E.1 count), and ‖W_Q‖₂; dashed: where the tie share leaves the control's, dotted: where
    ‖W_Q‖ does (:data:`DEPARTURE_RULES`)."""
    dep = pair_departures(failing, control, layer)
    for run, colour, who in (
        (failing, VARIANT_COLOURS["U"], "failing path"),
        (control, VARIANT_COLOURS["F"], "control"),
    ):
        h = run["history"]
        axes[0].plot(*smooth(h["step"], h["loss"], width), color=colour, lw=1.2, label=who)
        steps, ties = monitor_series(run, "rows_tied_bf16", layer)
        axes[1].plot(steps, rolling_mean(ties, 5), color=colour, lw=1.2)
        steps, wq = monitor_series(run, "wq", layer)
        axes[2].plot(steps, wq, color=colour, lw=1.2)
    for ax in axes:
        _mark(ax, dep["rows_tied_bf16"], "0.3", "--")
        _mark(ax, dep["wq"], "0.3", ":")
    axes[0].set_ylabel("loss (nats/byte)", fontsize=FONT)
    axes[1].set_ylabel(f"rows with tied\nmaxima, layer {layer} (%)", fontsize=FONT)
    axes[2].set(yscale="log")
    axes[2].set_ylabel(f"‖W_Q‖₂, layer {layer}", fontsize=FONT)
    axes[2].set_xlabel("training step", fontsize=FONT)
    step_axis(axes[2], int(monitor_series(failing, "wq", layer)[0][-1]))
    return dep


def plot_similarity(ax, failing: dict, control: dict, layer: int = 0):
    """The mean cosine similarity of the rank-1 terms (PK)[T]ᵀX[T] over pairs of tokens (Eq. 2,
    the paper's Fig. 4), failing run and control, with the two departure steps marked."""
    dep = pair_departures(failing, control, layer)
    for run, colour, who in (
        (failing, VARIANT_COLOURS["U"], "failing path"),
        (control, VARIANT_COLOURS["F"], "control"),
    ):
        steps, cos = monitor_series(run, "rank1_token_cos", layer)
        ax.plot(steps, rolling_mean(cos, 5), color=colour, lw=1.2, label=who)
    _mark(ax, dep["rank1_token_cos"], "0.3", "-.")
    _mark(ax, dep["wq"], "0.3", ":")
    ax.set_xlabel("training step", fontsize=FONT)
    ax.set_ylim(0, 1)
    return dep


def plot_bias_shares(ax, groups: dict):
    """Dot plot of Σ(δ_lp − δ_hp) / Σ|δ_lp − δ_hp| per run, one row per group {label: values}."""
    rng = np.random.default_rng(0)
    for y, (values, colour) in enumerate(groups.values()):
        values = np.asarray(values, dtype=float)
        ax.scatter(
            100 * values, y + rng.uniform(-0.15, 0.15, len(values)), color=colour, s=24, alpha=0.8
        )
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(groups)), list(groups), fontsize=FONT)
    ax.invert_yaxis()
    ax.set_xlabel("Σ(δ_lp − δ_hp) as % of Σ|δ_lp − δ_hp|, layer 0", fontsize=FONT)


FIX_STYLES = {"C": "--", "D": "-.", "K": ":"}  # the repaired β rules, told apart by line too


def plot_fix_growth(ax, runs: dict, layer: int = 0, width: int = 5, order: str = FIX_ORDER):
    """Layer ``layer``'s ‖W_Q‖₂ over its same-seed control's against the step, one line per run
    of :func:`fix_runs` (colour = variant, in the order of ``order``), smoothed over ``width``
    checks; each line ends in its outcome's marker (explosion, NaN, or still training). The
    control of a run is ``k4-F-<its seed>``."""
    drawn = set()
    for variant in order:
        if variant == "F":
            continue
        for name in sorted(n for n in runs if parse_name(n)[1] == variant):
            steps, ratio = ratio_to_control(runs[name], runs[f"k4-F-{parse_name(name)[2]}"], layer)
            o = outcome(runs[name])
            end = o["step"] if o["step"] is not None else o["steps"]
            steps, ratio = steps[steps <= end], ratio[steps <= end]
            if len(steps) > width:
                ratio = np.convolve(ratio, np.ones(width) / width, mode="valid")
                steps = steps[width - 1 :]
            colour = VARIANT_COLOURS[variant]
            label = None if variant in drawn else VARIANT_NAMES[variant]
            drawn.add(variant)
            ax.plot(
                steps, ratio, color=colour, lw=1.4, label=label, ls=FIX_STYLES.get(variant, "-")
            )
            style = dict(OUTCOME_MARKERS[o["event"]])
            if o["event"] is None:
                style.update(facecolor="none", edgecolor=colour)
            else:
                style.update(color=colour)
            if len(steps):
                ax.scatter(steps[-1], ratio[-1], zorder=3, **style)
    ax.axhline(1.0, color=VARIANT_COLOURS["F"], lw=1, ls="--", label=VARIANT_NAMES["F"] + " (= 1)")
    ax.set_yscale("log")
    ax.set_xlabel("training step", fontsize=FONT)
    ax.set_ylabel(f"layer-{layer} ‖W_Q‖₂ ÷ control's", fontsize=FONT)


def plot_controls(fig, runs: dict, controls: dict, seeds=("s1", "s2"), last_step=10_000):
    """The bias-or-size controls, one panel per seed (stacked): layer 0's ‖W_Q‖₂ over the
    control's for the failing path (``k4-U-<seed>`` in ``runs``) and every control run of that
    seed in ``controls`` (:func:`.report.control_runs`; variants of :data:`CONTROL_ORDER`).
    Returns the axes and the figure's legend entries (handles, labels)."""
    axes = fig.subplots(len(seeds), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, seed in zip(axes, seeds):
        panel = {n: runs[n] for n in (f"k4-U-{seed}", f"k4-F-{seed}")}
        for name, run in controls.items():
            _, variant, of_seed = parse_name(name)
            if of_seed == seed and variant in CONTROL_ORDER:
                panel[name] = run
        plot_fix_growth(ax, panel, order="U" + CONTROL_ORDER + "F")
        ax.set_title(f"Ō with 4 bits, seed {seed[1:]}", loc="left", fontsize=FONT + 1)
    axes[-1].set_xlim(0, last_step)
    for ax in axes[:-1]:
        ax.set_xlabel("")
    return axes, legend_entries(axes)


def legend_entries(axes):
    """(handles, labels) of every labelled line of ``axes``, each label once, for one legend
    under a figure of several panels."""
    legend: dict = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    return list(legend.values()), list(legend)


def step_axis(ax, last_step: int):
    """Step ticks labelled in thousands ("20k"), every 10k steps or every 20k past 40k steps
    (five-digit labels, or too many of them, collide at the column's width)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    ax.xaxis.set_major_locator(MultipleLocator(10_000 if last_step <= 40_000 else 20_000))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:.0f}k"))


# δ from rowsum(dP∘P) dashed: in real BF16 it lies on the control's line
REAL_STYLES = {"P": "--"}


def plot_real_bf16(axes, runs: dict, layer: int = 0, width: int = 50):
    """Real BF16: layer ``layer``'s ‖W_Q‖₂ (largest head, log scale) and the smoothed loss
    against the step, one line per run of ``runs`` {legend label: (variant, run)}; colour
    = variant, thin dotted = a repeated run; a cross marks a loss explosion."""
    last = 0
    for label, (variant, run, *repeat) in runs.items():
        style = dict(
            color=VARIANT_COLOURS[variant],
            ls=":" if repeat else REAL_STYLES.get(variant, "-"),
            lw=1.0 if repeat else 1.4,
            label=label,
        )
        steps, wq = monitor_series(run, "wq", layer)
        axes[0].plot(steps, wq, **style)
        h = run["history"]
        loss_steps, loss = smooth(h["step"], h["loss"], width)
        axes[1].plot(loss_steps, loss, **style)
        boom = outcome(run)["step"]
        if boom is not None:  # mark each series' value at (or just after) the explosion
            for ax, xs, ys in ((axes[0], steps, wq), (axes[1], loss_steps, loss)):
                at = min(np.searchsorted(xs, boom), len(ys) - 1)
                ax.plot(boom, ys[at], "X", color=style["color"], ms=9, mec="black")
        last = max(last, int(steps[-1]))
    axes[0].set_yscale("log")
    axes[0].set_ylabel(f"‖W_Q‖₂, layer {layer}, largest head", fontsize=FONT)
    axes[1].set_ylabel("loss (nats / byte)", fontsize=FONT)
    for ax in axes:
        ax.set_xlabel("training step", fontsize=FONT)
        step_axis(ax, last)


def plot_real_bf16_seeds(fig, runs: dict, variants="UFPZ", earlier=None, layer: int = 0):
    """Real BF16 in one figure, a row of panels per seed: ‖W_Q‖₂ (left) and loss (right) of
    each attention in ``variants``. ``runs``: {(variant, seed): run} (as
    :func:`.report.real_bf16_runs` reads them); ``earlier``: an earlier run of seed 0's
    failing path, drawn dotted. A seed's attentions not stored yet are named in its loss
    panel. Returns the axes (seeds × 2) and the figure's legend entries."""
    seeds = sorted({seed for _, seed in runs})
    axes = fig.subplots(len(seeds), 2, sharex=True, squeeze=False)
    for seed, row in zip(seeds, axes):
        lines = {VARIANT_NAMES[v]: (v, runs[v, seed]) for v in variants if (v, seed) in runs}
        if earlier is not None and seed == "s0":
            lines["failing path, an earlier run"] = ("U", earlier, "repeat")
        plot_real_bf16(row, lines, layer)
        row[0].set_title(f"seed {seed[1:]}", loc="left", fontsize=FONT)
        missing = [VARIANT_NAMES[v] for v in variants if (v, seed) not in runs]
        if missing:
            note = "not run yet:\n" + "\n".join(textwrap.fill(m, 24) for m in missing)
            row[1].text(
                0.97,
                0.95,
                note,
                transform=row[1].transAxes,
                ha="right",
                va="top",
                fontsize=FONT,
                color="0.35",
            )
    for ax in axes[:-1].ravel():
        ax.set_xlabel("")
    return axes, legend_entries(axes[:, 0])
