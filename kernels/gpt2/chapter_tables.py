"""The printed tables and glued numbers of chapter 7's sections 2–6 (real BF16, repeated maxima,
the magnified failure, the isolation ladder, the two ingredients). Each function prints what the
chapter's cell showed and returns the numbers its prose glues, ``{glue name: value}``; the
chapter's cells keep the calls and the figures. Sections 7–8 are in :mod:`.chapter_fixes`.
"""

from __future__ import annotations

import textwrap

import numpy as np

from . import report
from .plans import run_name
from .report import VARIANT_NAMES, monitor_series, outcome


def real_bf16_lines(lines: dict) -> None:
    """One line per long real-BF16 run ({label: run}): steps, when layer 0's ‖W_Q‖ doubled, and
    the explosion."""
    for label, run in lines.items():
        o, left = outcome(run), report.runaway_step(run)
        doubled = f"at {left:,}" if left else "never"
        ended = f"exploded at {o['step']:,}" if o["step"] else "no explosion"
        print(f"{label:34s} {o['steps']:6,} steps; ‖W_Q‖ ×2 {doubled}; {ended}")


def wq_at(run: dict, step: int, layer: int = 0) -> float:
    """Layer ``layer``'s ‖W_Q‖₂ (largest head) at the first check at or after ``step``."""
    steps, wq = monitor_series(run, "wq", layer)
    return float(wq[np.searchsorted(steps, step)])


def spread_numbers(level: dict) -> dict:
    """How far the four attentions' ‖W_Q‖ lie apart ({variant: [seed 0, seed 1]}): the spread of
    the failing path, the control and δ from rowsum(dP∘P) (%), and how far the released fix sits
    above their mean in each seed (%, lowest and highest)."""
    others = np.array([level[v] for v in "UFP"])  # (variant, seed)
    above = np.array(level["Z"]) / others.mean(0) - 1
    return {
        "g7_spread": 100 * (others.max() / others.min() - 1),
        "g7_z_lo": 100 * above.min(),
        "g7_z_hi": 100 * above.max(),
    }


def four_attentions(four_runs: dict, at: int = 7_200) -> dict:
    """Layer 0's ‖W_Q‖ of the four attentions in both seeds of the 8,000-step runs, at ``at``."""
    print(f"layer 0, ‖W_Q‖₂ of the largest head at step {at:,}")
    print(f"{'':44s}{'seed 0':>8s}{'seed 1':>8s}")
    level = {}
    for variant in "UFPZ":
        level[variant] = [wq_at(four_runs[f"bf16-{variant}-s{seed}"], at) for seed in (0, 1)]
        print(f"{VARIANT_NAMES[variant]:44s}{level[variant][0]:8.2f}{level[variant][1]:8.2f}")
    return spread_numbers(level)


def tie_lead(failing: dict, control: dict, dep: dict) -> dict:
    """The failing path's tie share over its control's (mean of 5 checks, as the departure rule)
    at step 10,000, at its peak and at its low between ‖W_Q‖ leaving and the ties leaving."""
    steps, tie_ratio = report.ratio_to_control(failing, control, key="rows_tied_bf16")
    tie_ratio = report.rolling_mean(tie_ratio, 5)
    after = (steps > dep["wq"]) & (steps < dep["rows_tied_bf16"])
    peak, low = np.argmax(tie_ratio), np.flatnonzero(after)[np.argmin(tie_ratio[after])]
    at_10k = np.searchsorted(steps, 10_000)
    print(
        f"failing / control tie share: {tie_ratio[at_10k]:.2f}× at step 10,000, "
        f"{tie_ratio[peak]:.1f}× at {steps[peak]:,}, "
        f"{tie_ratio[low]:.2f}× at {steps[low]:,}"
    )
    print(
        f"‖W_Q‖ left the control's at step {dep['wq']:,}; the tie share for good at "
        f"{dep['rows_tied_bf16']:,}; the loss exploded at {dep['explosion']:,}"
    )
    return {
        "g7_tie_10k": tie_ratio[at_10k],
        "g7_tie_peak": tie_ratio[peak],
        "g7_tie_peak_at": steps[peak],
        "g7_tie_low": tie_ratio[low],
        "g7_tie_low_at": steps[low],
        "g7_wq_left": dep["wq"],
        "g7_tie_left": dep["rows_tied_bf16"],
    }


# Where the real-BF16 rows of chapter 7's departure table come from, printed under them
REAL_ROWS_NOTE = (
    "The BF16 rows: 'BF16, seed 0' alone is a 20,000-step pair trained beside section 4's "
    "magnified runs; the 60k-step pairs are section 2's (its 'earlier run' stopped at "
    "{earlier:,} steps). On the second testbed (section 9) each arm is paired with the control "
    "that takes δ from an fp32 O and otherwise computes as it does (same seed and batches): the "
    "all-BF16 path with its control, FA2 numerics with its own control (the book's kernel), and "
    "SDPA flash with that control too (the nearest: FA2 numerics, but another kernel), in the "
    "seeds where both are stored. Lead < 0: ‖W_Q‖ left first."
)


def departure_numbers(deps) -> dict:
    """Who left the control first, tie share or ‖W_Q‖, counted apart for the amplified pairs
    (Ō with fewer than BF16's 7 bits) and the real-BF16 pairs (any schedule), and among those
    apart for FA2 numerics and SDPA flash (δ from the BF16 O, against FA2 numerics' own control:
    where the ties left, how long before ‖W_Q‖) and the all-BF16 path (how often ‖W_Q‖ led, and
    by how many steps)."""
    left = deps.dropna(subset=["wq"])
    ties_first = left.rows_tied_bf16 < left.wq  # False where the ties never left
    real = left.obits == 7
    fa2 = real & left.failing.str.match(r"tb-[WA]-")
    paper = real & ~fa2  # the all-BF16 path against its control, any schedule
    fa2_ties = left[fa2 & ties_first]
    lead = fa2_ties.wq - fa2_ties.rows_tied_bf16.astype(float)
    sdpa = fa2_ties[fa2_ties.failing.str.startswith("tb-A-")]  # SDPA flash, ties first
    paper_wq_first = left[paper & ~ties_first]
    lag = paper_wq_first.rows_tied_bf16.astype(float) - paper_wq_first.wq
    return {
        "g7_fa2_pairs": int(fa2.sum()),
        "g7_fa2_ties_first": len(fa2_ties),
        "g7_fa2_tie_lo": float(fa2_ties.rows_tied_bf16.min()) if len(fa2_ties) else 0.0,
        "g7_fa2_tie_hi": float(fa2_ties.rows_tied_bf16.max()) if len(fa2_ties) else 0.0,
        "g7_fa2_lead_lo": float(lead.min()) if len(lead) else 0.0,
        "g7_fa2_lead_hi": float(lead.max()) if len(lead) else 0.0,
        "g7_sdpa_never": int(sdpa.explosion.isna().sum()),
        "g7_paper_pairs": int(paper.sum()),
        "g7_paper_wq_first": len(paper_wq_first),
        "g7_ties_first": int(ties_first.sum()),
        "g7_pairs": len(left),
        "g7_amp_ties_first": int((ties_first & ~real).sum()),
        "g7_amp_pairs": int((~real).sum()),
        "g7_real_ties_first": int((ties_first & real).sum()),
        "g7_real_wq_first": int((~ties_first & real).sum()),
        "g7_real_pairs": int(real.sum()),
        "g7_real_lag_lo": float(lag.min()),
        "g7_real_lag_hi": float(lag.max()),
    }


def departures(paired: dict, pairs: tuple, label) -> object:
    """Print the departure table of every pair (``label(name, run)`` names a failing run) and how
    often the ties lead under two other tie thresholds; return the table."""
    deps = report.departure_table(paired, pairs)
    deps["lead"] = deps.wq - deps.rows_tied_bf16.astype(float)
    deps["run"] = [label(n, paired[n]) for n in deps.failing]
    show = deps[["run", "steps", "rows_tied_bf16", "wq", "explosion", "lead"]].rename(
        columns={"rows_tied_bf16": "ties", "wq": "‖W_Q‖"}
    )
    numeric = ["steps", "ties", "‖W_Q‖", "explosion", "lead"]
    show[numeric] = show[numeric].astype(float)  # every step printed one way: 12,345
    print("step at which each run's tie share and its ‖W_Q‖ left its control's,")
    print("step of the explosion; lead: steps from the ties leaving to ‖W_Q‖ leaving")
    real = deps.obits == 7  # BF16's own 7 bits, whatever the schedule; fewer bits magnify
    second = deps.failing.str.startswith("tb-")  # the second testbed's arms (section 9)
    groups = (
        ("fewer bits (amplified)", show[~real]),
        ("real BF16, first testbed", show[real & ~second]),
        ("real BF16, second testbed", show[real & second]),
    )
    for title, rows in groups:
        print(f"\n{title}:")
        # col_space: at least two spaces between a run's name and its steps
        text = rows.to_string(index=False, na_rep="never", float_format=lambda x: f"{x:,.0f}",
                              col_space=7)  # fmt: skip
        print(text)
    earlier = show[deps.failing == report.EARLIER_BF16[report.FAILING]].steps
    if len(earlier):
        print(textwrap.fill(REAL_ROWS_NOTE.format(earlier=int(earlier.iloc[0])), 88))
    left = deps.wq.notna()
    print(f"‖W_Q‖ left the control's in {int(left.sum())} of {len(deps)} pairs")
    for ratio in (1.05, 1.2):
        rules = {"rows_tied_bf16": (ratio, 5), "wq": (1.25, 1)}
        alt = report.departure_table(paired, pairs, rules=rules).dropna(subset=["wq"])
        print(
            f"with a {ratio - 1:.0%} threshold for the tie share, ties first in "
            f"{int((alt.rows_tied_bf16 < alt.wq).sum())} of {len(alt)} pairs"
        )
    return deps


def toy_summary(toy_u: dict, toy_f: dict) -> None:
    """The CPU pair's ending: when ‖W_Q‖ left the control's, its last value and the loss."""
    left = report.pair_departures(toy_u, toy_f)["wq"]
    (_, wq_u), (_, wq_f) = (monitor_series(r, "wq", 0) for r in (toy_u, toy_f))
    loss_u, loss_f = (np.mean(r["history"]["loss"][-10:]) for r in (toy_u, toy_f))
    print(
        f"On this machine: the failing path's ‖W_Q‖ left the control's at step "
        f"{left};\nat the end {wq_u[-1]:.1f} against {wq_f[-1]:.1f}, loss {loss_u:.2f} "
        f"against {loss_f:.2f} nats per byte."
    )


def outcome_numbers(table) -> dict:
    """How the amplified runs ended (``report.outcome_table``): the 4-bit seeds of the failing
    path, its explosions and the controls'."""
    fail, ctrl = table[table.variant == "U"], table[table.variant == "F"]
    boom = fail[fail.event == "explosion"]
    four = fail[fail.obits == 4]
    n_four = int((four.event == "explosion").sum())
    paired = sorted(set(four.seed) & set(ctrl[ctrl.obits == 4].seed))  # seeds with a control
    alone = [  # the 4-bit seeds without a control, and how each ended
        f"seed {r.seed[1:]} (exploded at {r.step:,.0f})"
        if r.event == "explosion"
        else f"seed {r.seed[1:]} (ran {r.steps:,} steps)"
        for r in four.itertuples()
        if r.seed not in paired
    ]
    print(
        f"4 bits: the failing path exploded in {n_four} of {len(four)} seeds, after "
        f"{four.step.min():,.0f}–{four.step.max():,.0f} steps;\nseeds "
        f"{', '.join(s[1:] for s in paired)} also trained the control (the pairs this "
        "chapter compares)" + (f";\nwithout a control: {', '.join(alone)}." if alone else ".")
    )
    print(
        f"Failing path: exploded in {len(boom)} of {len(fail)} runs, all with "
        f"{boom.obits.min()}–{boom.obits.max()} bits. "
        f"Control: {int((ctrl.event != 'none').sum())} of {len(ctrl)} exploded."
    )
    return {"g7_four_lo": four.step.min(), "g7_four_hi": four.step.max()}


def ladder_rungs(runs: dict, head: dict) -> dict:
    """The isolation ladder's rungs, Ō with 4 bits, seed 1, in the order the figure lists them:
    the failing path, tiles of 64, layer 0 only, one head on the control's route (from plan
    amp_head's ``head`` runs), δ from rowsum(dP∘P), the control."""
    rungs = {v: runs[run_name("k4", v, 1)] for v in "UTL"} | {"H": head[run_name("k4h", "H", 1)]}
    return rungs | {v: runs[run_name("k4", v, 1)] for v in "PF"}


# the similarity figure's panels: (failing run, its control) and the panel's title
SIMILARITY_PANELS = (
    (tuple(report.EARLIER_BF16.values()), "real BF16, seed 0"),
    ((run_name("k4", "U", 1), run_name("k4", "F", 1)), "Ō with 4 bits, seed 1"),
)


def ladder_lines(rungs: dict) -> None:
    """Each rung of the isolation ladder ({variant: run}): when it failed, or how far it trained."""
    for variant, run in rungs.items():
        o = outcome(run)
        verdict = (
            f"{o['event']} at step {o['step']:,}"
            if o["step"] is not None
            else f"stopped at step {o['steps']:,}, no explosion"
        )
        print(f"{VARIANT_NAMES[variant]:50s} {verdict}")


def seed_counts(real: dict) -> dict:
    """How many real-BF16 seeds of the first testbed each arm has, and how many exploded
    (``real``: :func:`.report.real_bf16_runs`), as g7_real_seeds / g7_real_boom (the failing
    path) and g7_fix_p_seeds / g7_fix_p_exploded (δ from rowsum(dP∘P))."""
    seeds = {v: sum(w == v for w, _ in real) for v in "UP"}
    booms = {v: sum(outcome(r)["step"] is not None for (w, _), r in real.items() if w == v)
             for v in "UP"}  # fmt: skip
    return {
        "g7_real_seeds": seeds["U"],
        "g7_real_boom": booms["U"],
        "g7_fix_p_seeds": seeds["P"],
        "g7_fix_p_exploded": booms["P"],
    }


def head_numbers(head: dict, runs: dict, seeds=(1, 2, 3)) -> dict:
    """One runaway head on the control's route against the failing path and the control, at the
    failing path's explosion, per seed."""
    print("the runaway head on the control's route, at the failing path's explosion:")
    head_wq, head_steps, booms, calm_seeds = [], [], [], 0
    for seed in seeds:
        one, failing = head[f"k4h-H-s{seed}"], runs[f"k4-U-s{seed}"]
        healthy = runs[f"k4-F-s{seed}"]
        boom, o = outcome(failing)["step"], outcome(one)
        wq = report.ratio_to_control_at(one, healthy, boom)
        loss = [report.mean_loss(r, boom - 1_000, boom) for r in (one, healthy, failing)]
        ended = "no explosion" if o["step"] is None else f"{o['event']} at {o['step']:,}"
        calm = all(report.runaway_head(one, layer) is None for layer in range(4))
        print(
            f"  seed {seed}, head {report.runaway_head(failing)}: failing path exploded at "
            f"{boom:,}; this run {o['steps']:,} steps, {ended};\n"
            f"    ‖W_Q‖ {wq:.2f}× the control's; loss {loss[0]:.3f} "
            f"(control {loss[1]:.3f}, failing path {loss[2]:.3f});\n"
            f"    no head of any layer past ‖W_Q‖ 5: {calm}"
        )
        head_wq.append(wq)
        head_steps.append(o["steps"] if o["step"] is None else 0)
        booms.append(boom)
        calm_seeds += calm
    return {
        "g7_head_held": sum(s > 0 for s in head_steps),
        "g7_head_wq_hi": max(head_wq),
        "g7_head_steps": min(head_steps),
        "g7_head_boom_hi": max(booms),
        "g7_head_calm": calm_seeds,
        "g7_head_seeds": len(seeds),
    }


def similarity_numbers(deps, failing: dict, control: dict) -> dict:
    """When the rank-1 terms' similarity left the control's, against ‖W_Q‖ (every pair of
    ``deps``), and its mean over checks 10–99 in a real-BF16 pair."""
    gap = (deps.rank1_token_cos - deps.wq).dropna()
    early = [monitor_series(r, "rank1_token_cos", 0)[1][10:100].mean() for r in (failing, control)]
    print(
        f"Layer 0, {len(gap)} pairs: the similarity left the control's (25 % above) from "
        f"{-gap.min():,.0f} steps before\nto {gap.max():,.0f} steps after ‖W_Q‖ did.\n"
        f"In BF16, steps 1,000–10,000, it averaged {early[0]:.2f} (failing) and "
        f"{early[1]:.2f} (control)."
    )
    return {
        "g7_cos_early": float(np.mean(early)),
        "g7_cos_before": -gap.min(),
        "g7_cos_after": gap.max(),
    }


def lean_groups(runs: dict, table, first_search: dict) -> dict:
    """The δ error's lean (``report.delta_bias_share``) of the amplified failing runs, exploded
    or not, their controls and the first search's healthy runs: {label: (values, colour)}."""
    share = {name: report.delta_bias_share(run) for name, run in runs.items()}
    fail, ctrl = table[table.variant == "U"], table[table.variant == "F"]
    exploded = set(table.run[table.event == "explosion"])
    return {
        "failing path, exploded": (
            [share[n] for n in fail.run if n in exploded],
            report.VARIANT_COLOURS["U"],
        ),
        "failing path, did not": ([share[n] for n in fail.run if n not in exploded], "salmon"),
        "controls (none failed)": ([share[n] for n in ctrl.run], report.VARIANT_COLOURS["F"]),
        "healthy runs (appendix)": (
            [report.delta_bias_share(run) for run in first_search.values()],
            "0.4",
        ),
    }


def lean_numbers(groups: dict) -> dict:
    """Print how often each group's lean is positive and its range; return the glued ranges (%)."""
    for label, (values, _) in groups.items():
        values = np.array(values)
        print(
            f"{label:27s}: positive in {int((values > 0).sum())} of {len(values)}, "
            f"{100 * values.min():+.1f} % to {100 * values.max():+.1f} %"
        )
    lean = {label: 100 * np.array(v) for label, (v, _) in groups.items()}
    return {
        "g7_lean_fail_lo": lean["failing path, exploded"].min(),
        "g7_lean_fail_hi": lean["failing path, exploded"].max(),
        "g7_lean_ctrl_lo": lean["controls (none failed)"].min(),
        "g7_lean_ctrl_hi": lean["controls (none failed)"].max(),
        "g7_lean_first_hi": lean["healthy runs (appendix)"].max(),
    }


def real_lean_numbers(early: dict, whole: dict) -> dict:
    """The lean (%) of the real-BF16 runs in their first 10,000 steps and over the whole run,
    keyed as the chapter's figure: the two autocast-probed runs first, then the fp32-probed
    'failing path, seed 0', 'failing path, seed 1' and 'control, seed 1'."""
    fp32_early = list(early.values())[2:]
    failing = [whole["failing path, seed 0"], whole["failing path, seed 1"]]
    return {
        "g7_lean_autocast_hi": max(list(early.values())[:2]),
        "g7_lean_fp32_lo": min(fp32_early),
        "g7_lean_fp32_hi": max(fp32_early),
        "g7_lean_fail_whole_lo": min(failing),
        "g7_lean_fail_whole_hi": max(failing),
        "g7_lean_ctrl_whole": whole["control, seed 1"],
    }


def describe_plan(record: dict, prefix: str = "") -> str:
    """:func:`kernels.results.describe` for a record of ``kernels.gpt2.search``, its command cut
    to the plan: which runs each call trained (``--only …``) and how the calls followed each
    other are in results/README.md, where every record's full command is."""
    import re

    from ..results import describe

    provenance = dict(record["provenance"])
    command, cut = re.subn(r"\s--only[= ]\S+", " …", provenance["command"])
    provenance["command"] = command
    note = "\n  (its runs and calls: results/README.md)" if cut else ""
    return describe({"provenance": provenance}, prefix) + note


OFFSET_WORDS = {"off": "none", "tile": "Algorithm 3"}  # spec.stable in words
DELTA_WORDS = {"o": "the BF16 O", "o_fp32": "PV in fp32", "dp": "rowsum(dP∘P)"}


def print_attentions(variants: str = "UFPZ") -> None:
    """What each attention of the chapter changes, read from the specs its runs train with:
    where δ comes from, the softmax offset, and the clamp on each key tile's row sum ℓ."""
    from .attention import parse_spec
    from .plans import variant_options

    rows = [("attention", "δ from", "softmax offset", "ℓ clamp")]
    for variant in variants:
        spec = parse_spec(variant_options(variant)["attn"])
        offset = OFFSET_WORDS[spec.stable]
        if spec.stable != "off":
            offset += f", β = {spec.beta:g}, ε = {spec.eps:g}"
        clamp = "—" if spec.clamp is None else f"{spec.clamp:g}"
        rows.append((VARIANT_NAMES[variant].split(" (")[0], DELTA_WORDS[spec.delta], offset, clamp))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
