"""Chapter 6's numbers for its prose, by glue name: one function per section, each taking what
the chapter's cell measured (or loaded from ``results/``) and returning ``{name: value}`` for
one ``glue_all`` call.

Each function also raises when the measurements no longer say what the sentence around its
numbers says (a claim of direction or of order, never a value), so a re-run that changes the
story stops the build instead of printing a sentence the page's output contradicts.
"""

from __future__ import annotations

import math

from .. import results

DELTA_FIXES = ("delta_fp32", "delta_hilo", "delta_dp")


def _range(values, spec: str) -> str:
    """``lo–hi`` formatted with ``spec``, or one value where both read the same."""
    lo, hi = format(min(values), spec), format(max(values), spec)
    return lo if lo == hi else f"{lo}–{hi}"


def delta_numbers(records: list[dict], near_case: str = "0 / −1") -> dict:
    """Section 1's numbers on δ from :func:`.fixes.measure_fixes`'s ``records``; prints the
    figure's and the table's reading of the β rule where they part (tied V near 0,
    ``near_case``). Raises unless: the δ fixes leave a smaller summed error than no fix in
    every setting, the β rule across tiles reduces it, per tile it changes it by under 1 %, and ℓ
    from the rounded P̄ helps less than the plain rule."""
    by = {(r["case"], r["fix"]): r for r in records}
    cases = list(dict.fromkeys(r["case"] for r in records))
    share = {  # |Σ(δ − δ_exact)| / Σ|δ_exact| per fix, one value per setting
        key: [
            abs(by[c, key]["delta"]["sum_error"]) / by[c, key]["delta"]["sum_abs_exact"]
            for c in cases
        ]
        for key in dict.fromkeys(r["fix"] for r in records)
    }
    delta_shares = [x for key in DELTA_FIXES for x in share[key]]
    gain = [before / after for before, after in zip(share["none"], share["beta_cross"])]
    if not max(delta_shares) < min(share["none"]) or not min(gain) > 1:
        raise ValueError("the prose says the δ fixes and the β rule shrink δ's summed error")
    if not all(math.isclose(t, n, rel_tol=0.01) for t, n in zip(share["beta_tile"], share["none"])):
        raise ValueError("the prose says the per-tile rule changes next to nothing here")
    if not all(r > p for r, p in zip(share["beta_ell_rounded"], share["beta_cross"])):
        raise ValueError("the prose says ℓ from the rounded P̄ helps less than the plain rule")
    near, plain = by[near_case, "beta_cross"]["delta"], by[near_case, "none"]["delta"]
    ci, rel = 1.96 * near["se"], near["sum_error"] / near["sum_abs_exact"]
    print(
        f"β rule across tiles, V {near_case}: mean error of δ {near['bias']:+.2f} ± "
        f"{ci:.2f} ulp of δ (figure),\n  Σ(δ − δ_exact) / Σ|δ_exact| {rel:+.1e} (table)"
    )
    as_ideal = max(
        abs(by[c, "none"]["delta"]["bias"] - by[c, "none"]["delta_ideal"]["bias"]) for c in cases
    )
    return {
        "c6_none_vs_ideal": as_ideal,
        "c6_delta_near0_ulp": near["bias"],
        "c6_delta_near0_ci": ci,
        "c6_delta_near0_rel": rel,
        "c6_delta_near0_none_ulp": plain["bias"],
        "c6_delta_near0_within": "zero within" if abs(near["bias"]) <= ci else "zero outside",
        "c6_sum_none_lo": min(share["none"]),
        "c6_sum_none_hi": max(share["none"]),
        "c6_sum_delta_lo": min(delta_shares),
        "c6_sum_delta_hi": max(delta_shares),
        "c6_beta_gain_lo": math.floor(min(gain[:2])),  # "N-fold or more": never rounded up
        "c6_beta_gain_near0": gain[cases.index(near_case)],
    }


def output_numbers(records: list[dict], near_case: str = "0 / −1") -> dict:
    """Section 1's numbers on O: the share of the δ fixes' outputs equal to the ideal, the
    share the β rule across tiles moves off it, and its rms error over FA2's with tied V near
    0. Raises unless the δ fixes' O is FA2's own in every setting."""
    by = {(r["case"], r["fix"]): r["out"] for r in records}
    cases = list(dict.fromkeys(r["case"] for r in records))
    if any(by[c, k] != by[c, "none"] for c in cases for k in DELTA_FIXES):
        raise ValueError("the prose says the δ fixes leave O as FA2 computes it")
    moved = [1 - by[c, "beta_cross"]["same_as_ideal"] for c in cases]
    return {
        "c6_delta_same_min": min(by[c, k]["same_as_ideal"] for c in cases for k in DELTA_FIXES),
        "c6_beta_moved_lo": min(moved),
        "c6_beta_moved_hi": max(moved),
        "c6_beta_rms_ratio": by[near_case, "beta_cross"]["rms"] / by[near_case, "none"]["rms"],
    }


def worst_numbers(record: dict, rows: dict) -> dict:
    """Section 2's numbers from the GPU record ``record`` (``bias_sources_gpu``) and its
    ``rows`` ({impl: output statistics}, tied V near 0): the worst error with and without the
    β rule, the GPU's name from the record's provenance. Raises unless ℓ from the rounded P̄
    leaves the rule's worst case where it was."""
    beta, rounded = rows["triton/beta_cross"]["worst"], rows["triton/beta_ell_rounded"]["worst"]
    if not math.isclose(rounded, beta, rel_tol=0.01):
        raise ValueError("the prose says ℓ from the rounded P̄ leaves the worst case where it was")
    return {
        "c6_worst_none": rows["triton/none"]["worst"],
        "c6_worst_beta": beta,
        "c6_gpu": results.gpu_short(record),
    }


def fp32_thresholds() -> dict:
    """Where e^{-x} turns subnormal in fp32 (−ln of the smallest normal number) and where it
    rounds to 0 (−ln of half the smallest subnormal)."""
    import torch

    smallest_normal = torch.finfo(torch.float32).smallest_normal
    return {
        "c6_subnormal_at": -math.log(smallest_normal),
        "c6_zero_at": -math.log(smallest_normal * 2.0**-24),  # 2⁻²³ of it, halved
    }


def clamp_numbers(released: dict, at=(24, 26, 40), clamp: float = 1e-10) -> dict:
    """The released clamp's numbers from ``released`` ({tied r_m: O} for a row whose exact
    output is 1): the first r_m where O shrinks below 0.99, O at the r_m of ``at``, and the r_m
    where two tied maxima with β = 2 sum below ``clamp`` (2·e^{−r_m} = clamp)."""
    first = min(rm for rm, o in released.items() if o < 0.99)
    print(
        f"O shrinks from r_m = {first}: "
        + ", ".join(
            f"×{released[rm]:{'.2f' if released[rm] >= 0.01 else '.2g'}} at {rm}" for rm in at
        )
    )
    numbers = {"c6_clamp_first": first, "c6_clamp_math": math.log(2 / clamp)}
    return numbers | {f"c6_clamp_{rm}": released[rm] for rm in at}


def offset_numbers(offsets, fixed: dict, rounding) -> dict:
    """The fixed offset m = r_m + c (Appendix C): FA2's bias at c = 0 (plain FA2, on these
    rows), its largest bias over c, the ideal's, the fewest outputs left ideal and the
    correlation of FA2's bias with how e^{−c} rounds; prints them. Raises unless the first
    offset is c = 0."""
    import numpy as np

    if offsets[0] != 0:
        raise ValueError("the prose reads FA2's own bias at c = 0, the first offset")
    fa2 = [r["mean"] for r in fixed["fa2"]]
    numbers = {
        "c6_offset_fa2": fa2[0],
        "c6_offset_worst": max(fa2, key=abs),
        "c6_offset_ideal": max(abs(r["mean"]) for r in fixed["ideal"]),
        "c6_offset_same": min(r["correctly_rounded"] for r in fixed["fa2"]),
        "c6_offset_corr": float(np.corrcoef(fa2, rounding)[0, 1]),
    }
    print(
        f"mean error of O over c: FA2 {min(fa2):+.3f} to {max(fa2):+.3f} ulp ({fa2[0]:+.3f} at"
        f" c = 0),\n  the ideal within ±{numbers['c6_offset_ideal']:.3f} ulp; at worst "
        f"{numbers['c6_offset_same']:.0%} of FA2's outputs ideal\ncorrelation of FA2's error "
        f"with how the tied P̄ = e^(−c) rounds: {numbers['c6_offset_corr']:.2f}"
    )
    return numbers


def rule_scan_numbers(underflow: dict, moved: float, far_ulps: int) -> dict:
    """Chapter 6's numbers on where the β rule's outputs go wrong, by glue name, from the
    three scans of ``underflow`` (rule on every row, tied maxima, m = 0; each a list of
    ``row_max_scan`` rows) and the share ``moved`` off the ideal on plain rows. Raises if
    the scans no longer say what the prose says (outputs go wrong before ℓ underflows for
    the unconditional rule)."""
    wrong_from = [min(abs(r["rm"]) for r in s if r["wrong"] > 0) for s in underflow.values()]
    nan_from = min(abs(r["rm"]) for r in next(iter(underflow.values())) if r["ell_zero"] > 0)
    if not wrong_from[0] <= nan_from:
        raise ValueError("the prose says the unconditional rule goes wrong before ℓ = 0")
    return {
        "c6_always_from": wrong_from[0],
        "c6_always_nan": nan_from,
        "c6_tied_from": wrong_from[1],
        "c6_zero_from": wrong_from[2],
        "c6_always_moved": moved,
        "c6_far_ulps": far_ulps,
    }


def zero_rule_numbers(negative: dict, exp_rounds_to_one: float) -> dict:
    """Chapter 6's numbers on the m = 0 rule near 0, by glue name, from a ``row_max_scan``
    of tied negative maxima jittered by ±20 % (``negative``: rows per implementation), split
    where the tied P̄ = e^{r_m} rounds back to 1 (|r_m| below ``exp_rounds_to_one``) and
    past |r_m| = 0.01; prints both parts. Raises if the scan no longer says what the prose
    says (inside, the storage bias turns into one of the other sign; outside, the rule's
    bias stays under a third of the ideal's)."""
    rows, ideal = negative["fa2/cross"], negative["ideal"][0]["mean"]
    # inside: every jittered row (up to 1.2 |r_m|) within the window
    inside = [r for r in rows if abs(r["rm"]) * 1.2 < exp_rounds_to_one]
    outside = [r for r in rows if abs(r["rm"]) > 0.01]
    below = f"|r_m| < {exp_rounds_to_one / 1.2:.4f}"
    for name, part in ((below, inside), ("|r_m| > 0.01", outside)):
        means = [r["mean"] for r in part]
        shown = _range([r["same_as_ideal"] for r in part], ".0%")
        print(
            f"{name:16s}: bias {min(means):+.3f} to {max(means):+.3f} ulp "
            f"(ideal {ideal:+.3f}), equal to the ideal {shown}"
        )
    out_means = [r["mean"] for r in outside]
    numbers = {
        "c6_zero_ideal": ideal,
        "c6_zero_inside": sum(r["mean"] for r in inside) / len(inside),
        "c6_zero_inside_same": sum(r["same_as_ideal"] for r in inside) / len(inside),
        "c6_zero_out_lo": min(r["same_as_ideal"] for r in outside),
        "c6_zero_out_hi": max(r["same_as_ideal"] for r in outside),
        "c6_zero_out_bias_lo": min(out_means),
        "c6_zero_out_bias_hi": max(out_means),
    }
    if not numbers["c6_zero_inside"] * ideal < 0:
        raise ValueError("the prose says the storage bias turns into one of the other sign")
    if not max(abs(m) for m in out_means) < abs(ideal) / 3:
        raise ValueError("the prose says the two roundings mostly cancel past |r_m| = 0.01")
    return numbers


def spike_numbers(negative: dict, predicted: list[dict]) -> dict:
    """The spike of the m = 0 scan: the first |r_m| where every row's tied P̄ rounds down,
    measured (``negative['fa2/cross']``) against the rounding model (``predicted``), the
    largest gap between the two over the scan, and how many rows round down past 0.01."""
    at = next(i for i, r in enumerate(predicted) if r["rounded_down"] == 1.0)
    meas, pred = negative["fa2/cross"][at], predicted[at]
    gap = max(abs(a["mean"] - b["mean"]) for a, b in zip(negative["fa2/cross"], predicted))
    far = [r["rounded_down"] for r in predicted if abs(r["rm"]) > 0.01]
    print(
        f"|r_m| = {abs(meas['rm']):.4f}: P̄ < e^r_m in {pred['rounded_down']:.0%} of the"
        f" rows; O moved {pred['shift']:+.3f} ulp before rounding\n"
        f"bias [ulp]: measured {meas['mean']:+.3f} ± {1.96 * meas['se']:.3f}, predicted "
        f"{pred['mean']:+.3f}\nequal to the ideal: measured {meas['same_as_ideal']:.1%}, "
        f"predicted {pred['same_as_ideal']:.1%}\nwhole scan: |measured − predicted| ≤ "
        f"{gap:.3f} ulp; |r_m| > 0.01: P̄ < e^r_m in {_range(far, '.0%')} of the rows"
    )
    return {
        "c6_spike_rm": abs(meas["rm"]),
        "c6_spike_shift": pred["shift"],
        "c6_spike_meas": meas["mean"],
        "c6_spike_pred": pred["mean"],
        "c6_spike_same": meas["same_as_ideal"],
        "c6_spike_gap": gap,
        "c6_spike_far_lo": min(far),
        "c6_spike_far_hi": max(far),
    }


def cost_numbers(table: dict, base: str = "FA2 (book kernel)") -> dict:
    """Section 4's costs at the long shape: 1 − TFLOP/s over the unfixed kernel's (``table``,
    {name: TFLOP/s}), the plain β rule's as one value or a range (one value where its ends
    read the same)."""
    cost = {name: 1 - tflops / table[base] for name, tflops in table.items()}
    plain = [cost[n] for n in ("β rule per tile", "β rule across tiles", "β rule, offset capped")]
    return {
        "c6_cost_beta": _range(plain, ".0%"),
        "c6_cost_rounded": cost["β rule, ℓ from rounded P̄"],
        "c6_cost_dp": cost["δ from rowsum(dP ∘ P)"],
        "c6_cost_fp32": cost["δ from an fp32 O"],
    }


def gpt2_shape_numbers(small: dict, base: str = "FA2 (book kernel)") -> dict:
    """The GPT-2 shape's speeds (``small``, {name: TFLOP/s}) without a fix and with the capped
    rule. Raises unless the capped rule, which does more work, ran at least as fast as no
    fix (the prose's reason not to read the costs there)."""
    capped = small["β rule, offset capped"]
    if not capped >= small[base]:
        raise ValueError("the prose says the capped rule ran faster than no fix at N = 1,024")
    return {"c6_small_fa2": small[base], "c6_small_capped": capped}


def explorer_numbers(grid: dict, default: dict, underflow: dict) -> dict:
    """The fixes explorer's numbers: how many settings the stored ``grid`` holds, the ideal's,
    FA2's and the rule's bias at the default setting (``default``, a looked-up cell) and the
    rule's share of NaN or inf outputs at β = 64 (``underflow``), in percent. Raises unless
    FA2 sits below the ideal at the default (the prose explains why)."""
    if not default["fa2"]["bias"] < default["ideal"]["bias"]:
        raise ValueError("the prose says FA2 sits below the ideal at the default setting")
    return {
        "explorer_settings": len(grid["bases"]) * len(grid["bases"][0]["rule"]),
        "explorer_ideal_bias": default["ideal"]["bias"],
        "explorer_fa2_bias": default["fa2"]["bias"],
        "explorer_rule_bias": default["rule"]["bias"],
        "explorer_nan_share": 100 * underflow["rule"]["bad"],
    }


def update_numbers(here_s: float, timed: dict) -> dict:
    """One widget update: seconds here (``here_s``) and on the GPU machine of the stored
    record's data (``timed``: on its GPU, on its CPU), and how far the GPU's cell is from the
    CPU's (the stored grid is the CPU's)."""
    return {
        "explorer_update_s": here_s,
        "explorer_update_gpu_s": timed["gpu_s"],
        "explorer_update_gpu_cpu_s": timed["cpu_s"],
        "explorer_gpu_diff": timed["gpu_vs_cpu_largest_difference"],
    }
