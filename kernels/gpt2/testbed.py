"""The testbed's arms in real BF16 (plan ``testbed``): which attention's training exploded, when,
and how each layer's and head's ‖W_Q‖ grew on the way.

The testbed is the screen's configuration whose control stayed healthy for 20,000 steps (lr 5e-4,
the paper's schedule over 80,000 steps, :mod:`.screen`). Its runs live in several files, because a
machine lends its disk only while it is held: ``gpt2_testbed*.json``, plus the screen's own two
runs of that configuration (``gpt2_screen.json.gz``, the first 20,000 steps of the same training). A
run stored twice with the same name is a *repeat*: the same command started again from step 0 (GPU
training here is not deterministic, so a repeat is a second sample, not a copy).

Survival in the statistician's sense: a run that ends without exploding is *censored* at its last
step (we know only that it survived that long), and the Kaplan–Meier estimate counts it among the
runs at risk until then.
"""

from __future__ import annotations

import textwrap

import numpy as np

from .. import results
from ..results import load
from .plans import plan
from .report import outcome
from .runs import FONT, VARIANT_COLOURS, describe_files, last_loss, monitor_series, parse_name
from .screen import (
    MAX_LOGIT_LIMIT as LIMIT,  # |S| at or above it: the runaway has begun
    SCREEN_STEPS,
)

ARMS = "UWVAFPZS"  # the testbed's arms, in the order tables and legends list them
ARM_WORDS = {
    "W": "FA2 numerics (Triton)",
    "V": "FA2 numerics, fp32-O δ",
    "A": "SDPA flash",
    "U": "all-BF16 path",
    "F": "control",
    "P": "δ from rowsum(dP∘P)",
    "Z": "released fix",
    "S": "offset rule, no clamp",
}
SCREEN_RUNS = {"sb-lr5e-4-U-s1": "U-s1", "sb-lr5e-4-F-s1": "F-s1"}  # the screen's testbed runs
UNTRAINED_KEYS = ("steps", "monitor_every", "checkpoint_every")  # how long, how often watched


def same_training(run: dict, planned: dict) -> bool:
    """Whether ``run`` trained as the plan's run ``planned`` (its configuration: every setting
    but how long it ran and how often it was checked)."""
    return all(run["config"].get(k) == v for k, v in planned.items() if k not in UNTRAINED_KEYS)


def stored_names(directory=None) -> list[str]:
    """The names :func:`.runs.load_search` opens the testbed's result files by ('testbed_U')."""
    return [stem.removeprefix("gpt2_") for stem in results.stored_names("gpt2_testbed", directory)]


def describe_stored(directory=None, width: int = 80) -> str:
    """Where the testbed's stored files were measured (:func:`.runs.describe_files`)."""
    return describe_files("gpt2_testbed", "testbed", directory, width)


def wq_ratio_line(runs: dict, arm: str = "W", other: str = "A") -> str:
    """The per-seed ratios behind chapter 7's ‖W_Q‖ comparison, as one printed line."""
    ratios = wq_ratios(runs, arm, other, COMPARE_STEP)
    shown = ", ".join(f"{r:.1f}" for r in ratios)
    text = (
        f"layer-0 ‖W_Q‖ at step {COMPARE_STEP:,}, {ARM_WORDS[arm]} / {ARM_WORDS[other]}, "
        f"seed by seed: {shown}"
    )
    return textwrap.fill(text, 88, subsequent_indent="  ")


def repeat_line(runs: dict, arm: str, width: int = 88) -> str:
    """The repeats of ``arm`` (a seed's command started again from step 0) and how each ended,
    as one printed line ('' when the arm has none)."""
    repeats = arm_repeats(runs, arm)
    if not repeats:
        return ""
    shown = ", ".join(f"seed {s[1:]} {'exploded at' if b else 'alive at'} {t:,}"
                      for s, t, b in repeats)  # fmt: skip
    return textwrap.fill(f"{ARM_WORDS[arm]}, repeats: {shown}", width, subsequent_indent="  ")


def testbed_runs(directory=None) -> dict:
    """Every stored run of the testbed as {'W-s1': [run, ...]}: the longest first, then its
    repeats. The screen's two runs of this configuration count (its U and F in seed 1, cut at
    20,000 steps) once their training settings are checked to be the testbed's."""
    found: dict = {}
    for stem in results.stored_names("gpt2_testbed", directory):
        for name, run in load(stem, directory)["data"]["runs"].items():
            _, variant, seed = parse_name(name)
            found.setdefault(f"{variant}-{seed}", []).append(run)
    planned = dict(plan("testbed"))
    screen = load("gpt2_screen", directory)["data"]["runs"]
    for name, key in SCREEN_RUNS.items():
        if not same_training(screen[name], planned[f"tb-{key}"]):
            raise ValueError(f"{name} was not trained like the testbed's tb-{key}")
        found.setdefault(key, []).append(screen[name])
    for key in found:
        found[key].sort(key=lambda r: -r["summary"]["steps_done"])
    return found


def ending(run: dict) -> tuple[int, bool]:
    """(last step, exploded?): the explosion's or first NaN's step, else the last (censored)."""
    ended = outcome(run)
    if ended["step"] is not None:
        return int(ended["step"]), True
    return int(run["summary"]["steps_done"]), False


COMPARE_STEP = 30_000  # after every runaway began, before any W run exploded


def wq_at(run: dict, step: int, layer: int = 0) -> float:
    """Layer ``layer``'s largest-head ‖W_Q‖₂ at the last monitor reading at or before
    ``step``."""
    steps, norms = monitor_series(run, "wq", layer)
    if not len(steps) or steps[0] > step:
        raise ValueError(f"no ‖W_Q‖ reading at or before step {step:,}")
    return float(norms[steps <= step][-1])


def wq_ratios(runs: dict, arm: str, other: str, step: int) -> list[float]:
    """Seed by seed (seeds with both arms' longest runs reaching ``step``), ``arm``'s layer-0
    ‖W_Q‖ over ``other``'s at ``step``."""
    ratios = []
    for key in sorted(k for k in runs if k.split("-")[0] == arm):
        seed = key.split("-")[1]
        pair = runs[key][0], runs.get(f"{other}-{seed}", [None])[0]
        if pair[1] is not None and all(r["summary"]["steps_done"] >= step for r in pair):
            ratios.append(wq_at(pair[0], step) / wq_at(pair[1], step))
    if not ratios:
        raise ValueError(f"no seed has both {arm} and {other} at step {step:,}")
    return ratios


def _arm_rows(runs: dict, arm: str, which: slice) -> list[tuple[str, int, bool]]:
    """(seed, last step, exploded?) of ``which`` of each seed's runs of ``arm``, longest first."""
    keys = sorted(k for k in runs if k.split("-")[0] == arm)
    return [(key.split("-")[1], *ending(run)) for key in keys for run in runs[key][which]]


def arm_endings(runs: dict, arm: str, repeats: bool = False) -> list[tuple[str, int, bool]]:
    """(seed, last step, exploded?) of each seed of ``arm`` (its longest run; ``repeats``: every
    run, repeats too)."""
    return _arm_rows(runs, arm, slice(None) if repeats else slice(1))


def arm_repeats(runs: dict, arm: str) -> list[tuple[str, int, bool]]:
    """:func:`arm_endings` of ``arm``'s repeats: every stored run of a seed but its longest."""
    return _arm_rows(runs, arm, slice(1, None))


def kaplan_meier(endings) -> tuple[np.ndarray, np.ndarray]:
    """The Kaplan–Meier estimate of the share of runs not yet exploded, from (last step,
    exploded?) pairs: steps [0, t₁, t₂, ...] at each explosion and the share just after it."""
    endings = sorted(endings, key=lambda e: (e[0], not e[1]))  # at one step, explosions first
    at_risk, share = len(endings), 1.0
    steps, shares = [0], [1.0]
    for step, exploded in endings:
        if exploded:
            share *= 1 - 1 / at_risk
            steps.append(step)
            shares.append(share)
        at_risk -= 1
    return np.array(steps), np.array(shares)


def survival_table(runs: dict, arms: str = ARMS):
    """One row per arm with a stored run: seeds, explosions, and each seed's last step as
    'seed: step', marked '×' where it exploded (the others were last seen alive there:
    censored)."""
    import pandas as pd

    endings = {arm: arm_endings(runs, arm) for arm in arms}
    endings = {arm: ends for arm, ends in endings.items() if ends}  # arms with a stored run
    cells = {
        arm: {int(seed[1:]): f"{seed[1:]}: {step:,}{'×' if x else ''}" for seed, step, x in ends}
        for arm, ends in endings.items()
    }
    # each seed in a slot of its own, one width for all, so that the columns line up
    seeds = sorted({seed for by_seed in cells.values() for seed in by_seed})
    width = max((len(cell) for by_seed in cells.values() for cell in by_seed.values()), default=0)
    rows = []
    for arm, ends in endings.items():
        slots = [cells[arm].get(seed, "").ljust(width) for seed in seeds]
        rows.append(
            {
                "arm": ARM_WORDS[arm],
                "seeds": len(ends),
                "exploded": sum(exploded for _, _, exploded in ends),
                "seed: last step (× exploded)": "  " + "  ".join(slots),
            }
        )
    return pd.DataFrame(rows)


def first_testbed_endings(arms: str = "UFPZ") -> dict:
    """{arm: [(seed, last step, exploded?)]} of the first testbed's long real-BF16 runs (lr 1e-3,
    a 60,000-step schedule, then its final learning rate: :func:`.runs.real_bf16_runs`)."""
    from .runs import real_bf16_runs

    found: dict = {}
    for (arm, seed), run in sorted(real_bf16_runs().items()):
        if arm in arms:
            found.setdefault(arm, []).append((seed, *ending(run)))
    return {arm: found[arm] for arm in arms if arm in found}


def runaway_begins(run: dict, layer: int = 0, limit: float = LIMIT) -> int | None:
    """The first check at which layer ``layer``'s largest |S| reaches ``limit`` (None: never)."""
    steps, logits = monitor_series(run, "max_logit", layer)
    over = steps[logits >= limit]
    return int(over[0]) if len(over) else None


def plot_survival(ax, endings_by_label: dict, colours: dict, title: str):
    """Kaplan–Meier curves, one per label, with a '|' where a run was censored."""
    last = 0
    widths = np.linspace(5, 2, len(endings_by_label))  # wider first: lines that coincide show
    for width, (label, endings) in zip(widths, endings_by_label.items()):
        pairs = [(step, exploded) for _, step, exploded in endings]
        steps, shares = kaplan_meier(pairs)
        end = max(step for step, _ in pairs)
        last = max(last, end)
        x = np.append(steps, end) / 1000
        y = np.append(shares, shares[-1])
        ax.step(x, y, where="post", color=colours[label], lw=width, label=label)
        for step, exploded in pairs:
            if not exploded:
                alive = shares[np.searchsorted(steps, step, side="right") - 1]
                ax.plot(step / 1000, alive, "|", color=colours[label], ms=12, mew=2)
    ax.set(xlim=(0, last / 1000 * 1.04), ylim=(-0.04, 1.06), title=title)
    ax.set_xlabel("training step (thousands)", fontsize=FONT + 1)
    ax.set_ylabel("share of seeds not exploded", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    ax.title.set_fontsize(FONT + 1)
    ax.grid(alpha=0.3)


# the head-norm figure's column titles, two short lines each
COLUMN_TITLES = {
    "W": "FA2 numerics\n(Triton)",
    "V": "FA2 numerics,\nδ from fp32 O",
    "A": "SDPA flash\n(torch)",
    "F": "control\n(all-BF16 path)",
}


def plot_head_norms(fig, runs: dict, arms: str = "WVAF", seed: str = "s1"):
    """The paper's Figures 3 and 11 for the testbed: top row, each head of layer 0; bottom row,
    the largest head of each layer; one column per arm (``seed``); the explosion marked."""
    axes = fig.subplots(2, len(arms), sharex=True, sharey="row", squeeze=False)
    shades = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]
    for col, arm in enumerate(arms):
        run = runs[f"{arm}-{seed}"][0]
        steps = np.array([m["step"] for m in run["monitor"]]) / 1000
        norms = np.array([m["wq_norms"] for m in run["monitor"]])  # (check, layer, head)
        for head in range(norms.shape[2]):
            axes[0, col].plot(steps, norms[:, 0, head], color=shades[head], label=f"head {head}")
        for layer in range(norms.shape[1]):
            axes[1, col].plot(
                steps, norms[:, layer].max(1), color=shades[layer], label=f"layer {layer}"
            )
        step, exploded = ending(run)
        for ax in axes[:, col]:
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=FONT)
            if exploded:
                ax.axvline(step / 1000, color="k", ls=":", lw=1.2)
        axes[0, col].set_title(COLUMN_TITLES.get(arm, ARM_WORDS[arm]), fontsize=FONT)
        axes[1, col].set_xlabel("step (thousands)", fontsize=FONT + 1)
    axes[0, 0].set_ylabel("layer 0: ‖W_Q‖₂ per head", fontsize=FONT + 1)
    axes[1, 0].set_ylabel("largest head's ‖W_Q‖₂", fontsize=FONT + 1)
    quiet = arms.index("V") if "V" in arms else -1  # the column whose curves stay low
    axes[0, quiet].legend(fontsize=FONT, loc="upper left")
    axes[1, quiet].legend(fontsize=FONT, loc="upper left")
    return axes


def print_runaway_starts(numbers: dict, arms: str = ARMS) -> None:
    """Per arm: from which step layer 0's largest |S| reached :data:`LIMIT`, in how many runs."""
    for arm in arms:
        if not numbers[f"g7_tb_{arm}_reached"]:
            if numbers[f"g7_tb_{arm}_runs"]:
                all_boom = numbers[f"g7_tb_{arm}_boom"] == numbers[f"g7_tb_{arm}_seeds"]
                until = "until its loss exploded" if all_boom else "throughout"
                top = numbers.get(f"g7_tb_{arm}_logit")  # its largest, where computed
                bound = f"at most {top:.1f}" if top else f"< {LIMIT:.0f}"
                print(f"{ARM_WORDS[arm]:22s} layer 0's |S| {bound} {until}")
            continue
        lo, hi = numbers[f"g7_tb_{arm}_begin_lo"], numbers[f"g7_tb_{arm}_begin_hi"]
        reached, count = numbers[f"g7_tb_{arm}_reached"], numbers[f"g7_tb_{arm}_runs"]
        span = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
        runs = f"{reached} of {count} run{'s' if count > 1 else ''}"
        print(f"{ARM_WORDS[arm]:22s} layer 0's |S| ≥ {LIMIT:.0f} from step {span} ({runs})")


def end_loss_line(numbers: dict, arms: str = ARMS) -> str:
    """Each arm's loss over the last 500 steps of its whole-schedule runs (if any), as a line."""
    parts = []
    for a in arms:
        lo, hi, full = (numbers[f"g7_tb_{a}_{k}"] for k in ("end_lo", "end_hi", "full"))
        if full:
            span = f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}–{hi:.3f}"
            parts.append(f"{ARM_WORDS[a]} {span} ({full} run{'s' * (full > 1)})")
    text = f"loss over the last 500 of {numbers['g7_tb_steps']:,} steps: " + "; ".join(parts)
    return textwrap.fill(text, 88, subsequent_indent="  ")


def testbed_numbers(runs: dict) -> dict:
    """The numbers chapter 7's testbed section states, under their glue names."""
    numbers = {}
    for arm in ARMS:
        endings = arm_endings(runs, arm)
        boom = [step for _, step, exploded in endings if exploded]
        alive = [step for _, step, exploded in endings if not exploded]
        begins = [runaway_begins(run) for key in runs if key[0] == arm for run in runs[key]]
        begins = [b for b in begins if b is not None]
        numbers[f"g7_tb_{arm}_seeds"] = len(endings)
        numbers[f"g7_tb_{arm}_boom"] = len(boom)
        numbers[f"g7_tb_{arm}_boom_lo"] = min(boom) if boom else 0
        numbers[f"g7_tb_{arm}_boom_hi"] = max(boom) if boom else 0
        numbers[f"g7_tb_{arm}_alive_lo"] = min(alive) if alive else 0
        numbers[f"g7_tb_{arm}_runs"] = sum(len(runs[key]) for key in runs if key[0] == arm)
        numbers[f"g7_tb_{arm}_reached"] = len(begins)  # runs whose layer 0 reached LIMIT
        numbers[f"g7_tb_{arm}_begin_lo"] = min(begins) if begins else 0
        numbers[f"g7_tb_{arm}_begin_hi"] = max(begins) if begins else 0
    numbers["g7_screen_steps"] = SCREEN_STEPS  # how long the screen watched the control
    planned = dict(plan("testbed"))["tb-A-s1"]["steps"]
    numbers["g7_tb_steps"] = planned  # the schedule's length
    for arm in ARMS:  # seeds trained to the schedule's end, and their last losses
        whole = [runs[key][0] for key in runs if key[0] == arm]
        whole = [r for r in whole if r["summary"]["steps_done"] >= planned and not ending(r)[1]]
        ends = [last_loss(r) for r in whole]
        numbers[f"g7_tb_{arm}_full"] = len(whole)
        # seeds stopped early without exploding (censored before the schedule's end)
        numbers[f"g7_tb_{arm}_short"] = (
            numbers[f"g7_tb_{arm}_seeds"] - len(whole) - numbers[f"g7_tb_{arm}_boom"]
        )
        numbers[f"g7_tb_{arm}_end_lo"] = min(ends, default=0.0)
        numbers[f"g7_tb_{arm}_end_hi"] = max(ends, default=0.0)
    numbers["g7_tb_wa_step"] = COMPARE_STEP
    for other, name in (("A", "wa"), ("V", "wv")):  # how much faster W's runaway went
        if any(k[0] == "W" for k in runs) and any(k[0] == other for k in runs):
            ratios = wq_ratios(runs, "W", other, COMPARE_STEP)
            numbers[f"g7_tb_{name}_lo"], numbers[f"g7_tb_{name}_hi"] = min(ratios), max(ratios)
    for arm in ARMS:  # repeats: runs beyond each seed's longest, and how many exploded
        repeats = arm_repeats(runs, arm)
        numbers[f"g7_tb_{arm}_rep"] = len(repeats)
        numbers[f"g7_tb_{arm}_rep_boom"] = sum(exploded for *_, exploded in repeats)
    for arm in "AFV":  # the largest layer-0 |S| of the arms that did not explode
        longest = [runs[key][0] for key in runs if key[0] == arm]
        logits = [float(monitor_series(r, "max_logit", 0)[1].max()) for r in longest]
        numbers[f"g7_tb_{arm}_logit"] = max(logits, default=0.0)
    return numbers


# Each arm of the second testbed against the control that takes δ from an fp32 O and otherwise
# computes as it does, seed by seed where both are stored: the all-BF16 path against its control;
# FA2 numerics against its own control (the book's kernel); SDPA flash against that control too,
# the nearest there is (FA2 numerics, but another kernel)
TESTBED_CONTROLS = {"U": "F", "W": "V", "A": "V"}
TESTBED_PAIRS = tuple(
    (f"tb-{arm}-s{seed}", f"tb-{control}-s{seed}")
    for arm, control in TESTBED_CONTROLS.items()
    for seed in (1, 2, 3, 4)
)


def long_pairs(real: dict, runs: dict) -> tuple[dict, tuple]:
    """Every long real-BF16 pair (failing run, its control): the first testbed's
    (:data:`.report.REAL_BF16_PAIRS`) and this one's (:data:`TESTBED_PAIRS`), as ({name: run},
    pairs) for :func:`.report.departure_table`."""
    from .report import REAL_BF16_PAIRS

    named = {f"bf16-{arm}-{seed}": run for (arm, seed), run in real.items()}
    named.update({f"tb-{key}": stored[0] for key, stored in runs.items()})
    pairs = tuple(pair for pair in REAL_BF16_PAIRS + TESTBED_PAIRS if set(pair) <= set(named))
    return named, pairs


def pair_label(name: str, run: dict) -> str:
    """A failing run of a departure table in words: the amplified and first-testbed runs as
    :func:`.runs.run_label` says them (chapter 7's earlier seed-0 BF16 run marked so, as section 2
    names it), this testbed's by arm ('SDPA flash, seed 1, lr 5e-4')."""
    from .report import EARLIER_BF16
    from .runs import run_label

    config, arm, seed = parse_name(name)
    if config != "tb":
        earlier = ", earlier run" if name in EARLIER_BF16.values() else ""
        return run_label(name, run, schedule=True) + earlier
    return f"{ARM_WORDS[arm]}, seed {seed[1:]}, lr 5e-4"


def legend_name(arm: str) -> str:
    """An arm's name in a legend: :data:`ARM_WORDS`, with SDPA's kernel and the rule's β."""
    named_here = {"A": "SDPA flash (torch)", "S": "offset rule (β = 2), no clamp"}
    return named_here.get(arm, ARM_WORDS[arm])


def testbed_colours() -> dict:
    """Each arm's colour, keyed by its name in a legend (:func:`legend_name`)."""
    return {legend_name(arm): VARIANT_COLOURS[arm] for arm in ARMS}


def plot_survival_panels(fig, runs: dict):
    """Two Kaplan–Meier panels: this testbed's arms (the failing path, FA2 numerics, SDPA flash,
    the control, and the three fixes where stored) and the first testbed's (the failing path, the
    control, δ from rowsum(dP∘P), the released fix), with one legend for both under them."""
    axes = fig.subplots(1, 2, sharey=True)
    colours = testbed_colours()
    here = {legend_name(a): arm_endings(runs, a) for a in "VFPZAWUS"}
    here = {label: endings for label, endings in here.items() if endings}
    first = {legend_name(a): e for a, e in first_testbed_endings("FZPU").items()}
    plot_survival(axes[0], here, colours, "this testbed (lr 5e-4)")
    plot_survival(axes[1], first, colours, "first testbed (lr 1e-3)")
    axes[1].set_ylabel("")
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=2, fontsize=FONT)
    return axes
