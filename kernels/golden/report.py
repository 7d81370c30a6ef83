"""Tables the chapter prints, and the stored GPU measurements
(``results/golden_*.json``) shown with the same figures as the live CPU cells. Every
``show_stored_*`` returns False (and says so) when the file is not there yet, so the
chapter runs before and after the GPU script."""

from __future__ import annotations

import functools
import math

import matplotlib.pyplot as plt
import numpy as np

from .. import results
from . import figures, training
from .implementations import IMPLEMENTATIONS, RUN, SHORT
from .microbench import block_m_identical, one, pick, ratio_table

STAGE_FILES = {
    "precision": "golden_precision",
    "seqlen": "golden_seqlen",
    "tiles": "golden_tiles",
    "training": "golden_training",
}
GPU_COMMAND = "python -m kernels.golden.gpu"


def stored(stage: str, directory=None) -> dict | None:
    """The stored record of one stage of the GPU script, or None if it has not been
    made."""
    if stage not in STAGE_FILES:
        raise ValueError(f"stage must be one of {tuple(STAGE_FILES)}, got {stage!r}")
    try:
        return results.load(STAGE_FILES[stage], directory)
    except FileNotFoundError:
        return None


def _missing(stage: str) -> bool:
    print(f"No stored GPU measurement of this section yet (results/{STAGE_FILES[stage]}.json);")
    print(f"`{GPU_COMMAND}` on a GPU makes it.")
    return False


# --------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------
def print_precision(records, inputs="gaussian", fmt="bf16", impls=None):
    """One line per implementation: deviation from the golden value (max, relative norm)
    and from the baseline in the same format (max, Golden et al.'s Fig. 3)."""
    rows = pick(records, inputs=inputs, format=fmt)
    names = impls or [r["impl"] for r in rows]
    print(f"{inputs} inputs, {fmt}, N = {rows[0]['n']:,}")
    print(f"{'':22s}{'max|O-O_golden|':>16s}{'rel. norm':>11s}{'max|O-O_baseline|':>19s}")
    for name in names:
        r = one(rows, impl=name)
        print(
            f"  {SHORT.get(name, name):20s}{r['vs_golden']['max_abs']:16.1e}"
            f"{r['vs_golden']['rel_norm']:11.1e}{r['vs_baseline']['max_abs']:19.1e}"
        )


def print_ratios(records, inputs="gaussian", fmt="bf16"):
    """Flash's deviation from the golden value over the baseline's, for every flash,
    baseline and measure: the quantity Golden et al. report as about 10 at BF16."""
    rows = ratio_table(records, fmt, inputs)
    print(f"flash error / baseline error ({inputs}, {fmt}):")
    print(f"  {'flash':14s}{'baseline':12s}{'max |dO|':>10s}{'rel. norm':>11s}")
    for f in ("fa2", "paper", "fa1"):
        for b in ("baseline", "baseline_fp32"):
            got = {r["measure"]: r["ratio"] for r in rows if r["flash"] == f and r["baseline"] == b}
            print(f"  {SHORT[f]:14s}{SHORT[b]:12s}{got['max_abs']:10.2f}{got['rel_norm']:11.2f}")
    return rows


def print_ratio_grid(
    records,
    inputs,
    formats=("bf16", "fp16", "fp32"),
    measure="max_abs",
    pairs=(("fa1", "baseline"), ("fa2", "baseline")),
):
    """Flash's deviation from the golden value over the baseline's, one row per format
    and pair, one column per kind of inputs (sink settings numbered, named below the
    table)."""
    heads, legend, k = [], [], 0
    for inp in inputs:
        if inp.startswith("sink: "):
            k += 1
            heads.append(f"sink {k}")
            legend.append(f"sink {k} = {inp[6:]}")
        else:
            heads.append(inp)
    print(f"{'ratio of ' + measure:31s}" + "".join(f"{h:>10s}" for h in heads))
    for fmt in formats:
        for flash, base in pairs:
            cells = []
            for inp in inputs:
                f = one(records, inputs=inp, format=fmt, impl=flash)["vs_golden"][measure]
                b = one(records, inputs=inp, format=fmt, impl=base)["vs_golden"][measure]
                cells.append(f"{f / b:10.2f}" if b else f"{'inf':>10s}")
            print(f"  {fmt} {SHORT[flash] + ' / ' + SHORT[base]:24s}" + "".join(cells))
    for line in legend:
        print("  " + line)


def print_sink(records, settings, impls=("baseline", "fa2", "paper", "fa1")):
    """Sink rows, BF16: Golden's two measures relative to the ideal's, the mean error
    beyond the ideal's (ulp) and the share of outputs equal to the ideal."""
    print(
        f"{'sink rows, bf16':20s}{'max/ideal':>10s}{'rel/ideal':>10s}"
        f"{'bias>ideal':>11s}{'= ideal':>9s}"
    )
    for setting in settings:
        best = one(records, inputs=setting, impl="ideal", format="bf16")["vs_golden"]
        print(f"  {setting.replace('sink: ', '')}")
        for name in impls:
            r = one(records, inputs=setting, impl=name, format="bf16")
            print(
                f"    {SHORT[name]:16s}"
                f"{r['vs_golden']['max_abs'] / best['max_abs']:10.2f}"
                f"{r['vs_golden']['rel_norm'] / best['rel_norm']:10.2f}"
                f"{r['bias_beyond_ideal_ulps']:+11.3f}{r['same_as_ideal']:9.2%}"
            )


def print_seqlen(records, impls=("fa2", "fa1")):
    """Per N: |O_flash − O_baseline| (max, mean ± std) and the relative error vs
    golden."""
    print(
        f"{'N':>6s}  {'impl':11s}{'max|dO|':>9s}{'mean|dO| ± std':>20s}"
        f"{'rel. vs golden':>16s}{'÷ ideal':>9s}{'rms O':>7s}"
    )
    for n in sorted({r["n"] for r in records}):
        best = pick(records, n=n, impl="ideal")
        for name in impls:
            found = pick(records, n=n, impl=name)
            if not found:
                continue
            r = found[0]
            b = r["vs_baseline"]
            rel = r["vs_golden"]["rel_norm"]
            ratio = rel / best[0]["vs_golden"]["rel_norm"] if best else math.nan
            print(
                f"{n:6d}  {SHORT[name]:11s}{b['max_abs']:9.1e}{b['mean_abs']:11.1e} ± "
                f"{b['std_abs']:.1e}{rel:16.2e}{ratio:9.2f}{r['o_rms']:7.3f}"
            )


def print_seqlen_by_n(records, impls=("fa2", "triton", "sdpa_flash", "fa1")):
    """One row per N: each implementation's relative error against the golden value as a
    multiple of the ideal's, and the largest |O_flash − O_baseline| of FA2 and FA1."""
    present = [i for i in impls if pick(records, impl=i)]
    head = "".join(f"{SHORT[i]:>12s}" for i in present)
    print(
        f"{'':6s}{'relative error ÷ the ideal’s':>{12 * len(present)}s}"
        f"{'max |O − O_baseline|':>22s}"
    )
    print(f"{'N':>6s}{head}{'FA2':>11s}{'FA1 all-low':>12s}")
    for n in sorted({r["n"] for r in records}):
        best = pick(records, n=n, impl="ideal")
        ideal = best[0]["vs_golden"]["rel_norm"] if best else math.nan
        cells = "".join(
            f"{pick(records, n=n, impl=i)[0]['vs_golden']['rel_norm'] / ideal:12.2f}"
            if pick(records, n=n, impl=i)
            else f"{'':12s}"
            for i in present
        )
        maxes = [pick(records, n=n, impl=i) for i in ("fa2", "fa1")]
        m = [f"{x[0]['vs_baseline']['max_abs']:.1e}" if x else "" for x in maxes]
        print(f"{n:6d}{cells}{m[0]:>11s}{m[1]:>12s}")


def print_rescalings(records, by_count):
    """Measured growths of the running maximum per row (mean) against their expectation for
    i.i.d. scores (the closed form is exercise 8.1's answer, so it is not named here), and the
    spread of per-row errors across rows with different counts."""
    print(f"{'N':>6s}{'tiles':>7s}{'growths/row':>13s}{'i.i.d.':>9s}")
    for r in sorted(pick(records, impl="fa2"), key=lambda r: r["n"]):
        print(
            f"{r['n']:6d}{r['tiles']:7d}{r['rescalings_mean']:13.2f}{r['rescalings_expected']:9.2f}"
        )
    for name, table in by_count.items():
        keep = {int(c): v for c, v in table.items() if v[0] >= 20}
        errs = [v[1] for v in keep.values()]
        print(
            f"{SHORT[name]:12s} rows with {min(keep)}–{max(keep)} growths: rel. error "
            f"{min(errs):.2e} to {max(errs):.2e} (max/min {max(errs) / min(errs):.2f})"
        )


def print_tiles(records, fmt="bf16"):
    """B_r changes nothing; B_c decides: swapped pairs and equal areas side by side."""
    same = block_m_identical(records)
    print(
        "FA1 outputs bit-identical for every B_r at each B_c:",
        all(v for (f, _), v in same.items()),
        f"({len(same)} (format, B_c) groups)",
    )
    fa1 = {
        (r["block_m"], r["block_n"]): r["vs_golden"]["max_abs"]
        for r in pick(records, impl="fa1", format=fmt)
    }
    print(f"FA1, {fmt}, max |O − O_golden| by tile B_r × B_c:")
    for area in sorted({br * bc for br, bc in fa1}):
        cells = [f"{br}×{bc}: {fa1[(br, bc)]:.1e}" for br, bc in sorted(fa1) if br * bc == area]
        print(f"  area {area:6d}: " + ", ".join(cells))
    fa2 = {r["block_n"]: r["vs_golden"]["max_abs"] for r in pick(records, impl="fa2", format=fmt)}
    print("FA2 by B_c: " + ", ".join(f"{bc}: {e:.1e}" for bc, e in sorted(fa2.items())))


def print_weights(record, labels=None, steps=None, matrices="median"):
    """W₁ and max difference (median over matrices) of each pair at a few snapshot
    steps."""
    labels = labels or [c["label"] for c in record["pairs"]]
    all_steps = record["snapshot_steps"]
    steps = steps or [
        s for s in (all_steps[len(all_steps) // 4], all_steps[len(all_steps) // 2], all_steps[-1])
    ]
    which = {"median": "median over matrices", "max": "largest over matrices"}.get(
        matrices, matrices
    )
    print(f"{'W1 (max diff), ' + which:38s}" + "".join(f"{'step ' + str(s):>16s}" for s in steps))
    for label in labels:
        s_w, w = training.curve(record, label, "wasserstein", matrices)
        _, m = training.curve(record, label, "max_diff", matrices)
        cells = []
        for s in steps:
            i = int(np.flatnonzero(s_w == s)[0])
            cells.append(f"{w[i]:.1e} ({m[i]:.0e})")
        print(f"  {label:36s}" + "".join(f"{c:>16s}" for c in cells))


# --------------------------------------------------------------------------------------
# stored GPU measurements, drawn with the live cells' figures
# --------------------------------------------------------------------------------------
def _shows_stored(stage: str):
    """``show_stored_<stage>(directory=None) -> bool`` made from a function that shows the
    stored record's data: False, and the command that makes the record, where there is none;
    after the figures and tables, where the record came from."""

    def make(show):
        @functools.wraps(show)
        def show_stored(directory=None) -> bool:
            rec = stored(stage, directory)
            if rec is None:
                return _missing(stage)
            show(rec["data"])
            print("stored:", results.describe(rec))
            return True

        return show_stored

    return make


@_shows_stored("precision")
def show_stored_precision(data):
    fig, ax = plt.subplots(figsize=(6.2, 3.4))
    impls = IMPLEMENTATIONS + RUN
    figures.plot_precision(ax, data["records"], impls=impls)
    ax.set_title(f"stored GPU measurement, Gaussian inputs, N = {data['n']:,}")
    plt.show()
    print_precision(
        data["records"], impls=[i for i in impls if pick(data["records"], impl=i, format="bf16")]
    )
    print_ratios(data["records"])


@_shows_stored("seqlen")
def show_stored_seqlen(data):
    fig, axes = plt.subplots(1, 2, figsize=(6.2, 3.2), layout="constrained")
    figures.plot_seqlen(
        axes,
        data["records"],
        impls=[
            i
            for i in ("fa2", "paper", "fa1", "triton", "sdpa_flash")
            if pick(data["records"], impl=i)
        ],
    )
    fig.suptitle("stored GPU measurement, 64-key tiles")
    plt.show()
    print_seqlen_by_n(data["records"])
    print()
    print_rescalings(data["records"], data["by_count"])
    if data.get("stopped"):
        print("the sweep stopped early:", data["stopped"])


@_shows_stored("tiles")
def show_stored_tiles(data):
    picked = sorted({(bm, bn) for bm, bn in data["autotuned"].values()})
    marks = {"Triton kernel, CPU / explicit path (64×64)": 64 * 64}
    if picked:
        marks["Triton autotuner's pick on this GPU"] = [bm * bn for bm, bn in picked]
    fig, ax = plt.subplots(figsize=(6.2, 4.4), layout="constrained")
    figures.plot_tiles(ax, data["records"], marks=marks)
    ax.set_title(f"stored GPU measurement, N = {data['n']:,}")
    plt.show()
    print_tiles(data["records"])
    if data.get("stopped"):
        print("the sweep stopped early:", data["stopped"])
    print(
        "the Triton kernel's autotuner picked (B_r × B_c) at N:",
        ", ".join(f"{n}: {bm}×{bn}" for n, (bm, bn) in data["autotuned"].items()) or "none",
    )


@_shows_stored("training")
def show_stored_training(data):
    fig, axes = plt.subplots(2, 1, figsize=(6.2, 6.4), layout="constrained")
    figures.plot_weight_distance(axes[0], data["golden"], mark_explosion=False)
    axes[0].set_title(
        f"stored GPU measurement: one change per pair, {data['golden']['steps_done']:,} steps"
    )
    figures.plot_weight_distance(axes[1], data["failure"], matrices="0.W_Q")
    axes[1].set_title("the failing path and its control, layer 0's W_Q")
    plt.show()
    print_weights(data["golden"])
    lo, hi = seed_over_changes(data["golden"])
    print(f"at the last step two initialisation seeds are {lo:.1f}–{hi:.1f} times as far apart")
    print("  as each pair that differs in one small change")
    print_weights(data["failure"], matrices="0.W_Q")
    summarise_failure(data["failure"])


def seed_over_changes(golden) -> tuple[float, float]:
    """At the last step, the seed pair's W₁ (median over matrices) over each one-change pair's:
    (least, most)."""
    end = {c["label"]: training.curve(golden, c["label"])[1][-1] for c in golden["pairs"]}
    seed_end = end.pop("initialisation seed")
    return seed_end / max(end.values()), seed_end / min(end.values())


def summarise_failure(record, matrices=("0.W_Q", "median")):
    """When the failing run's distance from its control leaves the seed pair's for good,
    against the step its loss exploded."""
    boom = record["explosion"].get("failing")
    outcome = f"exploded at step {boom:,}" if boom is not None else "did not explode"
    print(
        f"the failing run's loss {outcome} ({record['steps_done']:,} steps trained; "
        f"{record['stopped']})"
    )
    for m in matrices:
        steps, fail = training.curve(record, "failing path vs its control", "wasserstein", m)
        _, seed = training.curve(record, "initialisation seed (control)", "wasserstein", m)
        leaves = training.first_above_for_good(steps[1:], fail[1:], seed[1:])
        print(
            f"  {m:7s}: W1(failing, control) stays above W1(seed, control) from step "
            f"{leaves if leaves is not None else 'never'}"
        )


VERDICT_TOPS = ("initialisation seed", "precision: BF16 vs fp32", "one weight, one BF16 ulp")


def verdict_numbers(ratios, sink, setting, seq, live, late, leads, ns, attn) -> dict:
    """Chapter 8's verdict table, by glue name: the stored ratios over the baseline
    (``ratios``), FA1 all-low on sink rows (``sink`` in ``setting``), relative error against N
    (``seq`` at ``ns``), the tiny GPT-2's weight distances over ``attn``'s in the ``late``
    snapshots, and the stored failing runs' lead of layer 0 (``leads``). Raises if the data
    no longer say what the table says (seed noise above fused SDPA's distance, FA1 all-low's
    error growing with N, layer 0 above seed noise before each explosion)."""
    r = {(x["flash"], x["baseline"], x["measure"]): x["ratio"] for x in ratios}
    fa1_sink, best_sink = (
        one(sink, inputs=setting, format="bf16", impl=i)["vs_golden"] for i in ("fa1", "ideal")
    )
    by_n = {
        name: [x["vs_golden"]["rel_norm"] for x in sorted(pick(seq, impl=name), key=_n)]
        for name in ("fa2", "fa1")
    }
    late_ratio = {
        key: list(training.ratio_at(live, top, attn, steps=late).values())
        for key, top in zip(("seed", "prec", "ulp"), VERDICT_TOPS)
    }
    lead = leads["lead"].dropna()
    later = leads[[f"W1 layer {i}" for i in (1, 2, 3)]].values
    numbers = {
        "c8_v_fa2": r["fa2", "baseline", "max_abs"],
        "c8_v_fa1": r["fa1", "baseline", "max_abs"],
        "c8_v_fa1_fp32": r["fa1", "baseline_fp32", "max_abs"],
        "c8_v_sink": fa1_sink["max_abs"] / best_sink["max_abs"],
        "c8_v_sink_bias": one(sink, inputs=setting, format="bf16", impl="fa1")[
            "bias_beyond_ideal_ulps"
        ],
        "c8_v_n_lo": ns[0],
        "c8_v_n_hi": ns[-1],
        **{f"c8_v_{name}_n_{end}": by_n[name][i] for name in by_n for end, i in _ENDS},
        **{f"c8_v_{key}_{end}": f(v) for key, v in late_ratio.items() for end, f in _MINMAX},
        "c8_v_lead_lo": lead.min(),
        "c8_v_lead_hi": lead.max(),
        "c8_v_others": np.nanmax(leads["explosion"].values[:, None] - later),
    }
    if not numbers["c8_v_seed_lo"] > 1:
        raise ValueError("the verdict says two seeds end farther apart than fused SDPA's pair")
    if not by_n["fa1"][-1] > by_n["fa1"][0]:
        raise ValueError("the verdict says FA1 all-low's relative error grows with N")
    if not lead.min() > 0:
        raise ValueError("the verdict says layer 0 leaves seed noise before each explosion")
    return numbers


_ENDS = (("lo", 0), ("hi", -1))
_MINMAX = (("lo", min), ("hi", max))


def _n(record: dict) -> int:
    return record["n"]


def stored_seqlen_numbers(seq: dict) -> dict:
    """Chapter 8's numbers on the stored GPU sequence-length run (``seq``, the ``data`` of
    ``stored("seqlen")``), by glue name. Raises if the record no longer says what the prose
    says (FA1 all-low's error over the ideal's grows with N and ends above the FA2-like
    kernels'; its rows differ more by rescaling count than FA2's)."""
    records = seq["records"]
    ns = sorted({x["n"] for x in records})

    def over_ideal(impl, n):
        rel = [one(records, n=n, impl=i)["vs_golden"]["rel_norm"] for i in (impl, "ideal")]
        return rel[0] / rel[1]

    fa2_like = [over_ideal(i, n) for i in ("fa2", "triton", "sdpa_flash") for n in ns]
    fa2 = pick(records, impl="fa2")
    counts, spread = {}, {}
    for impl, table in seq["by_count"].items():
        errs = {int(c): v[1] for c, v in table.items() if v[0] >= 20}  # counts of 20 rows+
        spread[impl] = max(errs.values()) / min(errs.values()) - 1
        counts[f"c8_gpu_count_{impl}"] = max(errs)
    numbers = {
        "c8_gpu_seq_n_hi": ns[-1],
        "c8_gpu_seq_fa2_lo": min(fa2_like),
        "c8_gpu_seq_fa2_hi": max(fa2_like),
        "c8_gpu_seq_fa1_lo": over_ideal("fa1", ns[0]),
        "c8_gpu_seq_fa1_hi": over_ideal("fa1", ns[-1]),
        "c8_gpu_seq_tiles": max(x["tiles"] for x in fa2),
        "c8_gpu_growth_off": max(abs(x["rescalings_mean"] - x["rescalings_expected"]) for x in fa2),
        **counts,
        "c8_gpu_spread_fa2": spread["fa2"],
        "c8_gpu_spread_low": max(spread["paper"], spread["fa1"]),
    }
    n = numbers
    if not n["c8_gpu_seq_fa1_lo"] < n["c8_gpu_seq_fa1_hi"] > n["c8_gpu_seq_fa2_hi"]:
        raise ValueError("the prose says FA1 all-low's error over the ideal's grows with N")
    if not n["c8_gpu_spread_low"] > n["c8_gpu_spread_fa2"]:
        raise ValueError("the prose says the all-low paths' rows differ more by rescalings")
    return numbers
