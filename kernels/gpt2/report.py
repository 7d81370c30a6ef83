"""Measure the stored GPT-2 runs (loaded and named by :mod:`.runs`, whose names this module
passes on): outcomes, departures, the lean of the δ error, the controls' and the fixes' tables.
:mod:`.figures` draws them.

Every function takes a run (one training log) or the ``runs`` dict of a search record (name ->
training log, see :mod:`kernels.gpt2.search`).
"""

from __future__ import annotations

import numpy as np

from .diagnostics import find_explosion
from .runs import (  # noqa: F401 (the chapter reads the runs' names and loaders from here too)
    FONT,
    VARIANT_COLOURS,
    VARIANT_NAMES,
    control_runs,
    describe_files,
    first_divergence,
    gpus_of,
    last_loss,
    load_search,
    monitor_series,
    obits_of,
    parse_name,
    real_bf16_runs,
    run_label,
    schedule_steps,
    smooth,
)

# Rough speed of other GPUs relative to an H200 for this small, memory-bound model (an estimate
# from memory bandwidth, not a measurement).
GPU_FACTORS = {"H200": 1.0, "H100": 0.7, "A100": 0.4, "L4": 0.07, "T4": 0.06, "V100": 0.2}


def summary_rows(runs: dict) -> list[dict]:
    """One row per run: steps reached, speed, losses, explosion step (None = did not explode)."""
    rows = []
    for name, run in runs.items():
        config, variant, seed = parse_name(name)
        h, cfg = run["history"], run["config"]
        boom = find_explosion(h["step"], h["loss"])
        tail = np.asarray(h["loss"][-20:], dtype=float)
        rows.append(
            {
                "run": name,
                "config": config,
                "variant": variant,
                "seed": seed,
                "attention": cfg["attn"],
                "lr": cfg["lr"],
                "decay": cfg["min_lr"] < cfg["lr"],
                "steps": run["summary"]["steps_done"],
                "steps_per_s": run["summary"]["steps_per_s"],
                "tokens_M": run["summary"]["steps_done"]
                * cfg["batch_size"]
                * cfg["block_size"]
                / 1e6,
                "min_loss": float(np.nanmin(h["loss"])),
                "final_loss": float(np.mean(tail)),
                "explosion_step": boom,
            }
        )
    return rows


def outcome(run: dict) -> dict:
    """How a run ended: the step (and wall seconds) of its loss explosion or first non-finite loss,
    or ``None`` for both if it did neither within the ``steps`` it reached."""
    h = run["history"]
    losses = np.asarray(h["loss"], dtype=float)
    nonfinite = (
        int(h["step"][int(np.argmax(~np.isfinite(losses)))])
        if (~np.isfinite(losses)).any()
        else None
    )
    boom = find_explosion(h["step"], h["loss"])
    event = boom if nonfinite is None or (boom is not None and boom < nonfinite) else nonfinite
    wall = None if event is None else h["wall_s"][h["step"].index(event)]
    kind = None if event is None else ("NaN" if event == nonfinite else "explosion")
    return {
        "event": kind,
        "step": event,
        "wall_s": wall,
        "steps": run["summary"]["steps_done"],
        "steps_per_s": run["summary"]["steps_per_s"],
        "obits": obits_of(run),
    }


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


def estimate_minutes(steps: int, measured_steps_per_s: float, gpu_name: str | None):
    """An ESTIMATE of the wall time of ``steps`` on ``gpu_name`` from a speed measured on an
    H200."""
    if not gpu_name:
        return None, "no GPU"
    factor = next((f for key, f in GPU_FACTORS.items() if key in gpu_name.upper()), 0.3)
    rate = measured_steps_per_s * factor
    return (
        steps / rate / 60.0,
        f"{gpu_name}: ~{factor:g}× an H200 (rough guess) → ~{rate:.0f} steps/s",
    )


# --- When does a diagnostic of the failing run leave its control behind? (same seed, batches) ---
# Pairs of stored runs that differ only in where δ comes from: (failing path, fp32-O control),
# same seed, batch order, schedule and mantissa bits of Ō. ``k5-U-s0`` (plan amplify) and
# ``k5-F-s0`` (plan amp_final) were made by two calls of the same code and options.
# the earlier real-BF16 pair of seed 0 (one H200 each, 31,000 steps on the 60,000-step schedule)
EARLIER_BF16 = {"U": "k7long-U-s0", "F": "k7long-F-s0"}
FAILING, CONTROL, RELEASED = "U", "F", "Z"  # the arms' letters under the names chapter 7 uses
DP_DELTA, BETA_RULE = "P", "S"  # δ from rowsum(dP∘P); the (β, ε) rule
FA2, FA2_CONTROL, SDPA = "W", "V", "A"


PAIRS = (
    ("k3-U-s0", "k3-F-s0"),
    ("k4-U-s1", "k4-F-s1"),
    ("k4-U-s2", "k4-F-s2"),
    ("k4-U-s3", "k4-F-s3"),
    ("k5-U-s0", "k5-F-s0"),
    ("k7-U-s0", "k7-F-s0"),
    ("k7long-U-s0", "k7long-F-s0"),
)
# Real BF16 (results/gpt2_bf16_real_long*.json): each seed's failing path and its control on the
# same batches (the second testbed's pairs are kernels.gpt2.testbed.TESTBED_PAIRS)
REAL_BF16_PAIRS = (("bf16-U-s1", "bf16-F-s1"), ("bf16-U-s0", "bf16-F-s0"))
# How far above the control, and smoothed over how many monitoring points, counts as "left":
# ‖W_Q‖ is smooth (25 % above, no smoothing); the tie share and the rank-1 cosines are noisy
# from step to step (10 % and 25 % above the control, over 5 points = 500 steps).
DEPARTURE_RULES = {
    "wq": (1.25, 1),
    "rows_tied_bf16": (1.10, 5),
    "rank1_token_cos": (1.25, 5),
    "rank1_step_cos": (1.05, 5),
}


def rolling_mean(values, width: int) -> np.ndarray:
    """Centred moving average of ``width`` points; shorter windows at the ends (same length)."""
    values = np.asarray(values, dtype=float)
    if width <= 1:
        return values
    half = width // 2
    return np.array([np.mean(values[max(0, i - half) : i + half + 1]) for i in range(len(values))])


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
            rows.append(
                {
                    "failing": fail,
                    "control": ctrl,
                    "obits": obits_of(runs[fail]),
                    "steps": runs[fail]["summary"]["steps_done"],
                    "schedule": runs[fail]["config"]["steps"],
                    **pair_departures(runs[fail], runs[ctrl], layer, rules),
                }
            )
    return pd.DataFrame(rows)


def delta_bias_share(run: dict, layer: int = 0, before=None) -> float:
    """Σ(δ_lp − δ_hp) / Σ|δ_lp − δ_hp| over the monitoring steps before ``before`` (all if None):
    0 = no bias, +1 or −1 = every row's error of one sign."""
    stats = [
        m["layers"][layer]
        for m in run["monitor"]
        if (before is None or m["step"] < before)
        and "delta_abs" in m["layers"][layer]
        and np.isfinite(m["layers"][layer]["delta_abs"])
    ]
    total = sum(s["delta_abs"] for s in stats)
    return sum(s["delta_err"] for s in stats) / total if total else float("nan")


def matched_delta_stats(
    runs: dict,
    seeds=("s1", "s2", "s3"),
    first_step: int = 200,
    failing: str = "k4-U",
    until: int | None = None,
):
    """Per layer: the mean and the mean absolute value of δ_lp − δ_hp *per row* in the 4-bit
    failing runs ``<failing>-<seed>``, over the monitoring steps from ``first_step`` until layer
    0's ‖W_Q‖ leaves its control's (``k4-F-<seed>``). The controls B and N of :mod:`.plans` are
    matched to these numbers (``plans.MATCHED_K4``), measured by the probe of runs stored before
    2026-11-25 (O_hp under autocast); ``failing="k4c-U"`` reads seed 1's rerun, probed in fp32.
    ``until``: end the window at this step instead (for a run whose ‖W_Q‖ never leaves)."""
    per_layer = None
    for seed in seeds:
        fail, ctrl = runs[f"{failing}-{seed}"], runs[f"k4-F-{seed}"]
        stop = until if until is not None else pair_departures(fail, ctrl)["wq"]
        for m in fail["monitor"]:
            if not first_step <= m["step"] < stop:
                continue
            if per_layer is None:
                per_layer = [([], []) for _ in m["layers"]]
            for (means, abss), st in zip(per_layer, m["layers"]):
                rows = st["rows"] / fail["config"]["batch_size"]  # heads × tokens
                means.append(st["delta_err"] / rows)
                abss.append(st["delta_abs"] / rows)
    return {
        "mean": tuple(float(np.mean(m)) for m, _ in per_layer),
        "mean_abs": tuple(float(np.mean(a)) for _, a in per_layer),
    }


EVENT_WORDS = {"explosion": "exploded", "NaN": "went NaN"}
FIX_ORDER = "USCKDPF"  # the failing path, the β rule and its repairs, then the two δ routes
CONTROL_ORDER = "MXBNG"  # the controls of plan ``controls`` (its U and F runs are not controls)


def control_rows(runs: dict, controls: dict, seeds=("s1", "s2"), at=(5_000, 7_000)) -> list:
    """One row per stored control run (a variant of :data:`CONTROL_ORDER`) of ``seeds``
    (``controls``: :func:`control_runs`): its seed and variant, layer 0's ‖W_Q‖ over its seed's
    control's (``k4-F-<seed>`` in ``runs``) at each step of ``at`` (NaN where the run had
    exploded before), and how it ended (``exploded``: the step or None; ``steps`` reached)."""
    rows = []
    for name, run in controls.items():
        _, variant, seed = parse_name(name)
        if seed not in seeds or variant not in CONTROL_ORDER:
            continue
        ended = outcome(run)
        ratio = [
            float("nan")
            if ended["step"] is not None and ended["step"] < step
            else ratio_to_control_at(run, runs[f"k4-F-{seed}"], step)
            for step in at
        ]
        ended = dict(exploded=ended["step"], steps=ended["steps"])
        rows.append(dict(seed=seed, variant=variant, ratio=ratio, **ended))
    return sorted(rows, key=lambda r: (r["seed"], CONTROL_ORDER.index(r["variant"])))


def fix_runs(stored: dict) -> dict:
    """The 4-bit runs of seeds 1-3 that compare fixes: the failing path ``U``, its control
    ``F``, the β rule ``S`` and ``P`` on seed 1 (plan ``amp_seeds``) with the repaired β rules
    ``C``, ``K``, ``D`` and ``P`` on seeds 2-3 (plan ``amp_fixes``; ``stored`` maps the runs of
    both files by name)."""
    return {
        name: run
        for name, run in stored.items()
        if name.split("-")[0] in ("k4", "k4f")
        and parse_name(name)[1] in FIX_ORDER
        and parse_name(name)[2] in ("s1", "s2", "s3")
    }


def ratio_to_control(run: dict, control: dict, layer: int = 0, key: str = "wq"):
    """(steps, ratio): layer ``layer``'s largest-head ‖W_Q‖₂ (or the diagnostic ``key``) of
    ``run`` over its control's, at the checks both logged with finite values."""
    s_run, w_run = monitor_series(run, key, layer)
    s_ctl, w_ctl = monitor_series(control, key, layer)
    keep_run, keep_ctl = np.isfinite(w_run), np.isfinite(w_ctl)
    steps, at_run, at_ctl = np.intersect1d(s_run[keep_run], s_ctl[keep_ctl], return_indices=True)
    return steps, w_run[keep_run][at_run] / w_ctl[keep_ctl][at_ctl]


def mean_loss(run: dict, start: int, stop: int) -> float:
    """The mean logged training loss over steps ``start`` <= step < ``stop``."""
    steps, loss = np.asarray(run["history"]["step"]), np.asarray(run["history"]["loss"])
    return float(loss[(steps >= start) & (steps < stop)].mean())


def runaway_step(run: dict, layer: int = 0, factor: float = 2.0, after: int = 10_000):
    """The first check after step ``after`` at which layer ``layer``'s ‖W_Q‖₂ (largest head)
    exceeds ``factor`` times its value at ``after``: a runaway measured against the run's own
    level, so runs without a control of their own can be compared (None: never)."""
    steps, wq = monitor_series(run, "wq", layer)
    if not len(steps) or steps[-1] <= after:
        return None  # the run never got past ``after``
    base = wq[np.searchsorted(steps, after)]
    later = steps[(steps > after) & (wq > factor * base)]
    return int(later[0]) if len(later) else None


def runaway_head(run: dict, layer: int = 0, level: float = 5.0) -> int | None:
    """The head of layer ``layer`` whose ‖W_Q‖₂ first passes ``level`` (None: none does)."""
    for check in run["monitor"]:
        norms = np.asarray(check["wq_norms"][layer])
        if norms.max() > level:
            return int(norms.argmax())
    return None


def ratio_to_control_at(
    run: dict, control: dict, step: int, layer: int = 0, key: str = "wq"
) -> float:
    """:func:`ratio_to_control` (of ``key``) at the last check at or before ``step`` (NaN if
    none)."""
    steps, ratio = ratio_to_control(run, control, layer, key)
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
        rows.append(
            {
                "variant": variant,
                "what": VARIANT_NAMES[variant],
                "runs": len(names),
                "failed": len(ended),
                "events": "; ".join(
                    f"{EVENT_WORDS[kind]} at "
                    + ", ".join(f"{o['step']:,}" for o in outs if o["event"] == kind)
                    for kind in ("explosion", "NaN")
                    if any(o["event"] == kind for o in outs)
                )
                or "none",
                "reached": max(alive) if alive else None,
            }
        )
    return pd.DataFrame(rows)


def real_bf16_numbers(real: dict, earlier: tuple) -> dict:
    """Chapter 7 section 2's numbers, by glue name, from the real-BF16 runs (``real``, from
    :func:`real_bf16_runs`) and the earlier seed-0 runs ``(failing path, control)``; prints
    them. Raises if the runs no longer say what the prose says (seed 1's failing path
    explodes and its control does not; seed 0's failing path does not explode and stops
    improving while its control goes on; the failing paths' ‖W_Q‖ runs away first)."""
    fail_0, fail_1, ctrl_0, ctrl_1 = (real[v, s] for v in "UF" for s in ("s0", "s1"))
    boom, steps_0 = outcome(fail_1)["step"], fail_0["summary"]["steps_done"]
    f1, c1, f0, c0 = (  # mean loss over the 1,000 steps before each step the run reached
        {
            s: mean_loss(r, s - 1_000, s)
            for s in (40_000, 50_000, boom or 0, 80_000)
            if 1_000 <= s <= r["summary"]["steps_done"]
        }
        for r in (fail_1, ctrl_1, fail_0, ctrl_0)
    )
    named = {"f0": fail_0, "f1": fail_1, "c0": ctrl_0, "c1": ctrl_1}
    runaway = {n: runaway_step(r) for n, r in named.items()}
    if boom is None or outcome(ctrl_1)["step"] or outcome(fail_0)["step"]:
        raise ValueError("the prose says seed 1's failing path alone explodes")
    if not (f0[80_000] > f0[40_000] - 0.01 and c0[80_000] < c0[40_000]):
        raise ValueError("the prose says seed 0's failing path stops improving, its control not")
    if None in runaway.values() or max(runaway["f0"], runaway["f1"]) >= runaway["c1"]:
        raise ValueError(f"the prose says the failing paths run away first: {runaway}")
    repeat = {
        n: mean_loss(r, 29_000, 30_000)
        for n, r in zip(("u0", "u", "f0", "f"), (earlier[0], fail_0, earlier[1], ctrl_0))
    }
    ctrl_steps, ctrl_wq = monitor_series(ctrl_1, "wq", 0)
    at = [ctrl_wq[np.searchsorted(ctrl_steps, s)] for s in (42_000, runaway["c1"])]
    growth = at[0] / at[1]
    numbers = {f"g7_repeat_{n}": x for n, x in repeat.items()} | {
        "g7_repeat_gap_f": abs(repeat["f0"] - repeat["f"]),
        "g7_ctrl1_growth": growth,
        "g7_boom": boom,
        "g7_boom_ctrl": ctrl_1["summary"]["steps_done"],
        "g7_steps_0": steps_0,
        "g7_loss_f1_40k": f1[40_000],
        "g7_loss_f1_50k": f1[50_000],
        "g7_loss_c1_boom": c1[boom],
        "g7_loss_f0_40k": f0[40_000],
        "g7_loss_f0_80k": f0[80_000],
        "g7_loss_c0_40k": c0[40_000],
        "g7_loss_c0_80k": c0[80_000],
        "g7_gap_0": f0[80_000] - c0[80_000],
        "g7_wq0_80k": ratio_to_control_at(fail_0, ctrl_0, 80_000),
        "g7_runaway_ctrl0": runaway["c0"],
        "g7_runaway_ctrl": runaway["c1"],
        "g7_runaway_lo": min(runaway["f0"], runaway["f1"]),
        "g7_runaway_hi": max(runaway["f0"], runaway["f1"]),
        "g7_wq_50k": ratio_to_control_at(fail_1, ctrl_1, 50_000),
        "g7_logit_50k": ratio_to_control_at(fail_1, ctrl_1, 50_000, key="max_logit"),
    }
    logit0_80k = ratio_to_control_at(fail_0, ctrl_0, 80_000, key="max_logit")
    n = numbers
    print("loss, mean over the 1,000 steps before the step:")
    print(
        f"  failing path, seed 1: {f1[40_000]:.3f} at 40k, {f1[50_000]:.3f} at 50k, "
        f"{f1[boom]:.3f} at {boom:,}"
    )
    print(f"  control, seed 1: {c1[boom]:.3f} at {boom:,}")
    print(f"  failing path, seed 0: {f0[40_000]:.3f} at 40k, {f0[80_000]:.3f} at 80k")
    print(f"  control, seed 0: {c0[40_000]:.3f} at 40k, {c0[80_000]:.3f} at 80k")
    print("failing path over its control:")
    print(
        f"  seed 1 at step 50,000: ‖W_Q‖ {n['g7_wq_50k']:.1f}×, "
        f"largest logit {n['g7_logit_50k']:,.0f}×"
    )
    print(
        f"  seed 0 at step 80,000: ‖W_Q‖ {n['g7_wq0_80k']:.1f}×, largest logit {logit0_80k:,.0f}×"
    )
    print(
        "seed 0 run twice, loss at step 30,000: failing path {u0:.3f} and {u:.3f}, "
        "control {f0:.3f} and {f:.3f}".format(**repeat)
    )
    return numbers
