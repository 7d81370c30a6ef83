"""The two explorers of the bias chapters, for the website and for Jupyter.

An explorer is a few controls, a bar plot of panels (bias, rms, NaN share) with one bar per
implementation, and a one-line reading. :func:`fixes_spec` (chapter 6, from the stored grid of
:mod:`.slider_grid`) and :func:`sources_spec` (chapter 5, from the stored GPU sweep) give the
website everything it needs as one JSON-able dict (drawn by ``kernels/tools/explorer.js``); the
readings are made here, in Python, so the site and the widget say the same words.
:func:`widget` is the Jupyter version: the same controls and reading, the fixes computed live.
"""

from __future__ import annotations

import itertools
import math
import time

from ..numerics.stats import is_biased
from . import slider_grid as sg
from .cases import EXP_ROUNDS_TO_ONE

NAN_PANEL = {"title": "outputs NaN or inf", "axis": "share of outputs", "unit": "%"}
FIX_PANELS = [
    {"title": "bias of O", "axis": "mean error", "unit": "ulp", "signed": True},
    {"title": "rms error of O", "axis": "rms error", "unit": "ulp"},
    NAN_PANEL,
]
FIX_SERIES = [
    ("ideal", "ideal bf16(O_exact)", "#7f7f7f"),
    ("fa2", "FA2 kernel", "#1f77b4"),
    ("rule", "FA2 + β rule (cross-tile)", "#d62728"),
]
SOURCE_PANELS = [
    {
        "title": "bias (kernels: beyond the ideal)",
        "axis": "mean error",
        "unit": "ulp",
        "signed": True,
    },
    NAN_PANEL,
]
SOURCE_SERIES = [
    ("ideal", "storage: bf16(O_exact)", "#7f7f7f"),
    ("sdpa-flash", "accumulation: SDPA flash − ideal", "#1f77b4"),
    ("paper-untiled/off", "the paper's bf16 path − ideal", "#ff7f0e"),
]
SOURCE_GAPS_NOTE = "the other scores sit this far below the tied maximum"
SHORT = {"ideal": "ideal", "fa2": "FA2", "rule": "β rule", "sdpa-flash": "SDPA flash"}
SHORT["paper-untiled/off"] = "paper's path"
THRESHOLD = 0.02  # ulp beyond the ideal that counts as an accumulation bias (chapter 5's map)


def _sig(x: float, digits: int = 4):
    return None if x is None or not math.isfinite(x) else float(f"{x:.{digits}g}")


def _rms_words(ratio: float) -> str:
    if not math.isfinite(ratio):
        return "leaves no finite rms to compare"
    if 0.95 <= ratio <= 1.05:
        return "keeps the rms"
    if 1.9 <= ratio <= 2.1:
        return "doubles the rms"
    return f"multiplies the rms by {ratio:.2g}"


# ---------------------------------------------------------------------------- chapter 6: fixes
def rows_at_one(beta: float, rows: dict = sg.ROWS) -> float:
    """The share of the grid's rows whose tied P̄ = e^{−(β−1)·r_m} rounds back to 1 in BF16:
    (β − 1)·r_m ≤ −ln(1 − 2⁻⁹), with r_m uniform over row_max ± row_max_jitter."""
    lo = rows["row_max"] - rows["row_max_jitter"]
    hi = rows["row_max"] + rows["row_max_jitter"]
    limit = EXP_ROUNDS_TO_ONE / (beta - 1)
    return min(max((limit - lo) / (hi - lo), 0.0), 1.0)


def cancels(fa2: dict, at_one: float) -> bool:
    """Whether a rule that leaves FA2's bias in the ``at_one`` share of the rows can end near 0
    only by pushing the other rows the other way: that share of FA2's bias alone would show."""
    return at_one * abs(fa2["bias"]) > 2 * fa2["bias_se"]


def fixes_reading(c: dict, beta: float, eps: float, ties: int) -> str:
    """One line on what the β rule does in this cell ({'ideal', 'fa2', 'rule'} stats)."""
    fa2, rule = c["fa2"], c["rule"]
    if rule["bad"] > 0:
        return (
            f"ℓ underflows: {100 * rule['bad']:.0f} % of the rule's outputs are NaN or inf, "
            "in the rows where (β − 1)·r_m is too large"
        )
    if all(rule[f] == fa2[f] for f in sg.FIELDS):
        why = (
            "one maximum: nothing is tied"
            if ties == 1
            else "(β − 1)·r_m is so small that the tied P̄ rounds back to 1"
        )
        return f"the rule changes nothing here ({why}); FA2's bias is {fa2['bias']:+.3f} ulp"
    b0, b1 = fa2["bias"], rule["bias"]
    rms = _rms_words(rule["rms"] / fa2["rms"])
    if not abs(b0) > 2 * fa2["bias_se"]:
        line = f"no FA2 bias to remove here ({b0:+.3f} ulp); the rule {rms}"
    elif abs(b1 - b0) <= 2 * math.hypot(fa2["bias_se"], rule["bias_se"]):
        line = f"the rule barely moves the bias ({b0:+.3f} → {b1:+.3f} ulp) and {rms}"
    elif not abs(b1) > 2 * rule["bias_se"] and ties > 1 and rows_at_one(beta) >= 0.1:
        share = f"{100 * rows_at_one(beta):.0f} % of the rows"
        line = (
            f"two effects cancel ({b0:+.3f} → {b1:+.3f} ulp on average): in {share} the tied P̄ "
            "rounds back to 1 and FA2's bias stays, in the others the rule pushes the other way"
            if cancels(fa2, rows_at_one(beta))
            else f"the bias ends within noise ({b0:+.3f} → {b1:+.3f} ulp), but in {share} "
            "the tied P̄ rounds back to 1 and the rule does nothing there"
        ) + f"; it {rms}"
    elif not abs(b1) > 2 * rule["bias_se"]:
        joint = "and" if rms == "keeps the rms" else "but"
        line = f"the rule removes the bias ({b0:+.3f} → {b1:+.3f} ulp) {joint} {rms} here"
    elif (b0 > 0) != (b1 > 0):
        line = f"the rule overshoots: the bias changes sign ({b0:+.3f} → {b1:+.3f} ulp) and {rms}"
    elif abs(b1) < abs(b0):
        line = f"the rule shrinks the bias ({b0:+.3f} → {b1:+.3f} ulp) and {rms}"
    else:
        line = f"the rule makes the bias larger ({b0:+.3f} → {b1:+.3f} ulp) and {rms}"
    if eps < sg.EPS_CAUGHT and ties > 1:
        line += "; ε < 2⁻⁹ misses the near-ties whose P̄ is 1"
    return line


def fix_bars(c: dict) -> list:
    """[series][panel] = (value, half-width of the 95 % interval) for one cell."""
    return [
        [
            (c[key]["bias"], 1.96 * c[key]["bias_se"]),
            (c[key]["rms"], 1.96 * c[key]["rms_se"]),
            (100 * c[key]["bad"], 0.0),
        ]
        for key, _, _ in FIX_SERIES
    ]


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power(x: float) -> str:
    return "2" + str(round(math.log2(x))).translate(SUPERSCRIPT)


def _eps_label(e: float) -> str:
    if e == 0:
        return "0"
    text = _power(e)
    return text + (" (near-ties caught from here)" if e == sg.EPS_CAUGHT else "")


def _beta_label(b: float) -> str:
    if b < 1.2:
        return f"1 + {_power(b - 1)}"
    return f"{b:g}"


def fixes_controls(axes: dict) -> list[dict]:
    def default(name):
        return axes[name].index(sg.DEFAULT[name])

    return [
        dict(name="preset", label="V of the tied / other tokens", kind="select",
             values=list(axes["preset"]), default=default("preset")),
        dict(name="spread", label="V spread (std)", kind="range",
             values=[f"{s:g}" for s in axes["spread"]], default=default("spread")),
        dict(name="ties", label="tied maxima k", kind="range",
             values=[str(k) for k in axes["ties"]], default=default("ties")),
        dict(name="gap", label="score gap below the maximum", kind="range",
             values=[f"{g:g}" for g in axes["gap"]], default=default("gap")),
        dict(name="beta", label="β", kind="range",
             values=[_beta_label(b) for b in axes["beta"]], default=default("beta")),
        dict(name="eps", label="ε", kind="range",
             values=[_eps_label(e) for e in axes["eps"]], default=default("eps")),
    ]  # fmt: skip


def _explorer(name, title, controls, panels, series, readings, conclusion):
    for s in series:
        s["short"] = SHORT[s["key"]]
    unique = list(dict.fromkeys(readings))
    index = {r: i for i, r in enumerate(unique)}
    return dict(
        name=name,
        title=title,
        controls=controls,
        panels=panels,
        series=series,
        readings=unique,
        reading=[index[r] for r in readings],
        conclusion=conclusion,
    )


def fixes_spec(stored: dict) -> dict:
    """The chapter-6 explorer for the website, from the stored grid (``fix_explorer``)."""
    ax = stored["axes"]
    base_axes = [ax[n] for n in ("preset", "spread", "ties", "gap")]
    flat = {key: [] for key, _, _ in FIX_SERIES}
    readings = []
    for preset, spread, ties, gap in itertools.product(*base_axes):
        for beta, eps in itertools.product(ax["beta"], ax["eps"]):
            c = sg.lookup(stored, preset, spread, ties, gap, beta, eps)
            bars = fix_bars(c)
            if beta == ax["beta"][0] and eps == ax["eps"][0]:
                for s in range(2):  # ideal and FA2 depend on the base only
                    flat[FIX_SERIES[s][0]] += [_sig(v) for pair in bars[s] for v in pair]
            flat["rule"] += [_sig(v) for pair in bars[2] for v in pair]
            readings.append(fixes_reading(c, beta, eps, ties))
    series = [
        dict(key=key, name=name, color=color, depends=4 if key != "rule" else 6, data=flat[key])
        for key, name, color in FIX_SERIES
    ]
    return _explorer(
        "fixes",
        "The β rule against FA2 and the ideal",
        fixes_controls(ax),
        FIX_PANELS,
        series,
        readings,
        f"Bars: 95 % intervals over {stored['rows']['batch']} independent sequences; NaN/inf "
        "outputs are left out of bias and rms and counted in the right panel.",
    )


def _sweep_index(records):
    return {
        (r["impl"], r["v_tied_mean"], r["v_rest_mean"], r["ties"], r["gap"]): r
        for r in records
        if "mean" in r
    }


def _v_name(vt, vr):
    return f"tied {vt:+g}, other {vr:+g}".replace("+0", "0").replace("-", "−")


def sources_cell(by: dict, vt, vr, ties, gap) -> list:
    """[series][panel] = (value, half-width) for one setting of the stored sweep."""
    ideal = by[("ideal", vt, vr, ties, gap)]
    bars = []
    for key, _, _ in SOURCE_SERIES:
        r = by[(key, vt, vr, ties, gap)]
        value = r["mean"] if key == "ideal" else r["mean"] - ideal["mean"]
        se = r["se"] if key == "ideal" else math.hypot(r["se"], ideal["se"])
        bad = 100 * r.get("nonfinite", 0) / r["n_elements"] if r.get("n_elements") else 0.0
        bars.append([(value, 1.96 * se), (bad, 0.0)])
    return bars


def sources_reading(bars: list, ideal_record: dict) -> str:
    (ideal, _), _ = bars[0]
    (flash, _), _ = bars[1]
    (paper, _), _ = bars[2]
    if abs(flash) >= THRESHOLD:
        head = f"accumulation matters: SDPA flash adds {flash:+.3f} ulp to the ideal's {ideal:+.3f}"
    elif is_biased(ideal_record):
        head = (
            f"storage dominates SDPA flash's error: the ideal is off by {ideal:+.3f} ulp, SDPA "
            f"flash adds {flash:+.3f}"
        )
    else:
        head = f"no bias worth the name: ideal {ideal:+.3f} ulp, SDPA flash adds {flash:+.3f}"
    return f"{head}; the paper's path adds {paper:+.3f}"


def sources_spec(records: list) -> dict:
    """The chapter-5 explorer for the website, from the stored GPU sweep's records."""
    by = _sweep_index(records)
    vs = sorted({(k[1], k[2]) for k in by}, key=lambda v: (v[0], -v[1]))
    ties = sorted({k[3] for k in by})
    gaps = sorted({k[4] for k in by})
    flat = {key: [] for key, _, _ in SOURCE_SERIES}
    readings = []
    for (vt, vr), k, g in itertools.product(vs, ties, gaps):
        bars = sources_cell(by, vt, vr, k, g)
        for (key, _, _), panels in zip(SOURCE_SERIES, bars):
            flat[key] += [_sig(v) for pair in panels for v in pair]
        readings.append(sources_reading(bars, by[("ideal", vt, vr, k, g)]))
    controls = [
        dict(name="v", label="V of the tied / other tokens", kind="select",
             values=[_v_name(*v) for v in vs], default=0),
        dict(name="ties", label="tied maxima k", kind="range",
             values=[str(k) for k in ties], default=ties.index(2) if 2 in ties else 0),
        dict(name="gap", label="score gap below the maximum", kind="range",
             values=[f"{g:g}" for g in gaps], default=len(gaps) - 1),
    ]  # fmt: skip
    series = [
        dict(key=key, name=name, color=color, depends=3, data=flat[key])
        for key, name, color in SOURCE_SERIES
    ]
    return _explorer(
        "sources",
        "Who makes the bias: storage, accumulation, the paper's path",
        controls,
        SOURCE_PANELS,
        series,
        readings,
        "Stored GPU sweep; bars: 95 % intervals over rows.",
    )


# ---------------------------------------------------------------------------- Jupyter
def plot_bars(panels, series, bars):
    """The site's plot in matplotlib: one panel per entry of ``panels``, one bar per series."""
    import matplotlib.pyplot as plt
    import numpy as np

    # a fixed layout: constrained layout costs more than the rest of one widget update
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0))
    fig.subplots_adjust(left=0.08, right=0.99, bottom=0.12, top=0.9, wspace=0.45)
    axes = np.atleast_1d(axes)
    x = np.arange(len(series))
    for p, (ax, panel) in enumerate(zip(axes, panels)):
        values = [bars[s][p][0] for s in range(len(series))]
        errs = [bars[s][p][1] for s in range(len(series))]
        shown = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
        ax.bar(x, shown, yerr=errs, capsize=4, color=[s[2] for s in series])
        for xi, v, e in zip(x, values, errs):
            text = "n/a" if v is None or not math.isfinite(v) else f"{v:.3g}"
            top = 0.0 if text == "n/a" else max(v + e, 0.0)
            ax.annotate(text, (xi, top), ha="center", va="bottom", fontsize=9)
        ax.axhline(0, color="gray", lw=0.8)
        if panel["unit"] == "%":
            ax.set_ylim(0, max(10.0, 1.2 * max(shown)))
        ax.set_xticks(x, [SHORT[s[0]] for s in series])
        # a fixed title height: placing it automatically measures every artist (a third of a draw)
        ax.set_title(panel["title"], y=1.02)
        ax.set_ylabel(f"{panel['axis']} [{panel['unit']}]")
    return fig


def widget(kind: str = "fixes", stored: dict | None = None):
    """The explorer as ipywidgets: chapter 6's ('fixes', computed live by
    :func:`slider_grid.cell`; ``stored`` gives its axes) or chapter 5's ('sources', ``stored`` =
    the GPU sweep's records). Same controls and reading as the site; returns the widget box."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    if kind == "fixes":
        axes = stored["axes"] if stored else {n: list(v) for n, v in _fix_axes().items()}
        controls, panels, series = fixes_controls(axes), FIX_PANELS, FIX_SERIES
    else:
        spec = sources_spec(stored)
        controls, panels, series = spec["controls"], SOURCE_PANELS, SOURCE_SERIES
        by = _sweep_index(stored)
        vs = sorted({(k[1], k[2]) for k in by}, key=lambda v: (v[0], -v[1]))
        axes = dict(v=vs, ties=sorted({k[3] for k in by}), gap=sorted({k[4] for k in by}))
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the live cell is computed
    style = {"description_width": "190px"}
    boxes = {}
    for c in controls:
        options = list(zip(c["values"], range(len(c["values"]))))
        make = w.Dropdown if c["kind"] == "select" else w.SelectionSlider
        boxes[c["name"]] = make(
            options=options, value=c["default"], description=c["label"], style=style,
            layout=w.Layout(width="520px"), **({} if c["kind"] == "select" else
                                               {"continuous_update": False}),
        )  # fmt: skip

    def update(**picked):
        start = time.perf_counter()
        values = {n: axes[n][i] for n, i in picked.items()}
        if kind == "fixes":
            c = sg.cell(**values, device=device)
            bars, reading = (
                fix_bars(c),
                fixes_reading(c, values["beta"], values["eps"], values["ties"]),
            )
        else:
            vt, vr = values["v"]
            bars = sources_cell(by, vt, vr, values["ties"], values["gap"])
            reading = sources_reading(bars, by[("ideal", vt, vr, values["ties"], values["gap"])])
        fig = plot_bars(panels, series, bars)
        plt.show()
        print(reading)
        print(f"(this update took {time.perf_counter() - start:.2f} s)")
        plt.close(fig)

    out = w.interactive_output(update, boxes)
    return w.VBox([*boxes.values(), out])


def _fix_axes() -> dict:
    return dict(
        preset=list(sg.V_PRESETS), spread=sg.SPREADS, ties=sg.TIES, gap=sg.GAPS,
        beta=sg.BETAS, eps=sg.EPSILONS,
    )  # fmt: skip


def update_seconds(repeats: int = 3, device: str = "cpu") -> float:
    """Median seconds of one widget update of the fixes explorer (compute one cell on
    ``device``, draw)."""
    import matplotlib.pyplot as plt

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        c = sg.cell(**sg.DEFAULT, device=device)
        fixes_reading(c, sg.DEFAULT["beta"], sg.DEFAULT["eps"], sg.DEFAULT["ties"])
        fig = plot_bars(FIX_PANELS, FIX_SERIES, fix_bars(c))
        fig.canvas.draw()
        plt.close(fig)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def time_update(repeats: int = 5) -> dict:
    """One update of the live widget (compute one setting and draw it), timed on the CPU (all
    its threads) and, where there is one, on the GPU; with how far the GPU's cell is from the
    CPU's (the stored grid is the CPU's)."""
    import torch

    out = {"cpu_threads": torch.get_num_threads(), "repeats": repeats}
    out["cpu_s"] = update_seconds(repeats, device="cpu")
    if torch.cuda.is_available():
        update_seconds(1, device="cuda")  # warm-up: first CUDA calls load kernels
        out["gpu_s"] = update_seconds(repeats, device="cuda")
        on_cpu, on_gpu = (sg.cell(**sg.DEFAULT, device=d) for d in ("cpu", "cuda"))
        out["gpu_vs_cpu_largest_difference"] = sg.largest_difference(on_cpu, on_gpu)
    return out


def main(argv=None):
    """``python -m kernels.rounding_lab.site_explorers --out DIR``: :func:`time_update`, stored as
    ``DIR/explorer_update.json`` with provenance."""
    import argparse
    from pathlib import Path

    from .. import results

    parser = argparse.ArgumentParser(description="Time one update of the fixes explorer.")
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args(argv)
    data = time_update()
    print(data)
    command = "python -m kernels.rounding_lab.site_explorers"
    print(results.save("explorer_update", data, command, args.out))


if __name__ == "__main__":
    main()
