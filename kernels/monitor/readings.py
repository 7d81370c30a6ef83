"""Reading the monitor: what a training step costs, and when a number should worry you.

* :func:`time_steps` times forward + backward passes of a model without the monitor,
  with it on steps it does not read and on steps it reads (in a random order each round,
  so a busy machine slows all three alike), and one ``monitor.step`` call alone.
* :func:`ceiling_and_lead` turns stored runs into a threshold: the largest value a
  metric took in runs that trained normally (the *ceiling*) and, for runs that failed,
  how many steps before the failure the metric first passed that ceiling (the *lead*).
* :func:`layer_table` combines the heads of a layer as the book's stored runs hold them.

The replay of every stored GPT-2 run through the alert rules is :mod:`.stored_alerts`.
"""

from __future__ import annotations

import random
import time

import numpy as np


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
