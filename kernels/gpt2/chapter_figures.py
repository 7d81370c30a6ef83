"""Three small figures of chapter 7 drawn from a few runs (the CPU pair, the isolation ladder, the
lean of real BF16's δ error); the figures of many stored runs are in :mod:`.figures`.
"""

from __future__ import annotations

import numpy as np

from .report import VARIANT_COLOURS, VARIANT_NAMES, monitor_series, outcome, smooth


def plot_pair(axes, failing: dict, control: dict) -> None:
    """Layer 0's ‖W_Q‖ (left) and the smoothed loss (right) of a failing run and its control."""
    for run, variant in ((failing, "U"), (control, "F")):
        colour, label = VARIANT_COLOURS[variant], VARIANT_NAMES[variant]
        axes[0].plot(*monitor_series(run, "wq", 0), "o-", ms=3, color=colour, label=label)
        h = run["history"]
        axes[1].plot(*smooth(h["step"], h["loss"], 5), color=colour)
    axes[0].set(yscale="log", xlabel="training step", ylabel="‖W_Q‖₂ (largest head)")
    axes[1].set(xlabel="training step", ylabel="loss (nats / byte)")
    axes[0].legend(fontsize=9)


def plot_ladder(ax, rungs: dict) -> None:
    """One bar per rung ({variant: run}): solid until it failed, hatched if it survived."""
    for i, (variant, run) in enumerate(rungs.items()):
        o = outcome(run)
        failed = o["step"] is not None
        ax.barh(
            i,
            o["step"] if failed else o["steps"],
            color=VARIANT_COLOURS[variant],
            hatch=None if failed else "//",
            alpha=1 if failed else 0.4,
        )
    ax.set_yticks(range(len(rungs)), [VARIANT_NAMES[v] for v in rungs], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("training steps (solid: until it failed; hatched: survived)", fontsize=9)


def plot_leans(ax, early: dict, whole: dict) -> None:
    """The δ error's lean (%) of each run ({label: lean}) early and over the whole run."""
    rows = np.arange(len(early))
    ax.barh(rows - 0.2, list(early.values()), 0.4, color="0.6", label="steps 0–10,000")
    ax.barh(rows + 0.2, list(whole.values()), 0.4, color="tab:red", label="whole run")
    ax.set_yticks(rows, list(early), fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("lean of the δ error, Σ(δ_lp − δ_hp) / Σ|δ_lp − δ_hp| (%)")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.4, -0.28), ncol=2)
