"""Reading the monitor: what a training step costs, and when a number should worry you.

* :func:`time_steps` times forward + backward passes of a model without the monitor,
  with it on steps it does not read and on steps it reads (in a random order each round,
  so a busy machine slows all three alike), and one ``monitor.step`` call alone.
* :func:`ceiling_and_lead` turns stored runs into a threshold: the largest value a
  metric took in runs that trained normally (the *ceiling*) and, for runs that failed,
  how many steps before the failure the metric first passed that ceiling (the *lead*).
* :func:`layer_table` combines the heads of a layer as the book's stored runs hold them.
* :func:`alert_table` replays every stored GPT-2 run through the alert rules: one row per
  run, its kind (by the variant letter of its name), where its loss departed, its first
  alert and lead, its false alarms; :func:`alert_summary` groups the rows.
"""

from __future__ import annotations

import random
import time

import numpy as np

from ..results import load, stored_names


def _one_step(model, loss_fn, before=None, sync=None):
    """Seconds for ``before()`` (a monitor.step call, if any) and a forward +
    backward, with ``sync()`` (e.g. torch.cuda.synchronize) before the clock starts and
    before it stops, so that queued GPU work is counted where it was issued."""
    model.zero_grad(set_to_none=True)
    if sync is not None:
        sync()
    start = time.perf_counter()
    if before is not None:
        before()
    loss_fn().backward()
    if sync is not None:
        sync()
    return time.perf_counter() - start


def _summary(values) -> dict:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return {"median": float(med), "iqr": float(q3 - q1)}


def time_steps(
    model, loss_fn, monitor, repeats: int = 20, warmup: int = 2, seed: int = 0, sync=None
) -> dict:
    """Seconds per forward + backward pass (``loss_fn()`` returns the loss of a fixed
    batch): ``off`` without calling the monitor, ``between`` with ``monitor.step`` on
    steps it does not read, ``reading`` on steps it reads; each round runs the three
    once, in a random order. Medians and interquartile ranges over ``repeats`` rounds;
    ``paired``: the same of ``between / off − 1`` within each round. ``call``: one
    ``monitor.step`` call on a step it does not read, timed alone (1,000 calls), which
    is all the monitor adds between reading steps: it leaves no hook there. ``sync``:
    called before and after each timed pass (pass ``torch.cuda.synchronize`` on a GPU,
    where work is queued and a clock alone measures only the launches)."""
    if repeats < 3:
        raise ValueError(f"need at least 3 repeats for a median and quartiles, got {repeats}")
    every = monitor.every
    if every < 2:
        raise ValueError("a monitor with every=1 reads every step: nothing to time between")
    rng = random.Random(seed)
    times = {"off": [], "between": [], "reading": []}
    for i in range(warmup + repeats):
        before = {
            "off": None,
            "between": lambda: monitor.step(every * i + 1),  # not read
            "reading": lambda: monitor.step(every * (i + 1)),
        }  # read
        kinds = list(times)
        rng.shuffle(kinds)
        got = {kind: _one_step(model, loss_fn, before[kind], sync) for kind in kinds}
        if i >= warmup:
            for kind, value in got.items():
                times[kind].append(value)
    monitor.step(every * (warmup + repeats) + 1)  # writes the last one
    calls = []
    for i in range(1000):
        start = time.perf_counter()
        monitor.step(every * i + 1)
        calls.append(time.perf_counter() - start)
    out = {kind: _summary(values) for kind, values in times.items()}
    out["call"] = _summary(calls)
    out["paired"] = _summary(np.array(times["between"]) / np.array(times["off"]) - 1)
    return out


def ceiling_and_lead(healthy, failing) -> dict:
    """``healthy``: (steps, values) series of runs that trained normally; ``failing``:
    (steps, values, failure step) of runs that failed. Returns the ceiling (the largest
    finite healthy value), how many failing runs passed it before they failed, and those
    leads in steps."""
    finite = [np.asarray(v, dtype=float) for _, v in healthy]
    finite = [v[np.isfinite(v)] for v in finite]
    if not any(len(v) for v in finite):
        raise ValueError("the healthy runs hold no finite value: no ceiling can be drawn")
    ceiling = float(max(v.max() for v in finite if len(v)))
    leads = []
    for steps, values, failed_at in failing:
        steps, values = np.asarray(steps), np.asarray(values, dtype=float)
        over = (values > ceiling) & (steps < failed_at)
        if over.any():
            leads.append(int(failed_at - steps[np.argmax(over)]))
    return {
        "ceiling": ceiling,
        "crossed": len(leads),
        "failing": len(failing),
        "lead_min": min(leads) if leads else None,
        "lead_max": max(leads) if leads else None,
        "leads": leads,
    }


# How a layer's heads combine into one number per layer, as the book's stored GPT-2 runs
# hold them: shares over all rows of the layer (every head has as many rows), the
# largest head's ‖W_Q‖ and logit, and δ errors summed over heads.
LAYER_RULES = {
    "ties_bf16": "mean",
    "p1_fa2": "mean",
    "wq_norm": "max",
    "max_logit": "max",
    "delta_err": "sum",
    "delta_abs": "sum",
}


def layer_table(rows):
    """One row per (step, layer), one column per metric, heads combined by
    :data:`LAYER_RULES` (NaN where any head's reading is NaN). ``rows``: a monitor, its
    rows, a table of them or a file path. The rows a resumed run wrote again after its
    resume row (:mod:`.sinks`) replace those it went back over. A (step, layer, head,
    metric) found more than once otherwise (a file appended to by a resumed run without
    a resume row) is kept once, its last value, with a warning."""
    import pandas as pd

    from .sinks import COLUMNS, read_rows

    if hasattr(rows, "rows"):
        rows = rows.rows
    if isinstance(rows, (str, bytes)) or hasattr(rows, "suffix"):
        rows = read_rows(rows)
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=list(COLUMNS))
    frame = _after_resumes(frame.reset_index(drop=True))
    key = ["step", "layer", "head", "metric"]
    repeated = frame.duplicated(key, keep="last")
    if repeated.any():
        steps = sorted(set(frame.step[repeated]))
        from .safety import warn_user

        warn_user(
            f"layer_table: {int(repeated.sum())} rows repeat a (step, layer, "
            f"head, metric) already read (steps {steps[:5]}"
            f"{' …' if len(steps) > 5 else ''}); each keeps its last value",
            UserWarning,
        )
        frame = frame[~repeated]
    tables = [
        _combine_heads(frame[frame.metric == metric], how).rename(metric)
        for metric, how in LAYER_RULES.items()
        if (frame.metric == metric).any()
    ]
    return pd.concat(tables, axis=1)


def _after_resumes(frame):
    """The rows a resumed run did not write again: each resume row (a run that went back to
    step s) drops the rows of steps >= s written before it, and itself."""
    from .sinks import RESUME

    is_resume = (frame.metric == RESUME).to_numpy()
    if not is_resume.any():
        return frame
    went_back_to = np.where(is_resume, frame.step.to_numpy(dtype=float), np.inf)
    later = np.minimum.accumulate(went_back_to[::-1])[::-1]  # the lowest resume after a row
    replaced = frame.step.to_numpy() >= later
    return frame[~(replaced | is_resume)]


def _combine_heads(rows, how: str):
    """One metric's rows combined per (step, layer) by ``how``; NaN where any head's value
    is NaN (pandas would skip it, and a sum of NaN heads would read 0.0)."""
    keys = [rows.step, rows.layer]
    combined = rows.value.groupby(keys).agg(how)
    return combined.mask(rows.value.isna().groupby(keys).any())


# ------------------------------------------------------------------ every stored run
FAILING_LETTERS = "URTLMGHX"  # the failing path and its variants (kernels.gpt2.runs)
FIX_LETTERS = "SPZCKD"  # the fixes
CONTROL_LETTER = "F"  # the control: δ from fp32 O
LONG_STEPS = 31_700  # the longest run the thresholds were drawn from (amp_final)
# The screen's rule of a healthy run (kernels.gpt2.screen; kernels.monitor may not import
# kernels.gpt2, and tests/monitor/test_alert_table.py checks that the two agree).
RUNAWAY_LOGIT, RUNAWAY_GROWTH, RUNAWAY_BASE = 100.0, 3.0, 2_000


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
    ``other`` (the rest: A W B N, the DDP checks, names without a letter). The letter, not
    the outcome, gives the kind: a failing path that never departed (a short run, a 7-bit
    one) stays a failing path."""
    parts = name.rsplit("-", 2)
    letter = parts[1] if len(parts) == 3 and len(parts[1]) == 1 else ""
    if letter and letter in FAILING_LETTERS:
        return "failing path"
    if letter and letter in FIX_LETTERS:
        return "fix"
    if letter == CONTROL_LETTER:
        return "runaway control" if runs_away(run) else "healthy control"
    return "other"


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
    ``healthy control`` only: an alert on a run that trained normally."""
    from .alerts import replay

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
    if row.kind == "other":
        return "other"
    return f"{'failing paths' if row.kind == 'failing path' else 'fixes'}, {gone}"


def alert_summary(table) -> list[dict]:
    """:func:`alert_table` in at most a dozen rows, one per group (failing paths and fixes
    that departed or never did, healthy and runaway controls, long ones apart): how many
    runs, how many alerted (before departure, for a run that departed), the median and
    smallest lead, the rules of the alerts on runs that never departed."""
    groups: dict = {}
    for row in table.itertuples(index=False):
        groups.setdefault(_group(row), []).append(row)
    out = []
    for group, rows in sorted(groups.items()):
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
    (steps 500 to 1,000, as ``wq_growth``), after that window and before the run departed:
    ``max_logit`` in the relative form the thresholds could take (NaN: no early reading)."""
    from .alerts import EARLY, run_readings

    first, last = EARLY if early is None else early
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


def alert_numbers(table) -> dict:
    """The numbers chapter 9's prose glues from :func:`alert_table`: the failing runs that
    departed (``m9_all_failing``) and how many were flagged first, with the median and
    least lead; the healthy controls, those that alerted and their false alarms and rules;
    the runaway controls (the screen's, the long ones'; the first alerts of each: the
    screen's, the second testbed's and the long real-BF16 ones apart); and the largest |S|
    over its own early level (:func:`own_growth`) of the healthy and the long controls."""
    from .alerts import WARMUP_STEPS

    groups = {row["group"]: row for row in alert_summary(table)}
    failing, healthy = groups["failing paths, departed"], groups["healthy controls"]
    runaway, long = groups["runaway controls"], groups["runaway controls, long"]
    runs = {name: run for _, name, run in stored_runs()}
    is_healthy = (table.kind == "healthy control") & ~table.long
    growth = [own_growth(runs[name]) for name in table.run[is_healthy]]
    long_growth = [
        own_growth(runs[name])
        for name in table.run[table.long & (table.kind.str.endswith("control"))]
    ]
    return {
        "m9_all_runs": len(table),
        "m9_all_failing": failing["runs"],
        "m9_all_flagged": failing["alerted"],
        "m9_all_lead_median": failing["lead_median"],
        "m9_all_lead_min": failing["lead_min"],
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
    }
