"""The fixes explorer's grid: the cross-tile β rule in FA2 numerics over β, ε, the V setting,
the number of tied maxima k and the score gap, next to the ideal bf16(O_exact) and FA2 without
the rule, on the same rows.

One *base* (V preset, spread, k, gap) is one set of rows, built once; the ideal and FA2 are
measured on it once, the rule for every (β, ε). The grid is too large to compute while the book
builds, so it is stored (``python -m kernels.rounding_lab.slider_grid --out results/``, CPU only:
the provenance's gpu is null) and the live widget recomputes one cell with :func:`cell`, which
gives the stored numbers bit for bit (same seed, same rows). On a machine with a GPU the widget
computes on it; ``python -m kernels.rounding_lab.site_explorers --out results/`` times one
update on the CPU and the GPU and says how far the GPU's numbers are from the CPU's.

The rows: ``rm`` is drawn in [0.03, 3.97] and the tied keys after the first sit 0.0015 below it,
rounded to bf16: where ``rm`` ≥ 0.5 that rounds back to ``rm`` (an exact tie); below 0.5 it is a
near-tie 2⁻⁹ or 0.00146 below, which still gets P̄ = 1 but is caught only by ε ≥ 2⁻⁹. Rows with
a large ``rm`` make ℓ underflow at large β: nothing is clipped, the share of NaN/inf outputs is
part of every cell.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from ..attention import emulator
from ..attention.options import AttentionOptions
from ..numerics.rounding import error_in_ulps, round_to_dtype
from .cases import Case, VDist, build, reference

# β − 1 log-spaced below 2, β log-spaced above it
BETAS = (1 + 2**-10, 1 + 2**-8, 1 + 2**-6, 1 + 2**-4, 1.25, 1.5, 2.0, 4.0, 8.0, 16.0, 64.0)
EPSILONS = (0.0, 2**-12, 2**-11, 2**-10, 2**-9, 2**-8, 2**-7, 2**-6)
EPS_CAUGHT = 2**-9  # near-ties whose P̄ rounds to 1 sit up to 2⁻⁹ below the maximum
V_PRESETS = {  # name: (mean of the tied V, mean of the other V)
    "tied −1, other 0": (-1.0, 0.0),
    "all −1 (one sign)": (-1.0, -1.0),
    "tied 0, other −1": (0.0, -1.0),
    "tied +1, other 0": (1.0, 0.0),
}
SPREADS = (0.1, 0.3, 1.0)
TIES = (1, 2, 4)
GAPS = (8.0, 12.0, 16.0)
IMPLS = ("ideal", "fa2", "rule")
FIELDS = ("bias", "bias_se", "rms", "rms_se", "bad")  # ulp, ulp, ulp, ulp, share of outputs
DEFAULT = dict(preset="tied −1, other 0", spread=0.3, ties=2, gap=16.0, beta=2.0, eps=2**-9)
ROWS = dict(n_keys=256, head_dim=16, batch=32, row_max=2.0, row_max_jitter=1.97, tie_jitter=0.0015)


def stats(out: torch.Tensor, exact: torch.Tensor) -> dict:
    """Bias and rms of O in ulps against the exact O (over the finite outputs), each with its
    standard error from the per-sequence means (the rows of one sequence share V, so sequences
    are the independent units), and the share of NaN/inf outputs."""
    err = error_in_ulps(out.float(), exact)
    seq = err.reshape(err.shape[0], -1)
    fin = torch.isfinite(seq)
    bad = 1.0 - float(fin.double().mean())
    if not fin.any():
        return dict(bias=math.nan, bias_se=math.nan, rms=math.nan, rms_se=math.nan, bad=bad)
    zero = torch.zeros_like(seq)
    counts = fin.sum(-1)
    keep = counts > 0
    seq_mean = torch.where(fin, seq, zero).sum(-1)[keep] / counts[keep]
    seq_sq = torch.where(fin, seq.pow(2), zero).sum(-1)[keep] / counts[keep]
    n = int(keep.sum())
    rms = math.sqrt(float(seq[fin].pow(2).mean()))

    def se(x):
        return float(x.std()) / math.sqrt(n) if n > 1 else math.nan

    return dict(
        bias=float(seq[fin].mean()),
        bias_se=se(seq_mean),
        rms=rms,
        rms_se=se(seq_sq) / (2 * rms) if rms > 0 else 0.0,
        bad=bad,
    )


def base_case(preset: str, spread: float, ties: int, gap: float, rows=ROWS) -> Case:
    vt, vr = V_PRESETS[preset]
    return Case(
        ties=int(ties),
        gap=float(gap),
        v_tied=VDist("normal", vt, spread),
        v_rest=VDist("normal", vr, spread),
        **rows,
    )


def _rule(built, beta, eps, block_n):
    opts = AttentionOptions(scale=1.0, block_n=block_n, stable="cross", beta=beta, eps=eps)
    return emulator.flash_forward(built.q, built.k, built.v, opts).out


def base_cells(
    preset, spread, ties, gap, betas=BETAS, epsilons=EPSILONS, seed=0, rows=ROWS, device="cpu"
):
    """Ideal and FA2 on one base's rows, and the rule for every (β, ε): a dict with 'ideal',
    'fa2' (stats) and 'rule' (stats per (β, ε)). The rows are drawn on the CPU (the same rows
    on every device) and computed on ``device``."""
    case = base_case(preset, spread, ties, gap, rows)
    built = build(case, seed, device)
    exact = reference(built)
    off = AttentionOptions(scale=1.0, block_n=case.block_n, stable="off")
    fa2 = emulator.flash_forward(built.q, built.k, built.v, off).out
    with torch.no_grad():
        out = {
            "ideal": stats(round_to_dtype(exact, torch.bfloat16), exact),
            "fa2": stats(fa2, exact),
            "rule": {},
        }
        for beta in betas:
            for eps in epsilons:
                out["rule"][(beta, eps)] = stats(_rule(built, beta, eps, case.block_n), exact)
    return out


def cell(preset, spread, ties, gap, beta, eps, seed=0, rows=ROWS, device="cpu") -> dict:
    """One setting of the explorer, computed now: {'ideal', 'fa2', 'rule'} stats (the widget)."""
    got = base_cells(preset, spread, ties, gap, (beta,), (eps,), seed, rows, device)
    return {"ideal": got["ideal"], "fa2": got["fa2"], "rule": got["rule"][(beta, eps)]}


def _pack(s: dict) -> list:
    return [None if not math.isfinite(s[f]) else s[f] for f in FIELDS]


def grid(seed=0, rows=ROWS, progress=True) -> dict:
    """The whole grid, as stored: axes and, per base (V preset, spread, k, gap) in row-major
    order, the ideal's and FA2's FIELDS and the rule's FIELDS per (β, ε) (β-major)."""
    bases = []
    start = time.perf_counter()
    for preset in V_PRESETS:
        for spread in SPREADS:
            for ties in TIES:
                for gap in GAPS:
                    got = base_cells(preset, spread, ties, gap, seed=seed, rows=rows)
                    bases.append(
                        {
                            "ideal": _pack(got["ideal"]),
                            "fa2": _pack(got["fa2"]),
                            "rule": [_pack(got["rule"][(b, e)]) for b in BETAS for e in EPSILONS],
                        }
                    )
            if progress:
                print(f"{preset}, spread {spread}: {time.perf_counter() - start:.0f} s")
    axes = dict(
        preset=list(V_PRESETS),
        spread=list(SPREADS),
        ties=list(TIES),
        gap=list(GAPS),
        beta=list(BETAS),
        eps=list(EPSILONS),
    )
    return {"axes": axes, "fields": list(FIELDS), "rows": rows, "seed": seed, "bases": bases}


def lookup(stored: dict, preset, spread, ties, gap, beta, eps) -> dict:
    """The stored cell of one setting, as :func:`cell` returns it (NaN where stored null)."""
    ax = stored["axes"]
    i = ax["preset"].index(preset)
    i = (i * len(ax["spread"]) + ax["spread"].index(spread)) * len(ax["ties"])
    i = (i + ax["ties"].index(ties)) * len(ax["gap"]) + ax["gap"].index(gap)
    base = stored["bases"][i]
    j = ax["beta"].index(beta) * len(ax["eps"]) + ax["eps"].index(eps)

    def unpack(values):
        return {f: math.nan if v is None else v for f, v in zip(stored["fields"], values)}

    return {
        "ideal": unpack(base["ideal"]),
        "fa2": unpack(base["fa2"]),
        "rule": unpack(base["rule"][j]),
    }


def largest_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two cells' finite numbers (0.0: identical)."""
    diffs = [
        abs(a[impl][f] - b[impl][f])
        for impl in IMPLS
        for f in FIELDS
        if math.isfinite(a[impl][f]) and math.isfinite(b[impl][f])
    ]
    return max(diffs, default=0.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args(argv)
    from .. import results

    torch.set_num_threads(1)
    data = grid()
    print(
        results.save("fix_explorer", data, "python -m kernels.rounding_lab.slider_grid", args.out)
    )


if __name__ == "__main__":
    main()
