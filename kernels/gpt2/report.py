"""Read the stored GPT-2 runs (``results/gpt2_*.json``) and draw the chapter's figures.

Every figure function takes the ``runs`` dict of a search record (name -> training log, see
:mod:`kernels.gpt2.search`) and a matplotlib axis, so a notebook cell stays one line long.
"""
from __future__ import annotations

import numpy as np

from ..results import load
from .diagnostics import find_explosion
from .plans import VARIANTS

VARIANT_NAMES = {"U": "failing path (δ from rounded O)", "F": "control (δ from fp32 O)",
                 "S": "fix: β = 2 rule", "P": "δ from rowsum(dP∘P)", "A": "torch SDPA",
                 "R": "failing path, Ō rounded stochastically", "T": "failing path, tiles of 64",
                 "L": "failing path in layer 0 only",
                 "B": "control + constant δ bias", "N": "control + δ noise",
                 "M": "failing path, δ error → its mean", "G": "failing path, δ error ± at random",
                 "X": "failing path, exact O passed on", "C": "fix: β = 2, offset capped",
                 "K": "fix: β = 2, ℓ clamped", "D": "fix: β = 2, capped and clamped"}
VARIANT_COLOURS = {"U": "tab:red", "F": "tab:blue", "S": "tab:green", "P": "tab:purple", "A": "tab:gray",
                   "R": "tab:orange", "T": "tab:brown", "L": "tab:pink", "B": "tab:olive",
                   "N": "tab:cyan", "M": "darkred", "G": "salmon", "X": "indigo",
                   "C": "tab:olive", "K": "0.35", "D": "tab:cyan"}
FONT = 9        # smallest font size in the chapter's figures (points): legible at 720 px

# Rough speed of other GPUs relative to an H200 for this small, memory-bound model (an estimate
# from memory bandwidth, not a measurement).
GPU_FACTORS = {"H200": 1.0, "H100": 0.7, "A100": 0.4, "L4": 0.07, "T4": 0.06, "V100": 0.2}


def load_search(plan: str) -> dict:
    """The stored record of ``python -m kernels.gpt2.search --plan <plan>``."""
    return load(f"gpt2_{plan}")


def parse_name(name: str) -> tuple[str, str, str]:
    """'f-const3e-3-U-s1' -> ('f-const3e-3', 'U', 's1')."""
    config, variant, seed = name.rsplit("-", 2)
    return config, variant, seed


def smooth(steps, values, width: int = 10):
    """Moving average over ``width`` points, only where the window is full (no edge artefacts);
    returns the steps at the window centres and the averages."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    width = max(1, min(width, len(values)))
    averaged = np.convolve(values, np.ones(width) / width, mode="valid")
    return steps[(width - 1) // 2:][:len(averaged)], averaged


def monitor_series(run: dict, key: str, layer: int | None = None):
    """(steps, values) of a per-layer diagnostic; ``layer=None`` gives the maximum over layers.
    ``key='wq'`` reads ‖W_Q‖₂ (largest head of the layer); other keys are the probe's stats."""
    steps, values = [], []
    for m in run["monitor"]:
        if key == "wq":
            per_layer = [max(w) for w in m["wq_norms"]]
        elif key in ("rows_tied_bf16", "rows_p1_fa2"):
            per_layer = [100.0 * st[key] / st["rows"] for st in m["layers"]]   # percent of rows
        else:
            per_layer = [st.get(key) for st in m["layers"]]
        if any(v is None for v in per_layer):
            continue
        steps.append(m["step"])
        values.append(max(per_layer) if layer is None else per_layer[layer])
    return np.array(steps), np.array(values, dtype=float)


def summary_rows(runs: dict) -> list[dict]:
    """One row per run: steps reached, speed, losses, explosion step (None = did not explode)."""
    rows = []
    for name, run in runs.items():
        config, variant, seed = parse_name(name)
        h, cfg = run["history"], run["config"]
        boom = find_explosion(h["step"], h["loss"])
        tail = np.asarray(h["loss"][-20:], dtype=float)
        rows.append({"run": name, "config": config, "variant": variant, "seed": seed,
                     "attention": cfg["attn"], "lr": cfg["lr"], "decay": cfg["min_lr"] < cfg["lr"],
                     "steps": run["summary"]["steps_done"], "steps_per_s": run["summary"]["steps_per_s"],
                     "tokens_M": run["summary"]["steps_done"] * cfg["batch_size"] * cfg["block_size"] / 1e6,
                     "min_loss": float(np.nanmin(h["loss"])), "final_loss": float(np.mean(tail)),
                     "explosion_step": boom})
    return rows


def plot_losses(ax, runs: dict, config: str, seeds=None, width: int = 10):
    """Training loss (nats per token) of every variant of one configuration."""
    for name, run in runs.items():
        c, variant, seed = parse_name(name)
        if c != config or (seeds is not None and seed not in seeds):
            continue
        h = run["history"]
        ax.plot(*smooth(h["step"], h["loss"], width), color=VARIANT_COLOURS[variant], lw=1.2,
                label=f"{VARIANT_NAMES[variant]} {seed}")
    ax.set(xlabel="training step", ylabel="loss (nats / byte)", title=config)
    ax.legend(fontsize=FONT)


def plot_diagnostic(ax, runs: dict, config: str, key: str, ylabel: str, layer=None, log=False):
    for name, run in runs.items():
        c, variant, seed = parse_name(name)
        if c != config:
            continue
        steps, values = monitor_series(run, key, layer)
        ax.plot(steps, values, color=VARIANT_COLOURS[variant], lw=1.2, marker=".", ms=3,
                label=f"{variant} {seed}")
    ax.set(xlabel="training step", ylabel=ylabel)
    if log:
        ax.set_yscale("log")


def plot_gap(ax, runs: dict, config: str, a: str = "U", b: str = "F", width: int = 20):
    """Smoothed loss(a) − loss(b) per seed (same seed, same batches), next to the gap between two
    seeds of variant b: how large a numerics effect is compared with seed-to-seed noise."""
    by = {parse_name(n)[1:]: r["history"] for n, r in runs.items() if parse_name(n)[0] == config}
    seeds = sorted({seed for _, seed in by})
    for seed in seeds:
        ha, hb = by[(a, seed)], by[(b, seed)]
        n = min(len(ha["loss"]), len(hb["loss"]))
        gap = np.asarray(ha["loss"][:n]) - np.asarray(hb["loss"][:n])
        ax.plot(*smooth(ha["step"][:n], gap, width), lw=1.2, label=f"{a} − {b}, seed {seed[1:]}")
    if len(seeds) >= 2:
        h1, h2 = by[(b, seeds[0])], by[(b, seeds[1])]
        n = min(len(h1["loss"]), len(h2["loss"]))
        gap = np.asarray(h1["loss"][:n]) - np.asarray(h2["loss"][:n])
        ax.plot(*smooth(h1["step"][:n], gap, width), color="k", lw=1, ls="--",
                label=f"{b}: seed {seeds[0][1:]} − seed {seeds[1][1:]}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="training step", ylabel="loss difference (nats / byte)")
    ax.legend(fontsize=FONT)


def obits_of(run: dict) -> int:
    """Mantissa bits of Ō in a run (7 = bf16; fewer = the amplifier)."""
    from .attention import parse_spec
    return parse_spec(run["config"]["attn"]).obits


def outcome(run: dict) -> dict:
    """How a run ended: the step (and wall seconds) of its loss explosion or first non-finite loss,
    or ``None`` for both if it did neither within the ``steps`` it reached."""
    h = run["history"]
    losses = np.asarray(h["loss"], dtype=float)
    nonfinite = int(h["step"][int(np.argmax(~np.isfinite(losses)))]) if (~np.isfinite(losses)).any() else None
    boom = find_explosion(h["step"], h["loss"])
    event = boom if nonfinite is None or (boom is not None and boom < nonfinite) else nonfinite
    wall = None if event is None else h["wall_s"][h["step"].index(event)]
    kind = None if event is None else ("NaN" if event == nonfinite else "explosion")
    return {"event": kind, "step": event, "wall_s": wall, "steps": run["summary"]["steps_done"],
            "steps_per_s": run["summary"]["steps_per_s"], "obits": obits_of(run)}


def outcome_table(runs: dict):
    """A pandas table of :func:`outcome` for every run, with its configuration, variant and seed."""
    import pandas as pd
    rows = []
    for name, run in runs.items():
        config, variant, seed = parse_name(name)
        row = {"run": name, "config": config, "variant": variant, "seed": seed, **outcome(run)}
        row["event"] = row["event"] or "none"
        rows.append(row)
    return pd.DataFrame(rows)


def plot_steps_to_failure(ax, table, variants=("U", "R", "F", "S")):
    """Steps to failure against the mantissa bits of Ō; a run that did not fail is drawn as an
    open marker at the step it reached, with an arrow up (failure, if any, comes later)."""
    offsets = {v: (i - (len(variants) - 1) / 2) * 0.12 for i, v in enumerate(variants)}
    for variant in variants:
        rows = table[table.variant == variant]
        failed, alive = rows[rows.step.notna()], rows[rows.step.isna()]
        colour = VARIANT_COLOURS[variant]
        if len(failed):
            ax.scatter(failed.obits + offsets[variant], failed.step, color=colour, s=30,
                       marker="o", label=f"{VARIANT_NAMES[variant]}: failed")
        if len(alive):
            ax.scatter(alive.obits + offsets[variant], alive.steps, facecolor="none", edgecolor=colour,
                       s=40, marker="^", label=f"{VARIANT_NAMES[variant]}: still training")
    ax.set(yscale="log", xlabel="mantissa bits of Ō (7 = bf16)", ylabel="training steps",
           title="steps to loss explosion or NaN")
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def estimate_minutes(steps: int, measured_steps_per_s: float, gpu_name: str | None):
    """An ESTIMATE of the wall time of ``steps`` on ``gpu_name`` from a speed measured on an H200."""
    if not gpu_name:
        return None, "no GPU"
    factor = next((f for key, f in GPU_FACTORS.items() if key in gpu_name.upper()), 0.3)
    rate = measured_steps_per_s * factor
    return steps / rate / 60.0, f"{gpu_name}: ~{factor:g}× an H200 (rough guess) → ~{rate:.0f} steps/s"


__all__ = ["VARIANTS", "load_search", "summary_rows", "plot_losses", "plot_diagnostic", "monitor_series",
           "estimate_minutes", "parse_name", "VARIANT_NAMES", "VARIANT_COLOURS", "outcome", "outcome_table",
           "plot_steps_to_failure", "obits_of", "PAIRS", "DEPARTURE_RULES", "rolling_mean",
           "departure", "pair_departures", "departure_table", "delta_bias_share",
           "matched_delta_stats", "outcome_rows", "plot_outcomes", "departure_legend",
           "plot_precondition", "plot_similarity", "plot_bias_shares", "FONT"]


# ------------------------------------------------------------------------------------------------
# When does a diagnostic of the failing run leave its control behind? (same seed, same batches)
# ------------------------------------------------------------------------------------------------
# Pairs of stored runs that differ only in where δ comes from: (failing path, fp32-O control),
# same seed, batch order, schedule and mantissa bits of Ō. ``k5-U-s0`` (plan amplify) and
# ``k5-F-s0`` (plan amp_final) were made by two calls of the same code and options.
PAIRS = (("k3-U-s0", "k3-F-s0"), ("k4-U-s1", "k4-F-s1"), ("k4-U-s2", "k4-F-s2"),
         ("k4-U-s3", "k4-F-s3"), ("k5-U-s0", "k5-F-s0"), ("k7-U-s0", "k7-F-s0"),
         ("k7long-U-s0", "k7long-F-s0"))
# How far above the control, and smoothed over how many monitoring points, counts as "left":
# ‖W_Q‖ is smooth (25 % above, no smoothing); the tie share and the rank-1 cosines are noisy
# from step to step (10 % and 25 % above the control, over 5 points = 500 steps).
DEPARTURE_RULES = {"wq": (1.25, 1), "rows_tied_bf16": (1.10, 5), "rank1_token_cos": (1.25, 5),
                   "rank1_step_cos": (1.05, 5)}


def rolling_mean(values, width: int) -> np.ndarray:
    """Centred moving average of ``width`` points; shorter windows at the ends (same length)."""
    values = np.asarray(values, dtype=float)
    if width <= 1:
        return values
    half = width // 2
    return np.array([np.mean(values[max(0, i - half):i + half + 1]) for i in range(len(values))])


def departure(steps_a, a, steps_b, b, ratio: float, width: int = 1):
    """First step from which ``a / b`` (each smoothed over ``width`` points) stays above
    ``ratio`` at every later step the two series share; ``None`` if it never does."""
    common = np.intersect1d(steps_a, steps_b)
    if len(common) < 2:
        return None
    pick = lambda s, v: rolling_mean(np.asarray(v)[np.isin(s, common)], width)  # noqa: E731
    above = pick(steps_a, a) / pick(steps_b, b) > ratio
    if not above[-1]:
        return None
    first = len(above) - int(np.argmin(above[::-1])) if not above.all() else 0
    return int(common[first]) if first < len(common) - 1 else None


def pair_departures(failing: dict, control: dict, layer: int = 0, rules=None) -> dict:
    """The step at which each diagnostic of ``rules`` (default :data:`DEPARTURE_RULES`) of the
    failing run leaves the control's (layer ``layer``), and the failing run's explosion step
    (None: not within its run)."""
    out = {}
    for key, (ratio, width) in (rules or DEPARTURE_RULES).items():
        sa, va = monitor_series(failing, key, layer)
        sb, vb = monitor_series(control, key, layer)
        out[key] = departure(sa, va, sb, vb, ratio, width)
    out["explosion"] = outcome(failing)["step"]
    return out


def departure_table(runs: dict, pairs=PAIRS, layer: int = 0, rules=None):
    """A pandas table of :func:`pair_departures`, one row per pair present in ``runs``."""
    import pandas as pd
    rows = []
    for fail, ctrl in pairs:
        if fail in runs and ctrl in runs:
            rows.append({"failing": fail, "control": ctrl, "obits": obits_of(runs[fail]),
                         "steps": runs[fail]["summary"]["steps_done"],
                         "schedule": runs[fail]["config"]["steps"],
                         **pair_departures(runs[fail], runs[ctrl], layer, rules)})
    return pd.DataFrame(rows)


def delta_bias_share(run: dict, layer: int = 0, before=None) -> float:
    """Σ(δ_lp − δ_hp) / Σ|δ_lp − δ_hp| over the monitoring steps before ``before`` (all if None):
    0 = no bias, +1 or −1 = every row's error of one sign."""
    stats = [m["layers"][layer] for m in run["monitor"]
             if (before is None or m["step"] < before) and "delta_abs" in m["layers"][layer]
             and np.isfinite(m["layers"][layer]["delta_abs"])]
    total = sum(s["delta_abs"] for s in stats)
    return sum(s["delta_err"] for s in stats) / total if total else float("nan")


def matched_delta_stats(runs: dict, seeds=("s1", "s2", "s3"), first_step: int = 200):
    """Per layer: the mean and the mean absolute value of δ_lp − δ_hp *per row* in the 4-bit
    failing runs ``k4-U-<seed>``, over the monitoring steps from ``first_step`` until layer 0's
    ‖W_Q‖ leaves its control's (``k4-F-<seed>``). The controls B and N of :mod:`.plans` are
    matched to these numbers (``plans.MATCHED_K4``)."""
    per_layer = None
    for seed in seeds:
        fail, ctrl = runs[f"k4-U-{seed}"], runs[f"k4-F-{seed}"]
        stop = pair_departures(fail, ctrl)["wq"]
        for m in fail["monitor"]:
            if not first_step <= m["step"] < stop:
                continue
            if per_layer is None:
                per_layer = [([], []) for _ in m["layers"]]
            for (means, abss), st in zip(per_layer, m["layers"]):
                rows = st["rows"] / fail["config"]["batch_size"]         # heads × tokens
                means.append(st["delta_err"] / rows)
                abss.append(st["delta_abs"] / rows)
    return {"mean": tuple(float(np.mean(m)) for m, _ in per_layer),
            "mean_abs": tuple(float(np.mean(a)) for _, a in per_layer)}


# ------------------------------------------------------------------------------------------------
# The chapter's figures of stored runs (each one message; fonts >= FONT points at 7.2 inches)
# ------------------------------------------------------------------------------------------------
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
    return [(f"{_schedule_label(runs[groups[k][0]])}: {VARIANT_NAMES[k[2]]}", k[2], groups[k])
            for k in keys]


OUTCOME_MARKERS = {"explosion": dict(marker="o", s=36), "NaN": dict(marker="X", s=46),
                   None: dict(marker=">", s=40)}
OUTCOME_WORDS = {"explosion": "loss exploded", "NaN": "went NaN",
                 None: "still training when its time ran out"}


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
    proxies = [Line2D([], [], ls="", marker=OUTCOME_MARKERS[e]["marker"], ms=7,
                      markerfacecolor="none" if e is None else "0.35", markeredgecolor="0.35",
                      label=OUTCOME_WORDS[e]) for e in OUTCOME_MARKERS]
    if departures:
        proxies.append(Line2D([], [], ls="", marker="|", ms=10, mew=2, color="0.25",
                              label="‖W_Q‖ left the control's"))
    ax.legend(handles=proxies, fontsize=FONT, loc="upper center", ncol=2,
              bbox_to_anchor=(0.3, -0.09))


def _mark(ax, step, colour, style):
    if step is not None:
        ax.axvline(step, color=colour, ls=style, lw=1.2)


def departure_legend(ax, keys=("rows_tied_bf16", "wq"), target=None, **kw):
    """A legend for the vertical lines that mark departures, added to ``ax``'s own entries and
    drawn on ``target`` (an axis or a figure; default ``ax``)."""
    from matplotlib.lines import Line2D
    words = {"rows_tied_bf16": ("--", "tie share leaves the control's"),
             "wq": (":", "‖W_Q‖ leaves the control's"),
             "rank1_token_cos": ("-.", "similarity leaves the control's")}
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="0.3", ls=words[k][0], label=words[k][1]) for k in keys]
    (target or ax).legend(handles=handles, fontsize=FONT, **kw)


def plot_precondition(axes, failing: dict, control: dict, layer: int = 0, width: int = 25):
    """Three stacked panels over training steps, failing run (red) and its control (blue): the
    loss, the share of rows with repeated maxima (exactly tied maxima of a bf16 S, the paper's
    App. E.1 count), and ‖W_Q‖₂; dashed: where the tie share leaves the control's, dotted: where
    ‖W_Q‖ does (:data:`DEPARTURE_RULES`)."""
    dep = pair_departures(failing, control, layer)
    for run, colour, who in ((failing, VARIANT_COLOURS["U"], "failing path"),
                             (control, VARIANT_COLOURS["F"], "control")):
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
    return dep


def plot_similarity(ax, failing: dict, control: dict, layer: int = 0):
    """The mean cosine similarity of the rank-1 terms (PK)[T]ᵀX[T] over pairs of tokens (Eq. 2,
    the paper's Fig. 4), failing run and control, with the two departure steps marked."""
    dep = pair_departures(failing, control, layer)
    for run, colour, who in ((failing, VARIANT_COLOURS["U"], "failing path"),
                             (control, VARIANT_COLOURS["F"], "control")):
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
    for y, (label, (values, colour)) in enumerate(groups.items()):
        values = np.asarray(values, dtype=float)
        ax.scatter(100 * values, y + rng.uniform(-0.15, 0.15, len(values)), color=colour, s=24,
                   alpha=0.8)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(groups)), list(groups), fontsize=FONT)
    ax.invert_yaxis()
    ax.set_xlabel("Σ(δ_lp − δ_hp) as % of Σ|δ_lp − δ_hp|, layer 0", fontsize=FONT)


EVENT_WORDS = {"explosion": "exploded", "NaN": "went NaN"}
FIX_ORDER = "USCKDPF"   # the failing path, the β rule and its repairs, then the two δ routes
FIX_STYLES = {"C": "--", "D": "-.", "K": ":"}   # the repaired β rules, told apart by line too


def fix_runs(stored: dict) -> dict:
    """The 4-bit runs of seeds 1-3 that compare fixes: the failing path ``U``, its control
    ``F``, the β rule ``S`` and ``P`` on seed 1 (plan ``amp_seeds``) with the repaired β rules
    ``C``, ``K``, ``D`` and ``P`` on seeds 2-3 (plan ``amp_fixes``; ``stored`` maps the runs of
    both files by name)."""
    return {name: run for name, run in stored.items()
            if name.split("-")[0] in ("k4", "k4f") and parse_name(name)[1] in FIX_ORDER
            and parse_name(name)[2] in ("s1", "s2", "s3")}


def wq_ratio(run: dict, control: dict, layer: int = 0):
    """(steps, ratio): layer ``layer``'s largest-head ‖W_Q‖₂ of ``run`` over its control's, at
    the checks both logged with finite values."""
    s_run, w_run = monitor_series(run, "wq", layer)
    s_ctl, w_ctl = monitor_series(control, "wq", layer)
    keep_run, keep_ctl = np.isfinite(w_run), np.isfinite(w_ctl)
    steps, at_run, at_ctl = np.intersect1d(s_run[keep_run], s_ctl[keep_ctl],
                                           return_indices=True)
    return steps, w_run[keep_run][at_run] / w_ctl[keep_ctl][at_ctl]


def wq_growth(run: dict, control: dict, step: int, layer: int = 0) -> float:
    """:func:`wq_ratio` at the last check at or before ``step`` (NaN if there is none)."""
    steps, ratio = wq_ratio(run, control, layer)
    before = ratio[steps <= step]
    return float(before[-1]) if len(before) else float("nan")


def fix_table(runs: dict):
    """Per variant of :data:`FIX_ORDER`: seeds, how many failed (explosion or NaN), and the
    steps of those events or the steps reached."""
    import pandas as pd
    rows = []
    for variant in FIX_ORDER:
        names = sorted(n for n in runs if parse_name(n)[1] == variant)
        if not names:
            continue
        outs = [outcome(runs[n]) for n in names]
        ended = [o["step"] for o in outs if o["step"] is not None]
        alive = [o["steps"] for o in outs if o["step"] is None]
        rows.append({"variant": variant, "what": VARIANT_NAMES[variant], "runs": len(names),
                     "failed": len(ended),
                     "events": "; ".join(
                         f"{EVENT_WORDS[kind]} at "
                         + ", ".join(f"{o['step']:,}" for o in outs if o["event"] == kind)
                         for kind in ("explosion", "NaN")
                         if any(o["event"] == kind for o in outs)) or "none",
                     "reached": max(alive) if alive else None})
    return pd.DataFrame(rows)


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
            steps, ratio = wq_ratio(runs[name], runs[f"k4-F-{parse_name(name)[2]}"], layer)
            o = outcome(runs[name])
            end = o["step"] if o["step"] is not None else o["steps"]
            steps, ratio = steps[steps <= end], ratio[steps <= end]
            if len(steps) > width:
                ratio = np.convolve(ratio, np.ones(width) / width, mode="valid")
                steps = steps[width - 1:]
            colour = VARIANT_COLOURS[variant]
            label = None if variant in drawn else VARIANT_NAMES[variant]
            drawn.add(variant)
            ax.plot(steps, ratio, color=colour, lw=1.4, label=label,
                    ls=FIX_STYLES.get(variant, "-"))
            style = dict(OUTCOME_MARKERS[o["event"]])
            if o["event"] is None:
                style.update(facecolor="none", edgecolor=colour)
            else:
                style.update(color=colour)
            if len(steps):
                ax.scatter(steps[-1], ratio[-1], zorder=3, **style)
    ax.axhline(1.0, color=VARIANT_COLOURS["F"], lw=1, ls="--",
               label=VARIANT_NAMES["F"] + " (= 1)")
    ax.set_yscale("log")
    ax.set_xlabel("training step", fontsize=FONT)
    ax.set_ylabel(f"layer-{layer} ‖W_Q‖₂ ÷ control's", fontsize=FONT)
