"""The testbed screen: a configuration of the small GPT-2 whose fp32-O control
(variant ``F``) stays healthy while the failing path (``U``) leaves it.

Plan ``screen`` of :mod:`.plans` trained U and F of four configurations for the first 20,000
steps of the paper's 80,000-step schedule (``results/gpt2_screen.json.gz``). The stored testbed's
real-BF16 pairs of seeds 0 and 1 (``results/gpt2_bf16_real_long*.json``, plan ``bf16_real``),
cut to the same 20,000 steps and the screen's checks every 200 steps, are the reference rows.

A control is *healthy* when its largest |S| (every layer, every check) stays below
:data:`MAX_LOGIT_LIMIT` and its largest per-head ‖W_Q‖₂ at the last check is less than
:data:`WQ_GROWTH_LIMIT` times its value at step :data:`BASE_STEP` (the end of the paper's warmup;
the testbed warms up over 200 steps, so it is 1,800 steps past its warmup there).
"""

from __future__ import annotations

import re

import numpy as np

from .plans import SCREEN_BASE
from .report import outcome
from .runs import load_search, monitor_series, parse_name, real_bf16_runs

SCREEN_STEPS = 20_000  # how long the screen trained; the reference runs are cut to this
SCREEN_EVERY = 200  # the screen's checks; the reference (checked every 100) is thinned to it
BASE_STEP = 2_000  # ‖W_Q‖ growth is measured from the check at this step
MAX_LOGIT_LIMIT = 100.0  # healthy: the largest |S| of every layer stays below this ...
WQ_GROWTH_LIMIT = 3.0  # ... and the largest head's ‖W_Q‖ grows less than this from BASE_STEP
REFERENCE = "testbed"  # the reference rows' configuration name (plan ``bf16_real``)
REFERENCE_SEEDS = ("s0", "s1")
# the stored files that hold the reference pairs (their provenance goes under the table)
REFERENCE_FILES = ("bf16_real_long", "bf16_real_long_control", "bf16_real_long_control_s0")


def first_steps(run: dict, steps: int = SCREEN_STEPS, every: int = SCREEN_EVERY) -> dict:
    """A copy of ``run`` cut to its steps before ``steps``: the checks at multiples of
    ``every``, the logged history and the steps done."""
    h = run["history"]
    keep = [i for i, s in enumerate(h["step"]) if s < steps]
    logged = lambda v: isinstance(v, list) and len(v) == len(h["step"])  # noqa: E731
    history = {k: [v[i] for i in keep] if logged(v) else v for k, v in h.items()}
    summary = dict(run["summary"], steps_done=min(run["summary"]["steps_done"], steps))
    checks = [m for m in run["monitor"] if m["step"] < steps and m["step"] % every == 0]
    return dict(run, history=history, monitor=checks, summary=summary)


def _checks(run: dict):
    """(steps, largest |S| per check and layer, largest per-head ‖W_Q‖₂ per check)."""
    steps = np.array([m["step"] for m in run["monitor"]])
    logit = lambda layer: np.nan if layer.get("max_logit") is None else layer["max_logit"]  # noqa: E731
    logits = np.array([[logit(s) for s in m["layers"]] for m in run["monitor"]], dtype=float)
    wq = np.array([max(max(heads) for heads in m["wq_norms"]) for m in run["monitor"]])
    return steps, logits, wq


def health(run: dict) -> dict:
    """The rule's numbers of one run: its largest |S| over every check and layer (and the
    layer), its largest per-head ‖W_Q‖₂ at the last check, that over its value at
    :data:`BASE_STEP`, and whether both stay under the limits (``healthy``)."""
    steps, logits, wq = _checks(run)
    at = int(np.nanargmax(logits))
    base = wq[np.searchsorted(steps, BASE_STEP)] if steps[-1] >= BASE_STEP else np.nan
    stats = {
        "max_logit": float(logits.flat[at]),
        "layer": at % logits.shape[1],
        "wq_end": float(wq[-1]),
        "wq_growth": float(wq[-1] / base),
        "last_check": int(steps[-1]),
    }
    stats["healthy"] = bool(
        stats["max_logit"] < MAX_LOGIT_LIMIT and stats["wq_growth"] < WQ_GROWTH_LIMIT
    )
    return stats


def rule_broken_at(run: dict) -> int | None:
    """The first check at which ``run`` breaks the rule: a layer's largest |S| at or
    over :data:`MAX_LOGIT_LIMIT`, or the largest head's ‖W_Q‖₂ at or over
    :data:`WQ_GROWTH_LIMIT` times its value at :data:`BASE_STEP` (None: never)."""
    steps, logits, wq = _checks(run)
    if steps[-1] < BASE_STEP:
        return None
    base = wq[np.searchsorted(steps, BASE_STEP)]
    broken = (np.nanmax(logits, axis=1) >= MAX_LOGIT_LIMIT) | (
        (steps >= BASE_STEP) & (wq >= WQ_GROWTH_LIMIT * base)
    )
    return int(steps[np.argmax(broken)]) if broken.any() else None


def print_reference_breaks(reference: dict) -> None:
    """When the testbed's controls broke the rule over their whole stored runs, seed by seed
    (the table cuts them to the screen's steps)."""
    for seed in REFERENCE_SEEDS:
        step, run = rule_broken_at(reference["F", seed]), reference["F", seed]
        when = f"at step {step:,}" if step is not None else "never"
        done = run["summary"]["steps_done"]
        print(f"the testbed's control, seed {seed[1:]}, {done:,} steps: broke the rule {when}")


def fate(run: dict) -> dict:
    """How the failing path ended: ``exploded`` (the step of its loss explosion or first NaN,
    None if neither), its largest |S| and last largest-head ‖W_Q‖₂, and ``words``: 'exploded
    at 14,420' (or 'went NaN at'), else 'survived: |S| 1.5e6, ‖W_Q‖ 90.3'."""
    ended, stats = outcome(run), health(run)
    words = f"survived: |S| {number(stats['max_logit'])}, ‖W_Q‖ {stats['wq_end']:.3g}"
    if ended["step"] is not None:
        verb = "exploded" if ended["event"] == "explosion" else "went NaN"
        words = f"{verb} at {ended['step']:,}"
    return dict(
        exploded=ended["step"], max_logit=stats["max_logit"], wq_end=stats["wq_end"], words=words
    )


def number(x: float) -> str:
    """A size in a few characters: 74.6, 222, 1.5e6, 5e-4 (three digits from 0.01 to 1,000,
    two above, one below)."""
    text = f"{x:.3g}" if 0.01 <= abs(x) < 1_000 else f"{x:.2g}" if x else "0"
    text = f"{x:.1e}".replace(".0e", "e") if 0 < abs(x) < 0.01 else text
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", text)


def what_changed(config: dict, base: dict = SCREEN_BASE) -> str:
    """What a run's configuration changed from the screen's base (the paper's schedule, lr
    1e-3, context 256, batch 64), in words."""
    words = []
    if config["lr"] != base["lr"]:
        words.append(f"lr {number(config['lr'])}")
    if config["block_size"] != base["block_size"]:
        words.append(f"context {config['block_size']}")
    if config["batch_size"] != base["batch_size"]:
        words.append(f"batch {config['batch_size']}")
    decay = config.get("decay_steps") or config["steps"]
    schedule = (config["warmup"], config["min_lr"], decay)
    if schedule != (base["warmup"], base["min_lr"], base["decay_steps"]):
        words.append(f"warmup {schedule[0]:,}, to {number(schedule[1])} over {decay // 1000}k")
    return ", ".join(words) or "none (the paper's)"


def screen_pairs(runs: dict, reference: dict | None = None) -> list[tuple]:
    """(configuration, seed, failing run, control run) of every U/F pair of the screen's
    ``runs`` (name -> run), configurations in the screen's order and seeds in order, then the
    reference pairs of ``reference`` ({(variant, seed): run}, :func:`real_bf16_runs`) cut by
    :func:`first_steps`."""
    found = [parse_name(name) for name in runs]
    order = list(dict.fromkeys(config for config, _, _ in found))
    pairs = [
        (config, seed, runs[f"{config}-U-{seed}"], runs[f"{config}-F-{seed}"])
        for config, variant, seed in sorted(found, key=lambda n: (order.index(n[0]), n[2]))
        if variant == "U" and f"{config}-F-{seed}" in runs
    ]
    for seed in REFERENCE_SEEDS if reference else ():
        if ("U", seed) in reference and ("F", seed) in reference:
            cut = [first_steps(reference[v, seed]) for v in "UF"]
            pairs.append((REFERENCE, seed, *cut))
    return pairs


def screen_rows(runs: dict, reference: dict | None = None) -> list[dict]:
    """One row per pair of :func:`screen_pairs`: what it changed, its control's
    :func:`health` (and verdict), the step at which each run of the pair broke the rule
    (:func:`rule_broken_at`, None: never) and the failing path's :func:`fate`."""
    rows = []
    for config, seed, failing, control in screen_pairs(runs, reference):
        stats, end = health(control), fate(failing)
        rows.append(
            {
                "config": config,
                "seed": int(seed[1:]),
                "changed": what_changed(control["config"]),
                "max_logit": stats["max_logit"],
                "layer": stats["layer"],
                "wq_end": stats["wq_end"],
                "wq_growth": stats["wq_growth"],
                "verdict": "healthy" if stats["healthy"] else "runs away",
                "broken_at": rule_broken_at(control),
                "failing_broken_at": rule_broken_at(failing),
                "exploded": end["exploded"],
                "failing_max_logit": end["max_logit"],
                "failing_wq_end": end["wq_end"],
                "failing_path": end["words"],
            }
        )
    return rows


def screen_table(runs: dict | None = None, reference: dict | None = None):
    """:func:`screen_rows` as a pandas table; by default the stored screen and the stored
    testbed's reference pairs."""
    import pandas as pd

    if runs is None:
        runs = load_search("screen")["data"]["runs"]
    if reference is None:
        reference = real_bf16_runs()
    table = pd.DataFrame(screen_rows(runs, reference))
    steps = ["exploded", "broken_at", "failing_broken_at"]  # steps, or <NA>: never
    return table.astype(dict.fromkeys(steps, "Int64")) if len(table) else table


def as_text(table) -> str:
    """:func:`screen_table` printed for the page's column: the control's numbers and verdict,
    then the failing path's end, one line per pair, columns two spaces apart; "broke": the step
    at which the run broke the screen's rule (— never). A pair is named in the page's words, what
    its configuration changed and its seed (not the run's file name)."""
    changed, seeds = list(table.changed), [str(x) for x in table.seed]
    control = [
        ("changed", changed, "<"),
        ("seed", seeds, ">"),
        ("max |S|", [number(x) for x in table.max_logit], ">"),
        ("layer", [str(x) for x in table.layer], ">"),
        ("‖W_Q‖", [f"{x:.3g}" for x in table.wq_end], ">"),
        ("growth", [f"{x:.3g}×" for x in table.wq_growth], ">"),
        ("broke", _steps(table.broken_at), ">"),
        ("verdict", list(table.verdict), "<"),
    ]
    failing = [
        ("changed", changed, "<"),
        ("seed", seeds, ">"),
        ("broke", _steps(table.failing_broken_at), ">"),
        ("failing path (δ from the rounded O)", list(table.failing_path), "<"),
    ]
    return "\n\n".join(_columns(block) for block in (control, failing))


def _steps(steps) -> list[str]:
    """Steps as '11,200', a missing one (never) as '—'."""
    import pandas as pd

    return ["—" if pd.isna(x) else f"{x:,}" for x in steps]


def _columns(columns) -> str:
    widths = [max(len(head), *map(len, cells)) for head, cells, _ in columns]
    lines = [[head for head, _, _ in columns], *zip(*(cells for _, cells, _ in columns))]
    aligns = [align for _, _, align in columns]
    return "\n".join(
        "  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(line, aligns, widths)).rstrip()
        for line in lines
    )


def layer0_logits(runs: dict, config: str, seed: str) -> dict:
    """{'U': (steps, values), 'F': (steps, values)}: layer 0's largest |S| at every check of
    the failing run and the control of ``config`` and ``seed`` ('s1') in ``runs``."""
    return {v: monitor_series(runs[f"{config}-{v}-{seed}"], "max_logit", 0) for v in "UF"}


def page_numbers(table, screened: dict, reference: dict) -> dict:
    """Every number the appendix's prose states about the screen, by glue name, computed from
    :func:`screen_table`, the stored screen (``screened``: its record with provenance) and the
    reference runs. Raises if the data no longer say what the prose
    says (lr 5e-4 the one healthy configuration; the others' largest |S| in layer 0)."""
    shown = table[table.config != REFERENCE]
    ref = table[table.config == REFERENCE]
    ok = shown[shown.verdict == "healthy"]
    away = shown[shown.verdict != "healthy"]
    paper = shown[shown.config == "sa-paper"]
    if list(ok.config) != ["sb-lr5e-4"]:
        raise ValueError(f"the prose names lr 5e-4 as the healthy one, the data: {list(ok.config)}")
    if not (away.layer == 0).all():
        raise ValueError("the prose says the runaway controls' largest |S| is layer 0's")
    if not (ref.exploded.isna().all() and ref.failing_broken_at.notna().all()):
        raise ValueError("the prose says the testbed's failing paths broke the rule unexploded")
    sb = ok.iloc[0]
    runs = screened["data"]["runs"]
    config = runs["sa-paper-F-s1"]["config"]
    breaks = {seed: rule_broken_at(reference["F", seed]) for seed in REFERENCE_SEEDS}
    numbers = {
        "warmup": config["warmup"],
        "decay": config["decay_steps"],
        "steps": SCREEN_STEPS,
        "every": SCREEN_EVERY,
        "gpus": screened["provenance"]["gpu_count"],
        "limit_logit": MAX_LOGIT_LIMIT,
        "limit_growth": WQ_GROWTH_LIMIT,
        "base": BASE_STEP,
        **{f"ref_break_{seed}": step for seed, step in breaks.items()},
        "ref_break_lo": min(breaks.values()),
        "ok_l0": float(layer0_logits(runs, "sb-lr5e-4", "s1")["F"][1].max()),
        "away_lo": away.max_logit.min() / 1e3,
        "away_hi": away.max_logit.max() / 1e3,
        "configs": shown.config.nunique(),
        "healthy": ok.config.nunique(),
        "paper_boom": int(paper.exploded.notna().sum()),
        "paper_seeds": len(paper),
        "boom": int(shown.exploded.notna().sum()),
        "pairs": len(shown),
        "boom_lo": shown.exploded.min(),
        "boom_hi": shown.exploded.max(),
        "away_growth_lo": away.wq_growth.min(),
        "away_growth_hi": away.wq_growth.max(),
        "ok_logit": sb.max_logit,
        "ok_layer": sb.layer,
        "ok_growth": sb.wq_growth,
        "ok_u_logit": sb.failing_max_logit / 1e6,
        "ok_u_wq": sb.failing_wq_end,
        "ok_u_break": sb.failing_broken_at,
        "ref_logit": ref.max_logit.max(),
        "ref_growth_lo": ref.wq_growth.min(),
        "ref_growth_hi": ref.wq_growth.max(),
        "later": int((away.broken_at > away.failing_broken_at).sum()),
        "away": len(away),
    }
    return {f"a_scr_{name}": _plain(value) for name, value in numbers.items()}


def _plain(value):
    """A pandas/NumPy scalar as the Python number it holds (glue formats read those)."""
    return value.item() if hasattr(value, "item") else value
