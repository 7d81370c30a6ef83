"""The lab as one function of its sliders (:func:`lab`), its text report and its widget
(the explorer of the bias chapters)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import replace

import numpy as np
import torch

from ..attention import emulator
from ..attention.options import STABLE_MODES, TIE_RULES
from ..numerics.rounding import error_in_ulps, round_to_dtype, ulp_in_dtype
from ..numerics.stats import bias_summary
from .cases import (
    EXP_ROUNDS_TO_ONE,
    PLACEMENTS,
    V_FAMILIES,
    Case,
    VDist,
    build,
    reference,
    residual_in_ulps,
)
from .figures import LabResult, plot_lab
from .implementations import EMULATED, GPU_ONLY, run_case


def largest_rm_rounding_to_one(beta: float) -> float:
    """With m = β·rm the tied entries get P̄ = exp(−(β−1)·rm); in bf16 that is exactly 1.0 when
    (β−1)·rm ≤ −ln(1 − 2⁻⁹) ≈ 0.00196. Returns the largest such rm (fp32 exponent, bf16 P̄)."""
    if not beta > 1:
        raise ValueError(f"beta must be > 1, got {beta}")
    return EXP_ROUNDS_TO_ONE / (beta - 1.0)


def p_bar_of_tied(rm: torch.Tensor, beta: float, numerics: str = "fa2") -> torch.Tensor:
    """P̄ of a tied maximum after the offset rule, as bf16 would see it (brute-force check)."""
    rm = rm.to(torch.float32)
    tied = torch.full_like(rm, 2.0)  # the rule sees a repeated maximum
    m = emulator.offset_rule(rm, tied, beta, emulator.rounding_points(numerics).paper)
    return emulator.p_bar(rm, m, numerics)


# ----------------------------------------------------------------------------------------------
# the lab: one function the sliders call
# ----------------------------------------------------------------------------------------------
def running_error(scores_row, v_col, offset, numerics):
    """Error of the running sum Σ_{t'≤t} P̄[t'] V[t'] along the keys, in fp64 (paper Eq. 5).

    paper: P̄ = bf16(exp(bf16(S − m))); lp(t) = bf16(Σ in fp32), hp(t) = Σ in fp64 of the same P̄V.
    fa2:   lp(t) = the fp32 accumulator Σ bf16(P̄)V (P̄ = exp(S − m) in fp32), hp(t) = Σ in fp64 of
           the exact P·V. The FA2 output is rounded only once, after dividing by ℓ.
    ``ideal`` is bf16(hp(t)) − hp(t): the error of rounding the exact running sum once, the best
    any BF16 running sum can do. ``v_col`` is one column of V (N,) or several (N, D): the errors
    then have one column each. ``m`` is the row's final offset (a tiled kernel changes m between
    tiles; the rescaling by α = exp(m_old − m_new) is an fp32 multiplication and does not change
    the picture)."""
    s = np.asarray(scores_row, dtype=np.float64)
    v = np.asarray(v_col, dtype=np.float64)
    # P̄ as the emulator rounds it, from S − m rounded once to fp32
    p_lp = emulator.p_bar(torch.from_numpy(s - offset).float(), 0.0, numerics).double().numpy()
    w = p_lp.reshape(-1, *([1] * (v.ndim - 1)))
    lp32 = np.add.accumulate((w * v).astype(np.float32), axis=0, dtype=np.float32)  # sequential
    if numerics == "paper":  # bf16 × bf16 is exact in fp32; the paper holds the sum in bf16
        lp = round_to_dtype(torch.from_numpy(lp32), torch.bfloat16).double().numpy()
        hp = np.cumsum(w * v, axis=0)
    else:
        lp = lp32.astype(np.float64)
        hp = np.cumsum(np.exp(s - offset).reshape(w.shape) * v, axis=0)
    ideal = round_to_dtype(torch.from_numpy(hp), torch.bfloat16).numpy() - hp
    return {
        "error": lp - hp,
        "ideal": ideal,
        "p_is_one": np.flatnonzero(p_lp == 1.0),
        "lp": lp,
        "hp": hp,
    }


def sum_errors(built, numerics="paper") -> dict:
    """Eq. (5) at the last key for every output of ``built`` (offset m = the row maximum): the
    error of the running sum Ō (``error``) and of the exact Ō rounded once to BF16 (``ideal``),
    both in ulps of BF16 at the exact Ō, each shaped (batch, rows, columns)."""
    error, ideal = [], []
    for b in range(built.scores.shape[0]):
        for row in built.scores[b].cpu():
            r = running_error(row.numpy(), built.v[b].cpu().numpy(), float(row.max()), numerics)
            unit = ulp_in_dtype(torch.from_numpy(r["hp"][-1])).numpy()
            error.append(r["error"][-1] / unit)
            ideal.append(r["ideal"][-1] / unit)
    shape = (built.scores.shape[0], built.scores.shape[1], -1)
    return {"error": np.reshape(error, shape), "ideal": np.reshape(ideal, shape)}


def near_midpoint(sums: dict, within: float = 1e-3) -> np.ndarray:
    """Which outputs of :func:`sum_errors` have an exact Ō within ``within`` ulp of a point
    halfway between two BF16 numbers: half an ulp less the size of the ideal's error."""
    return 0.5 - np.abs(sums["ideal"]) < within


def lab(
    impl="fa2",
    stable="off",
    ties=2,
    gap=15.6,
    n_keys=1024,
    block_n=64,
    placement="split",
    v_tied_family="normal",
    v_tied_mean=-1.0,
    v_tied_spread=0.3,
    v_rest_family="normal",
    v_rest_mean=0.0,
    v_rest_spread=0.3,
    beta=2.0,
    eps=1e-3,
    offset=0.0,
    row_max=2.0,
    row_max_jitter=1.0,
    rest_spread=1.0,
    tie_jitter=0.0,
    do_mean=-0.5,
    batch=16,
    head_dim=64,
    seed=0,
    device="cpu",
) -> LabResult:
    """Everything the chapter's sliders show, for one setting. Never raises for slider values:
    what goes wrong (impossible placement, β ≤ 1, NaN, underflow, overflow) becomes a message."""
    params = {k: v for k, v in locals().items()}
    messages = []
    empty = LabResult(
        params,
        bias_summary(torch.full((1, 1), math.nan)),
        np.array([]),
        {},
        messages,
        math.nan,
        None,
        None,
        math.nan,
    )
    try:
        case = Case(
            n_keys=int(n_keys),
            ties=int(ties),
            gap=float(gap),
            rest_spread=rest_spread,
            row_max=row_max,
            row_max_jitter=row_max_jitter,
            tie_jitter=tie_jitter,
            placement=placement,
            block_n=int(block_n),
            head_dim=int(head_dim),
            batch=int(batch),
            v_tied=VDist(v_tied_family, v_tied_mean, v_tied_spread),
            v_rest=VDist(v_rest_family, v_rest_mean, v_rest_spread),
        )
        try:
            case.check()
        except ValueError as exc:
            if placement == "any" or not 1 <= int(ties) <= int(n_keys):
                raise
            messages.append(f"{exc}; the tied keys were placed at random positions instead.")
            case = replace(case, placement="any")
        built = build(case, seed, device)
    except (ValueError, TypeError) as exc:
        messages.append(f"cannot build this case: {exc}")
        return empty
    with np.errstate(all="ignore"):
        try:
            res = run_case(
                impl, built, stable=stable, beta=beta, eps=eps, offset=offset, block_n=case.block_n
            )
        except (ValueError, TypeError, RuntimeError, ImportError) as exc:
            messages.append(f"{impl}/{stable} did not run: {exc}")
            return empty
        o_hp = reference(built)
        err = error_in_ulps(res.out, o_hp)
        stats = bias_summary(err)
        counts, more = _counts(built, res, o_hp, case, impl, stable, beta, eps)
        messages += more
        running = _running_for_row(built, res, impl, o_hp) if impl in EMULATED else None
        d_o = (
            torch.randn(
                o_hp.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64
            ).to(o_hp.device)
            + do_mean
        )
        delta_lp = (d_o.float() * res.out.float()).sum(-1).double()
        delta_hp = (d_o * o_hp).sum(-1)
        delta_diff = (delta_lp - delta_hp).flatten().cpu().numpy()
    finite = err[torch.isfinite(err)].cpu().numpy()
    return LabResult(
        params,
        stats,
        finite,
        counts,
        messages,
        residual_in_ulps(built, o_hp),
        running,
        delta_diff,
        float(np.nansum(delta_diff)),
    )


def _counts(built, res, o_hp, case, impl, stable, beta, eps):
    s = built.scores
    rm = s.amax(-1, keepdim=True)
    exact_ties = (s == rm).sum(-1)
    near = (s >= rm - eps).sum(-1)
    window = (s >= rm - EXP_ROUNDS_TO_ONE).sum(-1)
    out = res.out
    counts = {
        "rows": int(exact_ties.numel()),
        "rows with repeated maxima (exact)": int((exact_ties > 1).sum()),
        "rows with > 1 score within ε of the max": int((near > 1).sum()),
        "rows with > 1 score within 2^-9 of the max (P̄ rounds to 1)": int((window > 1).sum()),
        "NaN outputs": int(torch.isnan(out).sum()),
        "inf outputs": int(torch.isinf(out).sum()),
    }
    messages = []
    if res.row_offset is not None:
        m = res.row_offset.unsqueeze(-1)
        p_bar = emulator.p_bar(s, m, "paper" if impl.startswith("paper") else "fa2")
        counts["entries with P̄ = 1 (final offset m)"] = int((p_bar == 1.0).sum())
        if stable != "off":  # with the rule off nothing looks for ties
            counts["rows where the β rule saw a tie"] = int(res.ties_seen.sum())
        ell = res.row_sum
        counts["rows with ℓ = 0 (underflow)"] = int((ell == 0).sum())
        if (ell == 0).any():
            messages.append(
                f"ℓ underflowed to 0 in {int((ell == 0).sum())} rows: "
                "exp(S − m) is 0 for every key, so O = Ō/ℓ = 0/0 (NaN). "
                "β·r_m is too large (Appendix C)."
            )
        tiny = (ell > 0) & (ell < 2.0**-126)
        if tiny.any():
            messages.append(
                f"ℓ is subnormal in {int(tiny.sum())} rows: P̄ is flushed to 0 in "
                "bf16, so O comes out 0 (or NaN) — silent underflow."
            )
        several_ones = (p_bar == 1.0).sum(-1) > 1
        counts["rows with ≥ 2 entries P̄ = 1"] = int(several_ones.sum())
        if stable in TIE_RULES and several_ones.any():
            why = []
            if stable == "tile":
                why.append("ties split across tiles are invisible to the per-tile rule")
            if eps < EXP_ROUNDS_TO_ONE:
                why.append(f"ε = {eps:g} < 2^-9 ≈ 0.00196 misses near-ties whose P̄ rounds to 1")
            why.append(f"(β−1)·rm ≤ {EXP_ROUNDS_TO_ONE:.5f} makes exp(−(β−1)·rm) round back to 1")
            why.append("a tied maximum of exactly 0 fires neither branch")
            messages.append(
                f"{int(several_ones.sum())} rows still hold ≥ 2 entries with P̄ = 1 "
                f"after the offset rule; possible reasons: {'; '.join(why)}."
            )
        zero_rm = (exact_ties > 1) & (s.amax(-1) == 0)
        if stable in TIE_RULES and zero_rm.any():
            messages.append(
                f"{int(zero_rm.sum())} rows have a tied maximum of exactly 0: "
                "the rule has no branch for rm = 0, so m = rm and P̄ = 1 stays."
            )
    if counts["NaN outputs"]:
        messages.append(f"{counts['NaN outputs']} outputs are NaN.")
    if counts["inf outputs"]:
        messages.append(
            f"{counts['inf outputs']} outputs are ±inf (bf16 overflow: |V| too large "
            "for the accumulator or the output)."
        )
    if not torch.isfinite(built.v).all():
        messages.append("some V values overflow bf16 (|V| > 3.39e38) and are ±inf already.")
    if not torch.isfinite(o_hp).all():
        messages.append("the fp64 reference itself is not finite for some rows (inf V).")
    if stable in TIE_RULES and not (beta > 1):
        messages.append(f"β = {beta} must be > 1.")
    return counts, messages


def _running_for_row(built, res, impl, o_hp):
    """Fig. 6c: the running error of Ō for the first row and the column with the largest error."""
    s_row = built.scores[0, 0].cpu()
    m = float(res.row_offset[0, 0]) if res.row_offset is not None else float(s_row.max())
    if not math.isfinite(m):
        return None
    errs = (res.out[0, 0].double().cpu() - o_hp[0, 0].cpu()).abs()
    errs = torch.nan_to_num(errs, nan=-1.0)
    col = int(errs.argmax())
    r = running_error(s_row.numpy(), built.v[0, :, col].cpu().numpy(), m, impl.split("-")[0])
    final = r["hp"][-1]
    unit = float(ulp_in_dtype(torch.tensor(final))) if final != 0 else 1.0
    o_lp, o_exact = float(res.out[0, 0, col]), float(o_hp[0, 0, col])
    ell = float(np.exp(s_row.double().numpy() - m).sum())  # exact ℓ for this offset
    r.update(column=col, unit=unit, offset=m, final_output_error=(o_lp - o_exact) * ell)
    return r


def lab_text(result: LabResult) -> str:
    """The printed part of the lab: verdict, numbers and messages."""
    p, st = result.params, result.stats
    lines = [
        f"impl={p['impl']!r}, stable={p['stable']!r}: k={p['ties']} tied maxima, gap={p['gap']}, "
        f"N={p['n_keys']}, tile={p['block_n']} ({p['placement']})",
        f"  non-max tokens move O by {result.residual_ulps:.3g} ulp (median over the outputs)",
        f"  mean error {st['mean']:+.4f} ulp, 95% CI [{st['lo']:+.4f}, {st['hi']:+.4f}] "
        f"over {st['n_elements']} outputs",
        f"  -> {st['verdict']}",
        f"  δ's error summed over the "
        f"{0 if result.delta_diff is None else result.delta_diff.size} rows, "
        f"Σ_T (δ_lp − δ_hp): {result.delta_sum:+.4g}",
    ]
    # The counts in a few lines of at most 88 characters (the site's text column), grouped
    # as rows and outputs, no count split across two lines; then the messages, wrapped.
    counts = dict(result.counts)
    n_rows = counts.pop("rows", None)
    rows = {k[len("rows ") :]: counts.pop(k) for k in list(counts) if k.startswith("rows ")}
    outputs = {k.split()[0]: counts.pop(k) for k in ("NaN outputs", "inf outputs") if k in counts}

    def block(head, items):
        text = "; ".join(f"{k}: {v:,}".replace(" ", "\0") for k, v in items.items())
        return [
            line.replace("\0", " ")
            for line in textwrap.wrap(text, 88, initial_indent=head, subsequent_indent="      ")
        ]

    if rows:
        lines += block(f"  of {n_rows:,} rows: " if n_rows is not None else "  rows ", rows)
    lines += block("  outputs: ", outputs) if outputs else []
    lines += block("  ", counts) if counts else []
    for m in result.messages:
        lines += textwrap.wrap(m, 88, initial_indent="  ! ", subsequent_indent="    ")
    return "\n".join(lines)


def show(panels=("errors", "running", "delta"), **params):
    """Run :func:`lab`, print :func:`lab_text` and draw :func:`plot_lab` (the widget's body)."""
    import matplotlib.pyplot as plt

    result = lab(**params)
    print(lab_text(result))
    plot_lab(result, panels=panels)
    plt.show()
    return result


def widget(device="cpu"):
    """The interactive lab (ipywidgets). Returns the widget box to display."""
    import ipywidgets as w

    impls = ["fa2", "paper", "paper-untiled", "ideal"] + (
        list(GPU_ONLY[:3]) if device != "cpu" else []
    )
    fam = list(V_FAMILIES)
    style = {"description_width": "110px"}

    def fs(desc, val, lo, hi, step):
        return w.FloatSlider(
            value=val,
            min=lo,
            max=hi,
            step=step,
            description=desc,
            style=style,
            continuous_update=False,
        )

    c = {
        "impl": w.Dropdown(options=impls, value="fa2", description="implementation", style=style),
        "stable": w.Dropdown(
            options=list(STABLE_MODES), value="off", description="stabilization", style=style
        ),
        "ties": w.IntSlider(
            value=2,
            min=1,
            max=64,
            description="tied maxima k",
            style=style,
            continuous_update=False,
        ),
        "gap": fs("gap below max", 15.6, 0.0, 40.0, 0.1),
        "n_keys": w.Dropdown(
            options=[64, 128, 256, 512, 1024, 2048, 4096],
            value=1024,
            description="sequence N",
            style=style,
        ),
        "block_n": w.Dropdown(
            options=[16, 32, 64, 128, 256], value=64, description="tile", style=style
        ),
        "placement": w.Dropdown(
            options=list(PLACEMENTS), value="split", description="tied keys", style=style
        ),
        "v_tied_family": w.Dropdown(
            options=fam, value="normal", description="V tied: family", style=style
        ),
        "v_tied_mean": fs("V tied: mean", -1.0, -4.0, 4.0, 0.05),
        "v_tied_spread": fs("V tied: spread", 0.3, 0.0, 2.0, 0.05),
        "v_rest_family": w.Dropdown(
            options=fam, value="normal", description="V rest: family", style=style
        ),
        "v_rest_mean": fs("V rest: mean", 0.0, -4.0, 4.0, 0.05),
        "v_rest_spread": fs("V rest: spread", 0.3, 0.0, 2.0, 0.05),
        "beta": w.FloatText(value=2.0, description="β", style=style),
        "eps": w.FloatText(value=1e-3, description="ε", style=style),
        "offset": w.FloatText(value=-0.5, description="fixed offset", style=style),
        "row_max": w.FloatText(value=2.0, description="row max rm", style=style),
        "do_mean": fs("dO mean", -0.5, -3.0, 3.0, 0.1),
    }
    out = w.interactive_output(lambda **kw: show(device=device, batch=8, **kw), c)
    left = w.VBox(
        [
            c[k]
            for k in (
                "impl",
                "stable",
                "ties",
                "gap",
                "n_keys",
                "block_n",
                "placement",
                "beta",
                "eps",
            )
        ]
    )
    right = w.VBox(
        [
            c[k]
            for k in (
                "v_tied_family",
                "v_tied_mean",
                "v_tied_spread",
                "v_rest_family",
                "v_rest_mean",
                "v_rest_spread",
                "offset",
                "row_max",
                "do_mean",
            )
        ]
    )
    return w.VBox([w.HBox([left, right]), out])
