"""The candidate fixes, measured at the output O and at δ = rowsum(dO ∘ O), against the ideal.

A fix changes either the forward pass (where the softmax offset m sits, what ℓ sums) or where
the backward pass takes δ from. Each is measured on a built case (:mod:`.cases`) with the same
numbers every implementation sees:

* at O: the error in bf16 ulps against the exact O (fp64), its mean (the bias), its rms, the
  worst case, how many outputs are not finite, and the share of outputs *equal to the ideal*,
  bf16(O_exact): the best any bf16 output can be;
* at δ: the error of δ against δ_exact = rowsum(dO ∘ O_exact), in bf16 ulps of δ, next to the
  ideal δ of a stored-bf16 O, rowsum(dO ∘ bf16(O_exact)); and Σ(δ − δ_exact) over the rows,
  the scalar the paper's Eq. (3) says steers the weight update.

``extra_bytes`` is the memory a fix adds per output element (beyond FA2's bf16 O), counted from
what it stores, not measured.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..attention import emulator
from ..attention.options import DELTA_SOURCES, AttentionOptions
from ..numerics.rounding import error_in_ulps, round_to_dtype
from ..numerics.stats import mean_ci
from .cases import Built, Case, build, reference


@dataclasses.dataclass(frozen=True)
class Fix:
    label: str
    forward: dict  # AttentionOptions fields of the forward pass (FA2 numerics)
    delta: str = "o"  # "o" (stored bf16 O), "o_fp32", "o_hilo", "dp"
    extra_bytes: float = 0  # per output element, beyond the bf16 O
    note: str = ""


# the kernels' δ sources and the lab's own: δ from O_hi + O_lo, two bf16 halves of the fp32 O
LAB_DELTA_SOURCES = DELTA_SOURCES + ("o_hilo",)
# the sources that fix δ: every one but the stored bf16 O
FIXED_DELTA_SOURCES = tuple(source for source in LAB_DELTA_SOURCES if source != "o")
CAP = 20.0  # e^-20 ≈ 2e-9: the tied P̄ is far from 1 and far from underflow
FIXES = {
    "none": Fix("FA2, no fix", {}),
    "beta_tile": Fix("β rule per tile", dict(stable="tile")),
    "beta_cross": Fix("β rule across tiles", dict(stable="cross")),
    "beta_capped": Fix("β rule, offset capped", dict(stable="cross", offset_cap=CAP)),
    "beta_ell_rounded": Fix("β rule, ℓ from rounded P̄", dict(stable="cross", ell_rounded=True)),
    "delta_fp32": Fix("δ from an fp32 O", {}, "o_fp32", 2.0, "stores O in fp32 (or recomputes it)"),
    "delta_hilo": Fix(
        "δ from a bf16 hi/lo pair", {}, "o_hilo", 2.0, "stores O_lo = bf16(O − O_hi)"
    ),
    "delta_dp": Fix("δ from rowsum(dP ∘ P)", {}, "dp", 0.0, "one more pass over K, V"),
}


def upstream_gradient(built: Built, mean: float = -0.5, seed: int = 0) -> torch.Tensor:
    """dO ~ N(mean, 1), rounded to bf16, one per output element (fp64)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    d_out = mean + torch.randn(
        built.v.shape[0], built.q.shape[1], built.v.shape[-1], generator=gen, dtype=torch.float64
    )
    return round_to_dtype(d_out, torch.bfloat16).to(built.v.device)


def delta_from(source: str, built: Built, res, d_out: torch.Tensor) -> torch.Tensor:
    """δ per row (fp32, as a kernel computes it) from the forward result ``res``."""
    d32 = d_out.float()
    if source == "o":
        return (d32 * res.out.float()).sum(-1)
    if source == "o_fp32":
        return (d32 * res.out_fp32.float()).sum(-1)
    if source == "o_hilo":
        o32 = res.out_fp32.float()
        o_hi = round_to_dtype(o32, torch.bfloat16)
        o_lo = round_to_dtype(o32 - o_hi, torch.bfloat16)
        return (d32 * o_hi).sum(-1) + (d32 * o_lo).sum(-1)
    if source == "dp":
        s = built.scores.float()
        p = torch.exp(s - res.lse.float().unsqueeze(-1))  # P = exp(S − L)
        d_p = d32 @ built.v.float().transpose(-1, -2)  # dP = dO Vᵀ
        return (p * d_p).sum(-1)
    raise ValueError(f"unknown δ source {source!r}; one of {LAB_DELTA_SOURCES}")


def output_stats(out: torch.Tensor, o_exact: torch.Tensor) -> dict:
    """Bias, rms, worst case, non-finite count and share equal to the ideal, in bf16 ulps."""
    err = error_in_ulps(out, o_exact)
    fin = err[torch.isfinite(err)]
    ideal = round_to_dtype(o_exact, torch.bfloat16)
    stats = mean_ci(fin)
    return dict(
        bias=stats["mean"],
        se=stats["se"],
        rms=float(fin.pow(2).mean().sqrt()) if fin.numel() else math.nan,
        worst=float(fin.abs().max()) if fin.numel() else math.nan,
        nonfinite=int((~torch.isfinite(err)).sum()),
        same_as_ideal=float((out.double() == ideal).double().mean()),
    )


def delta_stats(delta: torch.Tensor, delta_exact: torch.Tensor) -> dict:
    """δ's error in bf16 ulps of δ (bias, rms) and the summed error Σ(δ − δ_exact)."""
    err = error_in_ulps(delta.double(), delta_exact)
    fin = err[torch.isfinite(err)]
    stats = mean_ci(fin)
    return dict(
        bias=stats["mean"],
        se=stats["se"],
        rms=float(fin.pow(2).mean().sqrt()) if fin.numel() else math.nan,
        sum_error=float((delta.double() - delta_exact).sum()),
        sum_abs_exact=float(delta_exact.abs().sum()),
    )


def measure_fix(
    case: Case, key: str, seed: int = 0, d_out_mean: float = -0.5, device="cpu"
) -> dict:
    """One fix on one case: O and δ statistics, and the ideal's, for comparison."""
    fix = FIXES[key]
    built = build(case, seed, device)
    o_exact = reference(built)
    d_out = upstream_gradient(built, d_out_mean, seed)
    opts = AttentionOptions(scale=1.0, block_n=case.block_n, **fix.forward)
    res = emulator.flash_forward(built.q, built.k, built.v, opts)
    delta_exact = (d_out * o_exact).sum(-1)
    delta_ideal = (d_out * round_to_dtype(o_exact, torch.bfloat16)).sum(-1)
    return dict(
        fix=key,
        label=fix.label,
        out=output_stats(res.out.float(), o_exact),
        delta=delta_stats(delta_from(fix.delta, built, res, d_out), delta_exact),
        delta_ideal=delta_stats(delta_ideal, delta_exact),
        extra_bytes=fix.extra_bytes,
    )


def measure_fixes(
    cases: dict, keys=tuple(FIXES), seed: int = 0, device="cpu", progress: bool = True
) -> list[dict]:
    """Every fix on every named case; one record per (case, fix)."""
    from tqdm.std import tqdm

    jobs = [(name, case, key) for name, case in cases.items() for key in keys]
    records = []
    for name, case, key in tqdm(jobs, desc="fixes", disable=not progress):
        records.append(dict(case=name, **measure_fix(case, key, seed, device=device)))
    return records


DELTA_FIXES = ("delta_fp32", "delta_hilo", "delta_dp")


def delta_numbers(records: list[dict], near_case: str = "0 / −1") -> dict:
    """Chapter 6 section 1's numbers on δ, by glue name, from :func:`measure_fixes`'s
    ``records``; prints the figure's and the table's reading of the β rule where they part
    (tied V near 0, ``near_case``). Raises if the records no longer say what the prose says
    (the δ fixes leave a smaller summed error than no fix in every setting; the β rule across
    tiles reduces it)."""
    by = {(r["case"], r["fix"]): r["delta"] for r in records}
    cases = list(dict.fromkeys(r["case"] for r in records))
    share = {  # |Σ(δ − δ_exact)| / Σ|δ_exact| per fix, one value per setting
        key: [abs(by[c, key]["sum_error"]) / by[c, key]["sum_abs_exact"] for c in cases]
        for key in dict.fromkeys(r["fix"] for r in records)
    }
    delta_shares = [x for key in DELTA_FIXES for x in share[key]]
    gain = [before / after for before, after in zip(share["none"], share["beta_cross"])]
    if not max(delta_shares) < min(share["none"]) or not min(gain) > 1:
        raise ValueError("the prose says the δ fixes and the β rule shrink δ's summed error")
    near, plain = by[near_case, "beta_cross"], by[near_case, "none"]
    ci, rel = 1.96 * near["se"], near["sum_error"] / near["sum_abs_exact"]
    print(
        f"β rule across tiles, V {near_case}: mean error of δ {near['bias']:+.2f} ± "
        f"{ci:.2f} ulp of δ (figure),\n  Σ(δ − δ_exact) / Σ|δ_exact| {rel:+.1e} (table)"
    )
    within = abs(near["bias"]) <= ci
    return {
        "c6_delta_near0_ulp": near["bias"],
        "c6_delta_near0_ci": ci,
        "c6_delta_near0_rel": rel,
        "c6_delta_near0_none_ulp": plain["bias"],
        "c6_delta_near0_within": "zero within" if within else "zero outside",
        "c6_sum_none_lo": min(share["none"]),
        "c6_sum_none_hi": max(share["none"]),
        "c6_sum_delta_lo": min(delta_shares),
        "c6_sum_delta_hi": max(delta_shares),
        "c6_beta_gain_lo": min(gain[:2]),
        "c6_beta_gain_near0": gain[cases.index(near_case)],
    }


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
    says (inside, the storage bias turns into one of the other sign)."""
    rows, ideal = negative["fa2/cross"], negative["ideal"][0]["mean"]
    inside = [r for r in rows if abs(r["rm"]) * 1.2 < exp_rounds_to_one]
    outside = [r for r in rows if abs(r["rm"]) > 0.01]
    for name, part in (("|r_m| < 0.00196", inside), ("|r_m| > 0.01", outside)):
        means = [r["mean"] for r in part]
        same = [r["same_as_ideal"] for r in part]
        lo, hi = f"{min(same):.0%}", f"{max(same):.0%}"
        shown = lo if lo == hi else f"{lo}–{hi}"
        print(
            f"{name:16s}: bias {min(means):+.3f} to {max(means):+.3f} ulp "
            f"(ideal {ideal:+.3f}), equal to the ideal {shown}"
        )
    numbers = {
        "c6_zero_ideal": ideal,
        "c6_zero_inside": sum(r["mean"] for r in inside) / len(inside),
        "c6_zero_inside_same": sum(r["same_as_ideal"] for r in inside) / len(inside),
        "c6_zero_out_lo": min(r["same_as_ideal"] for r in outside),
        "c6_zero_out_hi": max(r["same_as_ideal"] for r in outside),
    }
    if not numbers["c6_zero_inside"] * ideal < 0:
        raise ValueError("the prose says the storage bias turns into one of the other sign")
    return numbers
