"""The lab's figures: one lab result, the sweep heat maps, devices compared."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..numerics.stats import is_biased
from .sweep import SWEEP_V, _cells, sweep_table

if TYPE_CHECKING:
    from .interactive import LabResult

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
            ax.plot([e.size - 1], [r["final_output_error"] / r["unit"]], "k*", ms=9,
                    label="(O_lp − O_hp)·ℓ: after the last rounding")
        ax.legend()
        ax.set_title(f"running error of Ō, row 0, column {r['column']}")
    else:
        ax.text(0.5, 0.5, "running sum shown for\nemulated paths only", ha="center",
                transform=ax.transAxes)
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
        fig = plt.figure(figsize=(7, 3.3 * len(panels)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(len(panels), 1))
    for ax, name in zip(axes, panels):
        PANELS[name](ax, result)
    return fig


# ----------------------------------------------------------------------------------------------
# reading and plotting the sweep
# ----------------------------------------------------------------------------------------------
FA2_FAMILY = ("ideal", "fa2/off", "fa2/tile", "fa2/cross")
PAPER_FAMILY = ("paper/off", "paper/tile", "paper/cross", "paper-untiled/off", "paper-untiled/cross")


def _v_label(vt, vr):
    return f"V tied {vt:+g}, rest {vr:+g}"


def plot_sweep(records, impls=FA2_FAMILY, limit=0.5, title=None):
    """One heat map (ties × gap) of the mean error per implementation (rows) and V setting
    (columns); numbers in ulps, a dot marks cells that are biased (see :func:`is_biased`)."""
    import matplotlib.pyplot as plt
    df = sweep_table([r for r in records if "mean" in r and " vs " not in r["impl"]])
    vs = sorted({(r.v_tied_mean, r.v_rest_mean) for r in df.itertuples()},
                key=lambda t: SWEEP_V.index(t) if t in SWEEP_V else 99)
    ties, gaps = sorted(df.ties.unique()), sorted(df.gap.unique())
    fig, axes = plt.subplots(len(impls), len(vs), figsize=(2.9 * len(vs), 1.9 * len(impls)),
                             squeeze=False, sharex=True, sharey=True)
    for i, impl in enumerate(impls):
        for j, (vt, vr) in enumerate(vs):
            ax = axes[i][j]
            sub = df[(df.impl == impl) & (df.v_tied_mean == vt) & (df.v_rest_mean == vr)]
            grid = np.full((len(ties), len(gaps)), np.nan)
            for r in sub.itertuples():
                grid[ties.index(r.ties), gaps.index(r.gap)] = r.mean
                txt = f"{r.mean:+.2f}" if abs(r.mean) < 10 else f"{r.mean:+.0f}"
                mark = "•" if is_biased({"mean": r.mean, "se": r.se}) else ""
                ax.text(gaps.index(r.gap), ties.index(r.ties), txt + mark, ha="center",
                        va="center", fontsize=6.5)
            ax.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
            ax.set_xticks(range(len(gaps)), [f"{g:g}" for g in gaps], fontsize=7)
            ax.set_yticks(range(len(ties)), [str(k) for k in ties], fontsize=7)
            ax.grid(False)
            if i == 0:
                ax.set_title(_v_label(vt, vr), fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{impl}\nties k", fontsize=8)
            if i == len(impls) - 1:
                ax.set_xlabel("gap below the max", fontsize=8)
    fig.suptitle(title or "mean O_lp − O_hp [ulp]; • = biased (95% CI excludes 0, |mean| ≥ 0.02)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_devices(cpu_records, gpu_records, gpu_impls=("sdpa-flash", "sdpa-cudnn",
                                                      "sdpa-efficient", "triton/off", "fa2/off"),
                 cpu_impl="fa2/off"):
    """Bias per cell measured on the GPU (y) against the CPU emulator (x)."""
    import matplotlib.pyplot as plt
    c = _cells(cpu_records, cpu_impl)
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    lim = 0.0
    for n, impl in enumerate(gpu_impls):
        g = _cells(gpu_records, impl)
        common = sorted(set(c) & set(g))
        if not common:
            continue
        x = np.array([c[i]["mean"] for i in common])
        y = np.array([g[i]["mean"] for i in common])
        ax.errorbar(x, y, yerr=1.96 * np.array([g[i]["se"] for i in common]), fmt="o",
                    ms=4 - n * 0.6, alpha=0.7, label=f"GPU {impl}")
        lim = max(lim, np.abs(np.concatenate([x, y])).max())
    ax.plot([-lim, lim], [-lim, lim], "k:", lw=0.8)
    ax.set_xlabel(f"CPU emulator {cpu_impl}: mean error [ulp]")
    ax.set_ylabel("GPU: mean error [ulp]")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Appendix C and boundary cases (small, run live in the chapter)
# ----------------------------------------------------------------------------------------------


def plot_compare(table: dict, title="", ylabel="mean O_lp − O_hp [ulp]"):
    """Grouped bars with 95% intervals for :func:`compare_settings` output."""
    import matplotlib.pyplot as plt
    names = list(table)
    impls = list(next(iter(table.values())))
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        means = [table[n][impl]["mean"] for n in names]
        ci = [1.96 * table[n][impl]["se"] for n in names]
        ax.bar(np.arange(len(names)) + j * width, means, width, yerr=ci, label=impl, capsize=2)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
