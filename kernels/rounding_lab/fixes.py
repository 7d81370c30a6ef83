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
    d32 = d_out.float()  # an unknown source is refused by delta_rowsum, naming the known ones
    if source == "dp":
        p = torch.exp(built.scores.float() - res.lse.float().unsqueeze(-1))  # P = exp(S − L)
        d_p = d32 @ built.v.float().transpose(-1, -2)  # dP = dO Vᵀ
        return emulator.delta_rowsum("dp", d32, d_probs=d_p, probs=p)
    return emulator.delta_rowsum(source, d32, out=res.out.float(), out_fp32=res.out_fp32.float())


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
