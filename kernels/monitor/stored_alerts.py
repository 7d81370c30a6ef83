"""Every stored GPT-2 run replayed through the alert rules (chapter 9, section 6).

* :func:`alert_table` replays every stored GPT-2 run: one row per run, its kind (by the
  variant letter of its name, :func:`run_kind`), where its loss departed, its first alert
  and lead, its false alarms; :func:`alert_summary` groups the rows and
  :func:`alert_numbers` gives the numbers the chapter's prose glues.
* :func:`replay_warmup` takes a run's own ‖W_Q‖ level after its learning-rate warmup.
"""

from __future__ import annotations

import numpy as np

from ..results import load, stored_names

FAILING_LETTERS = "URTLMGHX"  # the failing path and its variants (kernels.gpt2.runs)
FIX_LETTERS = "SPZCKD"  # the fixes
CONTROL_LETTER = "F"  # the control: δ from fp32 O
LONG_STEPS = 31_700  # the longest run the thresholds were drawn from (amp_final)
# The screen's rule of a healthy run (kernels.gpt2.screen; kernels.monitor may not import
# kernels.gpt2, and tests/monitor/test_alert_table.py checks that the two agree).
RUNAWAY_LOGIT, RUNAWAY_GROWTH, RUNAWAY_BASE = 100.0, 3.0, 2_000
# The other variants, each a kind of its own (kernels.gpt2.plans): the book's Triton kernel
# with δ from its own O, the same with δ from an fp32 O, SDPA, and the controls with a
# constant δ bias (B) or δ noise (N) added. A name without a variant letter is a check (DDP).
OTHER_KINDS = {
    "W": "FA2 kernel",
    "V": "FA2 kernel's control",
    "A": "SDPA",
    "B": "perturbed control",
    "N": "perturbed control",
}


def runs_away(run: dict) -> bool:
    """Whether a run breaks the screen's rule over its whole run: its largest |S| reaches
    100, or its largest head's ‖W_Q‖₂ at the last check is ×3 its value at step 2,000 (a
    run stopped before step 2,000 is judged on |S| alone)."""
    checks = run["monitor"]
    logits = [s.get("max_logit") for m in checks for s in m["layers"]]
    if max((v for v in logits if v is not None), default=0.0) >= RUNAWAY_LOGIT:
        return True
    steps = np.array([m["step"] for m in checks])
    wq = np.array([max(max(heads) for heads in m["wq_norms"]) for m in checks])
    if steps[-1] < RUNAWAY_BASE:
        return False
    return bool(wq[-1] / wq[np.searchsorted(steps, RUNAWAY_BASE)] >= RUNAWAY_GROWTH)


def run_kind(name: str, run: dict) -> str:
    """What a stored run is, by the variant letter of its name (``k4-U-s1`` -> U,
    :data:`kernels.gpt2.runs.VARIANT_NAMES`): ``failing path`` (U and its variants R T L
    M G H X), ``fix`` (S P Z C K D), ``healthy control`` (F whose own numbers keep the
    screen's rule, :func:`runs_away`), ``runaway control`` (an F that breaks it, though
    its loss never departs: the screen's controls, whose layer-0 head runs away, and the
    long real-BF16 controls, whose largest |S| reaches thousands after step 27,000),
    then :data:`OTHER_KINDS` (W V A B N), ``check`` for a name without a letter (the DDP
    checks) and ``other`` for a letter none of these knows. The letter, not the outcome,
    gives the kind: a failing path that never departed (a short run, a 7-bit one) stays a
    failing path."""
    parts = name.rsplit("-", 2)
    letter = parts[1] if len(parts) == 3 and len(parts[1]) == 1 else ""
    if letter and letter in FAILING_LETTERS:
        return "failing path"
    if letter and letter in FIX_LETTERS:
        return "fix"
    if letter == CONTROL_LETTER:
        return "runaway control" if runs_away(run) else "healthy control"
    if not letter:
        return "check"
    return OTHER_KINDS.get(letter, "other")


def replay_warmup(run: dict) -> int:
    """The ``warmup_steps`` a replay of ``run`` gives the alerts: the monitor's default
    (:data:`~kernels.monitor.alerts.WARMUP_STEPS`), or twice the run's learning-rate warmup
    (``config.warmup``) where that is longer, so that the layer's own ‖W_Q‖ level (the
    second half of ``warmup_steps``) is taken once the learning rate has warmed up, not
    while it still climbs (the second testbed's 2,000 steps: level over steps 2,000 to
    4,000)."""
    from .alerts import WARMUP_STEPS

    lr_warmup = int((run.get("config") or {}).get("warmup") or 0)
    return max(WARMUP_STEPS, 2 * lr_warmup)


def stored_runs(directory=None) -> list[tuple]:
    """(file stem, name, run) of every run with monitor readings in the stored
    ``gpt2_*`` files of ``directory`` (default the book's results/)."""
    found = []
    for stem in stored_names("gpt2_", directory):
        record = load(stem, directory)
        runs = record.get("data", record).get("runs")
        for name, run in runs.items() if isinstance(runs, dict) else ():
            if run.get("monitor"):
                found.append((stem, name, run))
    return found


def alert_row(name: str, run: dict, kind: str, thresholds=None, **options) -> dict:
    """One run replayed through the alert rules (:func:`kernels.monitor.alerts.replay`):
    ``departed``, the step its loss exploded or first went non-finite (the run's
    ``summary.explosion_step``, None: never); ``first_alert``, ``first_rule`` and ``lead``
    (``departed − first_alert``) from the alerts before it; for a run that never departed,
    ``alerts`` (how many fired) and their ``rules``. ``false_alarms`` counts them on a
    ``healthy control`` only: an alert on a run that trained normally. Unless ``options``
    give ``early`` or ``warmup_steps``, the run's own level is taken after its learning-rate
    warmup (:func:`replay_warmup`)."""
    from .alerts import replay

    if "early" not in options and "warmup_steps" not in options:
        options = {**options, "warmup_steps": replay_warmup(run)}
    departed = run["summary"].get("explosion_step")
    fired = replay(run, thresholds, until=departed, **options)
    first = min(fired, key=lambda a: a.step) if fired else None
    never = departed is None
    return {
        "run": name,
        "kind": kind,
        "steps": int(run["summary"]["steps_done"]),
        "departed": departed,
        "first_alert": first.step if first else None,
        "first_rule": first.rule if first else None,
        "first_layer": first.layer if first else None,
        "lead": departed - first.step if first and not never else None,
        "alerts": len(fired) if never else 0,
        "rules": ",".join(sorted({a.rule for a in fired})) if never else "",
        "false_alarms": len(fired) if never and kind == "healthy control" else 0,
    }


def alert_table(runs=None, thresholds=None, **options):
    """One row (:func:`alert_row`) per stored GPT-2 run (:func:`stored_runs`, or
    ``runs``: (file, name, run) triples), its ``kind`` from :func:`run_kind`, ``long`` if
    it trained beyond :data:`LONG_STEPS`. A run stored in several files (the real-BF16
    runs, saved as they went on) is kept once, where it went furthest."""
    import pandas as pd

    furthest: dict = {}
    for stem, name, run in stored_runs() if runs is None else runs:
        old = furthest.get(name)
        if old is None or run["summary"]["steps_done"] > old[1]["summary"]["steps_done"]:
            furthest[name] = (stem, run)
    rows = []
    for name, (stem, run) in furthest.items():
        row = alert_row(name, run, run_kind(name, run), thresholds, **options)
        rows.append({"file": stem, **row, "long": row["steps"] > LONG_STEPS})
    return pd.DataFrame(rows)


def _group(row) -> str:
    gone = "departed" if row.departed is not None and row.departed == row.departed else "never"
    if row.kind == "healthy control":
        return "healthy controls, long" if row.long else "healthy controls"
    if row.kind == "runaway control":
        return "runaway controls, long" if row.long else "runaway controls"
    if row.kind == "FA2 kernel":
        return f"FA2 kernel, {gone}"
    if row.kind in OTHER_GROUPS:
        return OTHER_GROUPS[row.kind]
    if row.kind in ("failing path", "fix"):
        return f"{'failing paths' if row.kind == 'failing path' else 'fixes'}, {gone}"
    return "other"


OTHER_GROUPS = {
    "FA2 kernel's control": "FA2 kernel's control",
    "SDPA": "SDPA flash",
    "perturbed control": "control, δ biased or noised",
    "check": "DDP checks",
}


def _group_rank(group: str) -> tuple:
    """Where a group's row goes: failing paths, fixes and F controls first, then the other
    variants, the checks last."""
    order = ["failing paths", "fixes", "healthy controls", "runaway controls", "FA2 kernel"]
    order += [*OTHER_GROUPS.values(), "other"]
    first = next((i for i, name in enumerate(order) if group.startswith(name)), len(order))
    return first, group


def alert_summary(table) -> list[dict]:
    """:func:`alert_table` in at most a dozen rows, one per group (failing paths and fixes
    that departed or never did, healthy and runaway controls, long ones apart): how many
    runs, how many alerted (before departure, for a run that departed), the median and
    smallest lead, the rules of the alerts on runs that never departed."""
    groups: dict = {}
    for row in table.itertuples(index=False):
        groups.setdefault(_group(row), []).append(row)
    out = []
    for group, rows in sorted(groups.items(), key=lambda kv: _group_rank(kv[0])):
        alerted = [r for r in rows if r.first_alert == r.first_alert and r.first_alert is not None]
        leads = [int(r.lead) for r in alerted if r.lead == r.lead and r.lead is not None]
        rules = sorted({rule for r in rows for rule in r.rules.split(",") if rule})
        out.append(
            {
                "group": group,
                "runs": len(rows),
                "alerted": len(alerted),
                "lead_median": int(np.median(leads)) if leads else None,
                "lead_min": min(leads) if leads else None,
                "first_alert_min": min(int(r.first_alert) for r in alerted) if alerted else None,
                "rules": rules,
                "false_alarms": int(sum(r.false_alarms for r in rows)),
            }
        )
    return out


def own_growth(run: dict, early=None) -> float:
    """The largest ratio of a layer's largest |S| to its own median over the early window
    (as ``wq_growth`` in the replay: the second half of :func:`replay_warmup`, steps 500 to
    1,000 unless the run's learning-rate warmup is longer), after that window and before the
    run departed: ``max_logit`` in the relative form the thresholds could take (NaN: no
    early reading)."""
    from .alerts import run_readings

    warmup = replay_warmup(run)
    first, last = (warmup // 2, warmup) if early is None else early
    departed = run["summary"].get("explosion_step")
    by_layer: dict = {}
    for step, layer, readings in run_readings(run):
        by_layer.setdefault(layer, []).append((step, readings["max_logit"]))
    top = np.nan
    for series in by_layer.values():
        steps, logits = np.array(series, dtype=float).T
        level = logits[(steps >= first) & (steps <= last)]
        after = (steps > last) & (steps < (departed or np.inf))
        if len(level) and after.any():
            top = np.nanmax([top, np.nanmax(logits[after]) / np.median(level)])
    return float(top)


def summary_frame(summary):
    """:func:`alert_summary` as a printable table (a dash where a number does not apply)."""
    import pandas as pd

    def cell(value):
        return "–" if value is None else f"{value:,}" if isinstance(value, int) else value

    columns = {
        "group": "group",
        "runs": "runs",
        "alerted": "alerted",
        "lead_median": "median lead",
        "lead_min": "least lead",
        "first_alert_min": "first alert",
        "false_alarms": "false alarms",
    }
    rows = [{label: cell(row[key]) for key, label in columns.items()} for row in summary]
    return pd.DataFrame(rows)


def _first_alerts(table) -> dict:
    """The first alerts of the runaway controls, least and most, in three groups: the
    screen's (``m9_all_runaway``), the second testbed's long ones (``m9_all_long_tb``) and
    the long real-BF16 ones (``m9_all_long_real``). Raises on a runaway control in none."""
    runaway = table[table.kind == "runaway control"]
    groups = {
        "m9_all_runaway": ~runaway.long,
        "m9_all_long_tb": runaway.long & runaway.file.str.startswith("gpt2_testbed"),
        "m9_all_long_real": runaway.long & runaway.file.str.startswith("gpt2_bf16_real"),
    }
    if sum(int(mask.sum()) for mask in groups.values()) != len(runaway):
        raise ValueError("a runaway control is in none of the prose's three groups")
    out = {}
    for name, mask in groups.items():
        first = runaway.first_alert[mask].dropna()
        out |= {f"{name}_first_lo": int(first.min()), f"{name}_first_hi": int(first.max())}
    return out


def print_first_alerts(numbers: dict) -> None:
    """The first alerts the prose gives as ranges (least–most) and the largest |S| over its own
    early level, from :func:`alert_numbers`."""
    rows = {
        "the screen's runaway controls": "m9_all_runaway",
        "long real-BF16 controls": "m9_all_long_real",
        "the second testbed's long controls": "m9_all_long_tb",
        "FA2 kernel, departed": "m9_all_w",
    }
    print("first alert, least–most:")
    for label, key in rows.items():
        lo, hi = numbers[f"{key}_first_lo"], numbers[f"{key}_first_hi"]
        if lo is not None:
            print(f"  {label:36s}{lo:>7,}–{hi:,}")
    print(
        f"largest |S| ÷ own early level: long runaway controls {numbers['m9_all_growth_long']:.0f}"
        f" or more, healthy controls at most {numbers['m9_all_growth_healthy']:.1f}"
    )
    layers = ", ".join(str(layer) for layer in numbers["m9_all_av_layers"])
    print(
        f"SDPA flash runs: {numbers['m9_all_sdpa_long']} long (second testbed), "
        f"{numbers['m9_all_sdpa_short']} short (first search)\nfirst alerts of SDPA flash "
        f"and FA2's control: layer(s) {layers} (the rules read every layer)"
    )


def alert_numbers(table) -> dict:
    """The numbers chapter 9's prose glues from :func:`alert_table`: the failing runs that
    departed (``m9_all_failing``) and how many were flagged first, with the median and
    least lead, and the same of the fixes' runs that departed (``m9_all_fix``); the healthy
    controls, those that alerted and their false alarms and rules;
    the runaway controls (the screen's, the long ones'; the first alerts of each: the
    screen's, the second testbed's and the long real-BF16 ones apart); and the largest |S|
    over its own early level (:func:`own_growth`) of the healthy and the long controls."""
    from .alerts import WARMUP_STEPS

    groups = {row["group"]: row for row in alert_summary(table)}
    failing, healthy = groups["failing paths, departed"], groups["healthy controls"]
    fixes = groups["fixes, departed"]
    runaway, long = groups["runaway controls"], groups["runaway controls, long"]
    runs = {name: run for _, name, run in stored_runs()}
    is_healthy = (table.kind == "healthy control") & ~table.long
    growth = [own_growth(runs[name]) for name in table.run[is_healthy]]
    long_growth = [
        own_growth(runs[name]) for name in table.run[table.long & (table.kind == "runaway control")]
    ]
    return {
        "m9_all_runs": len(table),
        "m9_all_failing": failing["runs"],
        "m9_all_flagged": failing["alerted"],
        "m9_all_lead_median": failing["lead_median"],
        "m9_all_lead_min": failing["lead_min"],
        "m9_all_fix": fixes["runs"],
        "m9_all_fix_flagged": fixes["alerted"],
        "m9_all_fix_lead_min": fixes["lead_min"],
        "m9_all_healthy": healthy["runs"],
        "m9_all_false_runs": healthy["alerted"],
        "m9_all_false": healthy["false_alarms"],
        "m9_all_false_rules": " and ".join(healthy["rules"]),
        "m9_all_runaway": runaway["runs"],
        "m9_all_runaway_alerted": runaway["alerted"],
        "m9_all_long": long["runs"],
        "m9_all_long_first": long["first_alert_min"],
        **_first_alerts(table),
        "m9_all_growth_healthy": float(np.nanmax(growth)),
        "m9_all_growth_long": float(np.nanmin(long_growth)),
        "m9_all_warmup": WARMUP_STEPS,
        "m9_all_warmup_max": max(replay_warmup(runs[name]) for name in table.run),
        **_other_numbers(groups, table),
    }


def _other_numbers(groups: dict, table) -> dict:
    """The rows of the runs that are neither failing paths, fixes nor F controls, for the
    prose: the FA2 kernel's runs that departed, how many alerted, their first alert and
    least lead; the SDPA flash and FA2-control runs and the perturbed controls, how
    many and how many alerted, and the first alert of the latter. A group with no stored
    run gives 0 runs and None for its steps."""
    w = groups.get("FA2 kernel, departed", {})
    w_rows = table[(table.kind == "FA2 kernel") & table.departed.notna()]
    w_first = [int(step) for step in w_rows.first_alert.dropna()]
    av_kinds = ("SDPA", "FA2 kernel's control")  # the arms that never exploded
    av = [groups[OTHER_GROUPS[k]] for k in av_kinds if OTHER_GROUPS[k] in groups]
    bn = groups.get("control, δ biased or noised", {})
    av_rows = table[table.kind.isin(av_kinds)]
    sdpa = table[table.kind == "SDPA"]
    return {
        "m9_all_w": w.get("runs", 0),
        "m9_all_w_alerted": w.get("alerted", 0),
        "m9_all_w_lead_min": w.get("lead_min"),
        "m9_all_w_first_lo": min(w_first, default=None),
        "m9_all_w_first_hi": max(w_first, default=None),
        "m9_all_av": sum(g["runs"] for g in av),
        "m9_all_av_alerted": sum(g["alerted"] for g in av),
        "m9_all_av_layers": sorted({int(x) for x in av_rows.first_layer.dropna()}),
        "m9_all_sdpa_long": int(sdpa.long.sum()),
        "m9_all_sdpa_short": int((~sdpa.long).sum()),
        "m9_all_bn": bn.get("runs", 0),
        "m9_all_bn_alerted": bn.get("alerted", 0),
        "m9_all_bn_first": bn.get("first_alert_min"),
    }
