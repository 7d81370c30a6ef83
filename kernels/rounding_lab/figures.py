"""The lab's figure: one lab result (:class:`LabResult`, what :func:`kernels.rounding_lab.lab`
returns), its panels stacked (error histogram, running error of Ō, Σδ)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LabResult:
    params: dict
    stats: dict
    errors: np.ndarray  # finite errors in ulps (flattened)
    counts: dict
    messages: list
    residual_ulps: float
    running: dict | None
    delta_diff: np.ndarray | None  # per row (token) δ_lp − δ_hp
    delta_sum: float


def _panel_errors(ax, result):
    st = result.stats
    if result.errors.size:
        lo, hi = np.percentile(result.errors, [0.5, 99.5])
        lo, hi = min(lo, -0.6), max(hi, 0.6)
        ax.hist(np.clip(result.errors, lo, hi), bins=np.linspace(lo, hi, 49), color="C0")
        ax.axvline(st["mean"], color="C3", label=f"mean {st['mean']:+.3f}")
        ax.axvspan(st["lo"], st["hi"], color="C3", alpha=0.25, label="95% CI")
        ax.legend()
    ax.set_xlabel("O_lp − O_exact  [ulp of O_lp's binade]")
    ax.set_ylabel("outputs")
    ax.set_title(st["verdict"].split(" (")[0])


def _panel_running(ax, result):
    r = result.running
    if r is not None:
        e = r["error"] / r["unit"]
        ax.plot(np.arange(e.size), e, lw=0.8)
        ones = r["p_is_one"]
        ax.plot(ones, e[ones], "rv", ms=6, label="P̄ = 1")
        if r.get("final_output_error") is not None:
            ax.plot(
                [e.size - 1],
                [r["final_output_error"] / r["unit"]],
                "k*",
                ms=9,
                label="(O_lp − O_hp)·ℓ: after the last rounding",
            )
        ax.legend()
        ax.set_title(f"running error of Ō, row 0, column {r['column']}")
    else:
        ax.text(
            0.5,
            0.5,
            "running sum shown for\nemulated paths only",
            ha="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel("key position t")
    ax.set_ylabel("Ō_lp(t) − Ō_hp(t)  [ulp of final Ō]")


def _panel_delta(ax, result):
    if result.delta_diff is not None and result.delta_diff.size:
        ax.plot(np.nancumsum(result.delta_diff), color="C2")
    ax.set_xlabel("row (token) T")
    ax.set_ylabel("cumulative Σ (δ_lp − δ_hp)")
    ax.set_title(f"Σ_T (δ_lp − δ_hp) = {result.delta_sum:+.3g}")


PANELS = {"errors": _panel_errors, "running": _panel_running, "delta": _panel_delta}


def plot_lab(result: LabResult, fig=None, panels=tuple(PANELS)):
    """The lab's panels, stacked so each stays legible at page width: the error histogram, the
    running error of Ō (the paper's Fig. 6c) and the cumulative Σ(δ_lp − δ_hp)."""
    import matplotlib.pyplot as plt

    if fig is None:
        fig = plt.figure(figsize=(6.8, 3.3 * len(panels)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(panels), 1))
    for ax, name in zip(axes, panels):
        PANELS[name](ax, result)
    return fig


FA2_FAMILY = ("ideal", "fa2/off", "fa2/tile", "fa2/cross")
PAPER_FAMILY = (
    "paper/off",
    "paper/tile",
    "paper/cross",
    "paper-untiled/off",
    "paper-untiled/cross",
)
