"""The printed tables and glued numbers of chapter 7's sections 7–8: the fixes (the β rule's NaN,
its repairs, the released clamp, both fixes in real BF16) and the controls that tell bias from
size. Each table function prints what the chapter's cell showed and returns the numbers its prose
glues, ``{glue name: value}``. Sections 2–6 are in :mod:`.chapter_tables`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..attention.emulator import flash_forward
from . import report
from .report import VARIANT_NAMES, monitor_series, outcome, parse_name

# e^-r is 0 once below half the smallest subnormal: 2^-134 in BF16, 2^-150 in fp32
ZERO_AT = {"BF16": 134 * np.log(2), "fp32": 150 * np.log(2)}


def _one_row(scores, values, **options):
    """Emulate one query (q = e₁, so S = ``scores``, scale 1) against one tile of keys."""
    keys = torch.stack([scores, torch.zeros_like(scores)], -1)[None, None]
    res = flash_forward(
        torch.tensor([[[[1.0, 0.0]]]]), keys, values, numerics="paper", scale=1.0, **options
    )
    return res.out


def first_nan(beta: float, tied_max, generator=None) -> int | None:
    """The first tied maximum r_m of ``tied_max`` (ascending) at which Algorithm 3's offset
    (``stable="cross"``, ``beta``) turns a row with three tied maxima into NaN; None if none."""
    for rm in tied_max:
        scores = torch.tensor([rm, rm, rm - 3, rm - 5, rm - 8, rm - 20], dtype=torch.float32)
        values = torch.randn(1, 1, 6, 2, generator=generator)
        out = _one_row(scores, values, stable="cross", beta=beta, block_n=6)
        if not torch.isfinite(out.float()).all():
            return int(rm)
    return None


def released_clamp_curve(tied_max) -> np.ndarray:
    """The output of the released fix (β = 2, each tile's row sum clamped at 1e-10) for a row
    with two tied maxima r_m and V = 1 (exact output 1), for each r_m of ``tied_max``."""
    out = []
    for rm in tied_max:
        scores = torch.tensor([rm, rm, rm - 3.0, rm - 5.0, rm - 8.0])
        res = _one_row(
            scores,
            torch.ones(1, 1, 5, 2),
            stable="tile",
            beta=2.0,
            block_n=512,
            ell_clamp=1e-10,
            ell_clamp_at="tiles",
        )
        out.append(float(res[0, 0, 0, 0]))
    return np.array(out)


def clamp_numbers(tied_max, out) -> dict:
    """Where the released clamp's output first drops below 0.99, and its value at 24, 26, 40."""
    at = dict(zip(np.asarray(tied_max).tolist(), out))
    first = int(np.asarray(tied_max)[np.argmax(out < 0.99)])
    print(
        f"O shrinks from r_m = {first}: ×{at[24]:.2f} at 24, ×{at[26]:.2f} at 26, "
        f"×{at[40]:.2g} at 40"
    )
    return {"g7_clamp_first": first} | {f"g7_clamp_{rm}": at[rm] for rm in (24, 26, 40)}


def nan_runs(runs: dict, names=("k4-S-s1", "k4-S-s2", "k4-S-s3", "k3-S-s0", "k5-S-s0")) -> dict:
    """The β rule's amplified runs: when each went NaN and layer 0's largest logit before."""
    last_logit = []
    for name in names:
        steps, logit = monitor_series(runs[name], "max_logit", 0)
        nan_at = outcome(runs[name])["step"]
        keep = np.isfinite(logit) & (logit > 0) & (steps < nan_at)
        last_logit.append(logit[keep][-1])
        print(
            f"{report.run_label(name, runs[name])}: NaN at step {nan_at:,}; layer-0 "
            f"max |S| at the last check before: {logit[keep][-1]:.0f}"
        )
    print("e^-r_m is 0 past r_m = " + ", ".join(f"{r:.1f} in {f}" for f, r in ZERO_AT.items()))
    return {
        "g7_bf16_zero": ZERO_AT["BF16"],
        "g7_fp32_zero": ZERO_AT["fp32"],
        "g7_nan_lo": min(last_logit),
        "g7_nan_hi": max(last_logit),
    }


def fix_numbers(fixes: dict) -> dict:
    """Print the repairs' table and the final-denominator clamp's NaN; return the glued steps."""
    for row in report.fix_table(fixes).itertuples():
        alive = f"; trained to {row.reached:,.0f}" if row.failed < row.runs else ""
        events = f": {row.events}" if row.failed else ""
        print(f"{row.what:31s} {row.failed} of {row.runs} failed" + events + alive)
    outs = {v: [outcome(r) for n, r in fixes.items() if parse_name(n)[1] == v] for v in "CDKP"}
    repaired = [o["step"] for v in "CD" for o in outs[v]]
    clamped = next(r for n, r in fixes.items() if parse_name(n)[1] == "K")
    last_logit = max(  # every layer's largest logit at the last check before the NaN
        monitor_series(clamped, "max_logit", layer)[1][-1] for layer in range(4)
    )
    print(
        f"the final-denominator clamp: NaN at step {outs['K'][0]['step']:,}, largest logit "
        f"{last_logit:.0f} at the last check before"
    )
    return {
        "g7_rep_lo": min(repaired),
        "g7_rep_hi": max(repaired),
        "g7_clamp_nan": outs["K"][0]["step"],
        "g7_clamp_nan_logit": last_logit,
        "g7_clamp_nan_gap": outs["K"][0]["step"] - clamped["monitor"][-1]["step"],
        "g7_dp_lo": min(o["steps"] for o in outs["P"]),
        "g7_dp_hi": max(o["steps"] for o in outs["P"]),
        "g7_dp_runs": len(outs["P"]),
        "g7_dp_boom": sum(o["step"] is not None for o in outs["P"]),
    }


def real_fix_numbers(real: dict, section_2: dict) -> dict:
    """Both fixes in real BF16 (``report.real_bf16_runs``) against the control: seed 1's losses
    and ratios, seed 0's ending (``section_2``: that section's glued numbers)."""
    control_1, prop, released = real["F", "s1"], real["P", "s1"], real["Z", "s1"]
    at_steps = (20_000, 40_000, outcome(real["U", "s1"])["step"])
    print(f"{'':44s}{'steps':>7s}   loss, mean of 1,000 steps before step")
    print(f"{'':51s}" + "".join(f"{step:>9,}" for step in at_steps))
    loss_at = {}
    for v in "UFPZ":
        run = real[v, "s1"]
        loss_at[v] = [report.mean_loss(run, s - 1_000, s) for s in at_steps]
        done = run["summary"]["steps_done"]
        print(f"{VARIANT_NAMES[v]:44s}{done:7,}" + "".join(f"{x:9.3f}" for x in loss_at[v]))
    print("over the control's, at steps 30,000 and 50,000:")
    ratios = {}
    for name, run in (("P", prop), ("Z", released)):
        for key in ("wq", "max_logit"):
            for step in (30_000, 50_000):
                ratios[name, key, step] = report.ratio_to_control_at(run, control_1, step, key=key)
        wq, logit = ([ratios[name, k, s] for s in (30_000, 50_000)] for k in ("wq", "max_logit"))
        print(
            f"  {VARIANT_NAMES[name]}: ‖W_Q‖ {wq[0]:.2f}×, {wq[1]:.2f}×; "
            f"largest logit {logit[0]:.1f}×, {logit[1]:.1f}×"
        )
    prop_0, released_0 = real["P", "s0"], real["Z", "s0"]
    p0_80k = report.mean_loss(prop_0, 79_000, 80_000)  # as section 2's losses
    print(
        f"seed 0, loss at step 80,000: δ from rowsum(dP∘P) {p0_80k:.3f},\n"
        f"  control {section_2['g7_loss_c0_80k']:.3f}, "
        f"failing path {section_2['g7_loss_f0_80k']:.3f}"
    )
    z0 = {s: report.mean_loss(released_0, s - 1_000, s) for s in (60_000, 80_000)}
    z0_steps, z0_wq = monitor_series(released_0, "wq", 0)
    z0_growth = z0_wq[-1] / z0_wq[np.searchsorted(z0_steps, 60_000)]
    print(
        f"seed 0, the paper's fix as released: loss {z0[60_000]:.3f} at step 60,000,\n"
        f"  {z0[80_000]:.3f} at 80,000; layer 0's ‖W_Q‖ grew {z0_growth:.1f}× in between"
    )
    return {
        "g7_fix_p_steps": prop["summary"]["steps_done"],
        "g7_fix_c_20k": loss_at["F"][0],
        "g7_fix_p_boom": loss_at["P"][2],
        "g7_fix_c_boom": loss_at["F"][2],
        "g7_fix_z_20k": loss_at["Z"][0],
        "g7_fix_z_gap": loss_at["Z"][2] - loss_at["F"][2],
        "g7_fix_p_wq_50k": ratios["P", "wq", 50_000],
        "g7_fix_p_logit_50k": ratios["P", "max_logit", 50_000],
        "g7_fix_z_wq_30k": ratios["Z", "wq", 30_000],
        "g7_fix_z0_60k": z0[60_000],
        "g7_fix_z0_80k": z0[80_000],
        "g7_fix_z0_growth": z0_growth,
        "g7_fix_p0_steps": prop_0["summary"]["steps_done"],
        "g7_fix_p0_80k": p0_80k,
    }


SR_PAIRS = ((3, "k3-U-s0", "k3-R-s0"), (4, "k4-U-s1", "k4-R-s1"), (5, "k5-U-s0", "k5-R-s0"))


def stochastic_numbers(runs: dict, pairs=SR_PAIRS) -> dict:
    """Ō rounded to nearest against stochastically: steps to the explosion and the δ lean."""
    print("Ō rounded to nearest (nearest) or stochastically (stoch.); lean: Σ(δ_lp − δ_hp)")
    print("as a share of Σ|δ_lp − δ_hp| before step 2,000 (autocast probe)")
    print(f"{'':6s}{'step of the explosion':^34s}{'lean':^22s}")
    print(
        f"{'bits':6s}{'nearest':>11s}{'stoch.':>11s}{'ratio':>12s}{'nearest':>11s}{'stoch.':>11s}"
    )
    ratios = []
    for bits, rne, sr in pairs:
        u, r = outcome(runs[rne]), outcome(runs[sr])
        lean = [report.delta_bias_share(runs[n], before=2000) for n in (rne, sr)]
        print(
            f"{bits:<6d}{u['step']:11,}{r['step']:11,}{r['step'] / u['step']:11.2f}×"
            f"{100 * lean[0]:9.1f} %{100 * lean[1]:9.1f} %"
        )
        ratios.append(r["step"] / u["step"])
    return {"g7_sr_lo": 100 * min(ratios), "g7_sr_hi": 100 * max(ratios)}


def control_numbers(runs: dict, controls: dict, seeds=("s1", "s2", "s3")) -> dict:
    """The controls' ‖W_Q‖ over the control's at steps 5,000 and 7,000, their explosions, and
    how far bias alone's loss ended behind its control."""
    lines = ["layer-0 ‖W_Q‖ ÷ the control's at step", f"{'':42s}   5,000   7,000  explosion"]
    numbers = {"g7_ctl_U_s1": outcome(runs["k4-U-s1"])["step"]}
    for row in report.control_rows(runs, controls, seeds):
        shown = "".join(f"{r:7.1f}×" if np.isfinite(r) else f"{'—':>8s}" for r in row["ratio"])
        end = f"at {row['exploded']:,}" if row["exploded"] else f"none by {row['steps']:,}"
        lines.append(f"seed {row['seed'][1:]}, {VARIANT_NAMES[row['variant']]:34s}{shown}  {end}")
        numbers[f"g7_ctl_{row['variant']}_{row['seed']}_7k"] = row["ratio"][1]
        numbers[f"g7_ctl_{row['variant']}_{row['seed']}_end"] = row["exploded"] or row["steps"]
    gaps = []  # bias alone's loss over its control's, the last 1,000 steps both ran
    for seed in seeds:
        bias, ctrl = controls[f"k4c-B-{seed}"], runs[f"k4-F-{seed}"]
        end = min(r["summary"]["steps_done"] for r in (bias, ctrl)) // 1000 * 1000
        gaps.append(
            report.mean_loss(bias, end - 1000, end) - report.mean_loss(ctrl, end - 1000, end)
        )
    lines.append(
        f"bias alone, loss behind its control at the end: {min(gaps):.2f}–{max(gaps):.2f} nats/byte"
    )
    print("\n".join(lines))
    return numbers | {"g7_ctl_B_gap_lo": min(gaps), "g7_ctl_B_gap_hi": max(gaps)}


def probe_numbers(amp: dict, matched_mean: float) -> dict:
    """Seed 1, layer 0: the δ error's mean, mean |·| and lean of the failing path under the
    autocast and the fp32 probe and of 'exact O passed on' (until its ‖W_Q‖ left the control's);
    ``matched_mean``: layer 0's mean error that bias alone was given."""
    left = report.pair_departures(amp["k4c-U-s1"], amp["k4-F-s1"])["wq"]
    probed = {  # per layer: mean and mean |δ_lp − δ_hp| per row
        "failing path, autocast probe": report.matched_delta_stats(amp, seeds=("s1",)),
        "failing path, fp32 probe": report.matched_delta_stats(amp, seeds=("s1",), failing="k4c-U"),
        "exact O passed on, fp32 probe": report.matched_delta_stats(
            amp, seeds=("s1",), failing="k4c-X", until=left
        ),
    }
    print("seed 1, layer 0: δ error per row      mean     mean |·|   lean before 2,000")
    names = ("k4-U-s1", "k4c-U-s1", "k4c-X-s1")  # the runs probed, in the order of probed
    lean = {n: 100 * report.delta_bias_share(amp[n], before=2000) for n in names}
    for (label, stats), name in zip(probed.items(), names):
        print(f"{label:34s}{stats['mean'][0]:10.2e}{stats['mean_abs'][0]:11.2e}{lean[name]:8.1f} %")
    print(f"{'bias alone was given (constant)':34s}{matched_mean:10.2e}")
    old, new, exact = (s["mean"][0] for s in probed.values())
    spread_old, spread_new, _ = (s["mean_abs"][0] for s in probed.values())
    return {
        "g7_lean_u": lean["k4c-U-s1"],
        "g7_lean_x": lean["k4c-X-s1"],
        "g7_x_vs_b": exact / matched_mean,
        "g7_probe_mean": new / old,
        "g7_probe_abs": spread_new / spread_old,
    }
