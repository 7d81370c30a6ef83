"""The bias sweep over (ties, gap, V means, implementation) and what it finds.

``python -m kernels.rounding_lab.sweep`` writes the CPU sweep to ``results/lab_sweep_cpu.json``."""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import numpy as np
import torch

from ..attention import emulator, registry
from ..attention.options import AttentionOptions
from ..numerics.rounding import error_in_ulps, round_to_dtype, ulp_in_dtype
from ..numerics.stats import NEGLIGIBLE_ULP, bias_summary, is_biased
from .cases import Built, Case, build, reference, residual_in_ulps, small_lab_case
from .fixes import FIXES
from .implementations import measure, run_case

# ----------------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------------
SWEEP_TIES = (1, 2, 4, 8)
SWEEP_V = ((-1.0, 0.0), (-1.0, -1.0), (0.0, -1.0), (1.0, 0.0))  # (tied mean, rest mean)
SWEEP_GAPS = (10.0, 12.0, 13.0, 14.0, 15.0, 16.0)
SWEEP_IMPLS = (
    "ideal",
    "fa2/off",
    "fa2/tile",
    "fa2/cross",
    "paper/off",
    "paper/tile",
    "paper/cross",
    "paper-untiled/off",
    "paper-untiled/cross",
)


def sweep_cases(ties=SWEEP_TIES, gaps=SWEEP_GAPS, v_means=SWEEP_V, base: Case | None = None):
    """The (case, key) grid of the sweep; the key is a dict of the swept values."""
    base = Case() if base is None else base
    for k in ties:
        for gap in gaps:
            for vt, vr in v_means:
                case = replace(
                    base,
                    ties=k,
                    gap=gap,
                    v_tied=replace(base.v_tied, mean=vt),
                    v_rest=replace(base.v_rest, mean=vr),
                )
                yield case, {"ties": k, "gap": gap, "v_tied_mean": vt, "v_rest_mean": vr}


def sweep(
    ties=SWEEP_TIES,
    gaps=SWEEP_GAPS,
    v_means=SWEEP_V,
    impls=SWEEP_IMPLS,
    base: Case | None = None,
    beta=2.0,
    eps=1e-3,
    seed=0,
    device="cpu",
    pairs=(),
    progress=True,
):
    """Bias for every cell × implementation. Each cell's inputs come from ``seed + cell index``
    and are built on the CPU, so every device sees identical inputs. ``pairs`` lists (a, b)
    implementation labels compared element by element on the same inputs. Returns records:
    one per cell × implementation, plus one per cell × pair (``impl`` = 'a vs b')."""
    from tqdm.std import tqdm

    cells = list(sweep_cases(ties, gaps, v_means, base))
    records = []
    for i, (case, key) in enumerate(tqdm(cells, desc="sweep", disable=not progress)):
        built = build(case, seed + i)
        checksum = float(built.v.double().sum() + built.scores.double().sum())
        if device != "cpu":
            built = Built(
                *(
                    t.to(device)
                    for t in (built.q, built.k, built.v, built.scores, built.tie_pos, built.row_max)
                )
            )
        o_hp = reference(built)
        common = {
            **key,
            "residual_ulps": residual_in_ulps(built, o_hp),
            "cell": i,
            "input_checksum": checksum,
        }
        outs = {}
        for label in impls:
            impl, stable = registry.split(label)
            try:
                outs[label] = run_case(
                    impl, built, stable=stable, beta=beta, eps=eps, block_n=case.block_n
                ).out
            except Exception as exc:  # a GPU backend that refuses this shape: recorded, not fatal
                records.append(
                    {**common, "impl": label, "error": f"{type(exc).__name__}: {exc}"[:300]}
                )
                continue
            stats = bias_summary(error_in_ulps(outs[label], o_hp))
            stats["correctly_rounded"] = float(
                (outs[label].double() == round_to_dtype(o_hp, torch.bfloat16)).double().mean()
            )
            records.append({**common, "impl": label, **stats})
        for a, b in pairs:
            if a in outs and b in outs:
                diff = error_in_ulps(outs[a], o_hp) - error_in_ulps(outs[b], o_hp)
                stats = bias_summary(diff)
                stats["identical"] = float((outs[a] == outs[b]).double().mean())
                records.append({**common, "impl": f"{a} vs {b}", **stats})
    return records


def sweep_config(base: Case | None = None, **kw) -> dict:
    base = Case() if base is None else base
    cfg = asdict(base)
    cfg.update({k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()})
    return cfg


def save_cpu_sweep(beta=2.0, eps=1e-3, seed=0) -> str:
    """Recompute the chapter's sweep on the CPU and store it as results/lab_sweep_cpu.json."""
    from .. import results

    records = sweep(beta=beta, eps=eps, seed=seed)
    config = sweep_config(
        ties=SWEEP_TIES,
        gaps=SWEEP_GAPS,
        v_means=SWEEP_V,
        impls=SWEEP_IMPLS,
        beta=beta,
        eps=eps,
        seed=seed,
    )
    return results.save(
        "lab_sweep_cpu",
        {"config": config, "records": records},
        "python -m kernels.rounding_lab.sweep",
    )


def sweep_table(records):
    """Records as a pandas DataFrame (one row per cell × implementation)."""
    import pandas as pd

    return pd.DataFrame(records)


# ----------------------------------------------------------------------------------------------
# β, ε and the offset rule
# ----------------------------------------------------------------------------------------------


def _cells(records, impl):
    return {r["cell"]: r for r in records if r["impl"] == impl and "mean" in r}


def sweep_findings(records) -> dict:
    """The verdicts the chapter states, computed from sweep records."""

    def biased(r):
        return is_biased(r)

    out = {}
    fa2, cross, tile, ideal = (
        _cells(records, x) for x in ("fa2/off", "fa2/cross", "fa2/tile", "ideal")
    )
    paper, paper_x = _cells(records, "paper-untiled/off"), _cells(records, "paper-untiled/cross")
    paper_t, paper_tx = _cells(records, "paper/off"), _cells(records, "paper/cross")
    out["cells"] = len(fa2)
    diffs = sorted(abs(fa2[c]["mean"] - ideal[c]["mean"]) for c in fa2)
    out["fa2 - ideal: median |difference|"] = diffs[len(diffs) // 2]
    out["fa2 - ideal: max |difference|"] = diffs[-1]
    out["fa2 - ideal: cell of max"] = max(fa2, key=lambda c: abs(fa2[c]["mean"] - ideal[c]["mean"]))
    out["fa2 median fraction correctly rounded"] = float(
        np.median([r["correctly_rounded"] for r in fa2.values()])
    )
    out["fa2 biased cells"] = sorted(c for c, r in fa2.items() if biased(r))
    out["fa2 biased, k = 1"] = [c for c in out["fa2 biased cells"] if fa2[c]["ties"] == 1]
    out["fa2 biased, k >= 2"] = [c for c in out["fa2 biased cells"] if fa2[c]["ties"] > 1]
    out["fa2 biased k >= 2, |bias| >= 0.1"] = [
        c for c in out["fa2 biased, k >= 2"] if abs(fa2[c]["mean"]) >= 0.1
    ]
    out["fa2 biased, gap <= 12"] = [c for c in out["fa2 biased cells"] if fa2[c]["gap"] <= 12]
    out["fa2 k=1 largest |bias|"] = max(
        (c for c in fa2 if fa2[c]["ties"] == 1), key=lambda c: abs(fa2[c]["mean"])
    )
    out["fa2 biased k >= 2, cross removes"] = [
        c for c in out["fa2 biased, k >= 2"] if not biased(cross[c])
    ]
    out["fa2 biased k >= 2, cross leaves"] = [
        c for c in out["fa2 biased, k >= 2"] if biased(cross[c])
    ]
    out["fa2 biased k = 1, cross leaves"] = [
        c for c in out["fa2 biased, k = 1"] if biased(cross[c])
    ]
    out["fa2 unbiased, cross adds bias"] = sorted(
        c for c, r in fa2.items() if not biased(r) and biased(cross[c])
    )
    out["fa2 biased, tile removes"] = sorted(
        c for c in out["fa2 biased cells"] if not biased(tile[c])
    )
    out["paper (untiled) biased cells"] = sorted(c for c, r in paper.items() if biased(r))
    out["paper biased where fa2 is not"] = sorted(
        c for c, r in paper.items() if biased(r) and not biased(fa2[c])
    )
    out["paper (untiled) biased, cross leaves"] = sorted(
        c for c in out["paper (untiled) biased cells"] if biased(paper_x[c])
    )
    out["paper (tiled) biased cells"] = sorted(c for c, r in paper_t.items() if biased(r))
    out["paper (tiled) biased, cross leaves"] = sorted(
        c for c in out["paper (tiled) biased cells"] if biased(paper_tx[c])
    )
    return out


def describe_cells(records, cells, impl="fa2/off") -> str:
    """'k=2 gap=16 V(-1,+0): +0.198 ±0.002; ...' for the given cell indices."""
    by = _cells(records, impl)
    parts = [
        f"k={by[c]['ties']} gap={by[c]['gap']:g} V({by[c]['v_tied_mean']:+g},"
        f"{by[c]['v_rest_mean']:+g}): {by[c]['mean']:+.3f}±{by[c]['se']:.3f}"
        for c in cells
        if c in by
    ]
    return "; ".join(parts) if parts else "none"


def compare_devices(
    cpu_records,
    gpu_records,
    pairs=(
        ("fa2/off", "sdpa-flash"),
        ("fa2/off", "sdpa-cudnn"),
        ("fa2/off", "sdpa-efficient"),
        ("fa2/off", "fa2/off"),
        ("paper/off", "paper/off"),
        ("fa2/cross", "triton/cross"),
    ),
):
    """z = (GPU mean − CPU mean) / √(se_gpu² + se_cpu²) per cell, for (cpu impl, gpu impl) pairs.
    Returns {pair label: {'max_abs_z', 'z' (list), 'same_inputs'}}; pairs the GPU lacks are
    skipped."""
    out = {}
    for cpu_impl, gpu_impl in pairs:
        c, g = _cells(cpu_records, cpu_impl), _cells(gpu_records, gpu_impl)
        common = sorted(set(c) & set(g))
        if not common:
            continue
        z = []
        for i in common:
            se = math.hypot(c[i]["se"], g[i]["se"])
            d = g[i]["mean"] - c[i]["mean"]
            z.append(0.0 if d == 0 else (d / se if se > 0 else math.inf))
        same = all(c[i].get("input_checksum") == g[i].get("input_checksum") for i in common)
        out[f"GPU {gpu_impl} vs CPU {cpu_impl}"] = {
            "max_abs_z": max(abs(x) for x in z),
            "z": z,
            "cells": common,
            "same_inputs": same,
            "max_abs_diff": max(abs(g[i]["mean"] - c[i]["mean"]) for i in common),
        }
    return out


def fixed_offset_bias(offsets, case: Case | None = None, numerics=("fa2", "paper"), seed=0):
    """Bias with m = running max + offset (Appendix C's fixed offset) for each offset:
    {numerics: [measure(...) per offset]}; ``"ideal"`` among ``numerics`` gives the baseline."""
    case = small_lab_case(ties=2) if case is None else case
    built = build(case, seed)
    return {
        num: [measure(case, num, "offset", offset=o, built=built) for o in offsets]
        for num in numerics
    }


def offset_rounding(offsets) -> np.ndarray:
    """How a tied P̄ = e^(−c) is rounded to BF16 under a fixed offset c: bf16(e^−c)/e^−c − 1,
    with e^−c computed in fp32 as FA2 numerics do (the same relative error in every row)."""
    exact = torch.exp(-torch.as_tensor(offsets, dtype=torch.float64))
    p32 = exact.to(torch.float32).double()
    return (round_to_dtype(p32, torch.bfloat16) / exact - 1).numpy()


def _scan_rows(row_maxes, ties, rel_jitter, batch, seed):
    """For each r_m: (r_m, its Case, the built rows, the exact O and the ideal bf16(O_exact))."""
    for rm in row_maxes:
        rm = float(rm)
        jitter = rel_jitter * abs(rm)
        case = small_lab_case(ties=ties, row_max=rm, row_max_jitter=jitter, batch=batch)
        built = build(case, seed)
        exact = reference(built)
        yield rm, case, built, exact, round_to_dtype(exact, torch.bfloat16)


FAR_ULPS = 8  # an output this many ulps from the exact O is wrong, not rounded (FA2: < 1)


def row_max_scan(row_maxes, impls, *, ties=2, rel_jitter=0.0, beta=2.0, batch=2, seed=0) -> dict:
    """Rows whose (tied) maximum sits at each r_m of ``row_maxes`` (drawn within ±rel_jitter·|r_m|;
    ``batch`` sequences of 32 rows), through each implementation label of ``impls``
    ('fa2/always', 'ideal', ...).

    Returns {label: [one dict per r_m]} with the bias of the finite outputs against the exact O
    (``mean``, ``se``), the share equal to the ideal bf16(O_exact) (``same_as_ideal``), the share
    of outputs that are wrong without a doubt (``wrong``: NaN or inf, exactly 0 where the exact
    O is not, or more than :data:`FAR_ULPS` ulps from it) and, for emulated rules, the share
    of rows whose ℓ is 0 (``ell_zero``: O is NaN) or
    subnormal (``ell_subnormal``)."""
    out = {label: [] for label in impls}
    for rm, case, built, exact, ideal in _scan_rows(row_maxes, ties, rel_jitter, batch, seed):
        for label in impls:
            impl, stable = registry.split(label)
            res = run_case(impl, built, stable=stable, beta=beta, block_n=case.block_n)
            o = res.out.double()
            zero = (o == 0) & (exact != 0)
            err = error_in_ulps(res.out, exact)
            stats = bias_summary(torch.where(zero, torch.full_like(err, math.nan), err))
            row = {
                "rm": rm,
                "mean": stats["mean"],
                "se": stats["se"],
                "same_as_ideal": float((o == ideal).double().mean()),
                "wrong": float(
                    (~torch.isfinite(o) | zero | (err.abs() > FAR_ULPS)).double().mean()
                ),
                "ell_zero": None,
                "ell_subnormal": None,
            }
            if res.row_sum is not None:
                ell = res.row_sum.double()
                row["ell_zero"] = float((ell == 0).double().mean())
                row["ell_subnormal"] = float(((ell > 0) & (ell < 2.0**-126)).double().mean())
            out[label].append(row)
    return out


def tied_p_error(built: Built, *, block_n=64, eps=1e-3) -> torch.Tensor:
    """The m = 0 rule's rounding of the tied P̄, alone: for each row (B, D) of a case whose row
    maximum r_m < 0, the mean over its tied entries of P̄'s relative error
    P̄ / e^(s − m) − 1, with P̄ = bf16(e^(s − m)) as FA2 numerics form it (fp32 exp).

    An entry is taken at m = 0 once the cross rule has seen a tied maximum in the keys so far
    (this one's tile included): usually from the first tile on, since the other scores' own
    maximum is tied in BF16 too. A tied entry met before that is taken at m = its running
    maximum, which for the first tie gives P̄ = 1 exactly. The offset m of each tile is the
    emulator's own (:func:`kernels.attention.emulator.offset_update`, rule "cross")."""
    s = built.scores.to(torch.float32)
    if not bool((built.row_max < 0).all()):
        raise ValueError("tied_p_error models the m = 0 branch: every row maximum must be < 0")
    n = s.shape[-1]
    opts = AttentionOptions(stable="cross", eps=eps)
    r = emulator.rounding_points("fa2")
    m = torch.full(s.shape[:-1], -math.inf, dtype=s.dtype, device=s.device)  # (B, D)
    rm, rs = torch.full_like(m, -math.inf), torch.zeros_like(m)  # running max and tie count
    b, k = built.tie_pos.shape
    err = torch.zeros((b, s.shape[1], k), dtype=torch.float64, device=s.device)  # (B, D, k)
    for start in range(0, n, block_n):
        m, rm, rs, _ = emulator.offset_update(s[..., start : start + block_n], m, rm, rs, opts, r)
        for i in range(k):
            pos = built.tie_pos[:, i]
            here = (pos >= start) & (pos < start + block_n)  # (B,)
            st = s[torch.arange(b, device=s.device), :, pos]  # (B, D): the tied score of every row
            p = emulator.p_bar(st, m, "fa2").double()
            rel = p / torch.exp(st.double() - m.double()) - 1
            err[..., i] = torch.where(here.unsqueeze(-1), rel, err[..., i])
    return err.mean(-1)


def tied_rounding_scan(row_maxes, *, ties=2, rel_jitter=0.0, batch=2, seed=0, eps=1e-3):
    """What :func:`tied_p_error` alone predicts for the rows of :func:`row_max_scan` (the same
    r_m < 0, jitter, batch and seed): O = bf16(O_exact·(1 + ē)), ē the row's tied P̄ error.

    One dict per r_m: ``mean`` and ``se`` of the error in ulps (as the scan measures it),
    ``same_as_ideal``, ``shift`` (the mean move ē·O_exact before O is rounded, in ulps of O)
    and ``rounded_down`` (the share of rows whose tied P̄ is below e^(r_m): ē < 0)."""
    out = []
    for rm, case, built, exact, ideal in _scan_rows(row_maxes, ties, rel_jitter, batch, seed):
        e_bar = tied_p_error(built, block_n=case.block_n, eps=eps).unsqueeze(-1)
        o = round_to_dtype(exact * (1 + e_bar), torch.bfloat16)
        stats = bias_summary(error_in_ulps(o, exact))
        row = {"rm": rm, "mean": stats["mean"], "se": stats["se"]}
        row["same_as_ideal"] = float((o == ideal).double().mean())
        row["shift"] = float((e_bar * exact / ulp_in_dtype(ideal)).mean())
        row["rounded_down"] = float((e_bar < 0).double().mean())
        out.append(row)
    return out


def compare_settings(settings: dict, impls, seed=0, **run_kw) -> dict:
    """{setting name: {impl label: bias summary}} for Cases given by name (small, live)."""
    out = {}
    for name, case in settings.items():
        built = build(case, seed)
        out[name] = {}
        for label in impls:
            impl, stable = registry.split(label)
            out[name][label] = measure(case, impl, stable, built=built, **run_kw)
    return out


IMPL_WORDS = {  # the lab's implementation names as a table's column heads: the fixes' labels
    "fa2/off": FIXES["none"].label,
    "fa2/tile": FIXES["beta_tile"].label,
    "fa2/cross": FIXES["beta_cross"].label,
}


def print_compare(table: dict) -> None:
    """Print :func:`compare_settings`' result as a table: one row per setting, one column per
    implementation (headed in words, :data:`IMPL_WORDS`), each cell the mean error ± its 95%
    interval, starred when biased."""
    impls = list(dict.fromkeys(impl for row in table.values() for impl in row))
    heads = {impl: IMPL_WORDS.get(impl, impl) for impl in impls}
    cols = {impl: max(17, len(heads[impl]) + 2) for impl in impls}
    width = max(len(name) for name in table) + 2

    def cell(st):
        star = "*" if is_biased(st) else " "
        return f"{st['mean']:+.3f} ± {1.96 * st['se']:.3f}{star}"

    print(
        f"mean error of O [ulp] ± 95% interval; * biased (|mean| beyond the interval and "
        f"≥ {NEGLIGIBLE_ULP:g})"
    )
    print(" " * width + "".join(f"{heads[i]:>{cols[i]}s}" for i in impls))
    for name, row in table.items():
        print(
            f"{name:{width}s}"
            + "".join(f"{cell(row[i]):>{cols[i]}s}" if i in row else " " * cols[i] for i in impls)
        )


if __name__ == "__main__":
    print(save_cpu_sweep())
