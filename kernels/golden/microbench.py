"""Golden et al.'s microbenchmark with the book's implementations: precision, sequence
length and tile sweeps of the forward output.

Every sweep returns plain records (lists of dicts of numbers and names), so a chapter
plots what it computed on the CPU and what ``python -m kernels.golden.gpu`` stored from
a GPU with the same functions. An error is a :func:`deviation` of an output from a
reference: ``max_abs`` (Golden's "max difference", an upper bound), ``mean_abs`` and
``std_abs`` of |difference| (their Fig. 5b), and ``rel_norm`` = ‖out − ref‖ / ‖ref‖
(chapter 3's measure).

Two kinds of inputs: Gaussian Q, K, V (what Golden et al. used) and *sink rows*, rows
whose maximum score is repeated exactly (the bias chapters' construction,
:mod:`kernels.rounding_lab.cases`)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from ..numerics.rounding import error_in_ulps
from ..rounding_lab import cases
from . import implementations as impl
from .implementations import FORMATS, format_dtype, format_name, golden, ideal, work_dtype


@dataclass
class Inputs:
    """Q, K, V (fp32 tensors, (..., N, d)), the score scale, and a name for the
    records."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float | None
    name: str

    @property
    def n(self) -> int:
        return self.k.shape[-2]


def gaussian_inputs(n: int, d: int = 64, heads: int = 2, seed: int = 0, device="cpu") -> Inputs:
    """Q, K, V ~ N(0, 1), shape (1, heads, n, d); scale 1/√d (scores ~ N(0, 1))."""
    if n < 1 or d < 1 or heads < 1:
        raise ValueError(f"n, d and heads must be >= 1, got {n}, {d}, {heads}")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, d, generator=gen).to(device) for _ in range(3))
    return Inputs(q, k, v, None, "gaussian")


# Sink rows: two tied maxima in different key tiles, the other scores ``gap`` below; V
# of the
# tied keys and of the rest drawn around the given means (spread 0.3). The bias
# chapters' settings.
SINK_SETTINGS = {
    "tied V 0, rest -1": dict(v_tied=(0.0, 0.3), v_rest=(-1.0, 0.3), gap=15.6),
    "tied V -1, rest 0": dict(v_tied=(-1.0, 0.3), v_rest=(0.0, 0.3), gap=15.6),
    "tied V -1, rest 0, gap 11.4": dict(v_tied=(-1.0, 0.3), v_rest=(0.0, 0.3), gap=11.4),
}


def sink_inputs(
    n: int, setting: str = "tied V 0, rest -1", seed: int = 0, device="cpu", **case
) -> Inputs:
    """Rows whose maximum score is repeated exactly (two tied keys in different tiles),
    built by :func:`kernels.rounding_lab.cases.build` with one of :data:`SINK_SETTINGS` (``case``
    overrides fields of :class:`kernels.rounding_lab.cases.Case`). Q is the identity and the
    scale 1, so every score is exact; the inputs are bf16 numbers."""
    if setting not in SINK_SETTINGS:
        raise ValueError(f"setting must be one of {tuple(SINK_SETTINGS)}, got {setting!r}")
    chosen = dict(SINK_SETTINGS[setting])
    values = {key: cases.VDist("normal", *chosen.pop(key)) for key in ("v_tied", "v_rest")}
    fields = {**dict(ties=2, head_dim=32, batch=8, block_n=64), **values, **chosen, **case}
    built = cases.build(cases.Case(n_keys=n, **fields), seed=seed, device=device)
    return Inputs(built.q, built.k, built.v, 1.0, f"sink: {setting}")


def deviation(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """max, mean and standard deviation of |out − ref|, and ‖out − ref‖ / ‖ref‖ (in
    fp64)."""
    out, ref = out.to(torch.float64), ref.to(torch.float64)
    diff = (out - ref).abs()
    norm = torch.linalg.vector_norm(ref)
    return {
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "std_abs": float(diff.std()) if diff.numel() > 1 else 0.0,
        "rel_norm": (float(torch.linalg.vector_norm(out - ref) / norm) if norm > 0 else math.nan),
    }


def mean_ulps(
    out: torch.Tensor, ref: torch.Tensor, low: torch.dtype, best: torch.Tensor | None = None
) -> float | None:
    """Mean signed error (out − ref) in ulps of ``low``: a bias (None for fp64). With
    ``best`` (the ideal), the bias *beyond* the ideal's: mean of err(out) − err(best).
    """
    if low == torch.float64:
        return None
    err = error_in_ulps(out, ref, low)
    if best is not None:
        err = err - error_in_ulps(best, ref, low)
    return float(err[torch.isfinite(err)].mean())


def per_head(fn, inputs: Inputs, *args, **kw) -> torch.Tensor:
    """``fn(q, k, v, ...)`` one head at a time (bounds the N×N memory of baselines at
    large N)."""
    q, k, v = inputs.q, inputs.k, inputs.v
    if q.dim() < 3:
        return fn(q, k, v, *args, **kw)
    outs = [
        fn(q[..., h : h + 1, :, :], k[..., h : h + 1, :, :], v[..., h : h + 1, :, :], *args, **kw)
        for h in range(q.shape[-3])
    ]
    return torch.cat(outs, dim=-3)


def outputs(
    inputs: Inputs, fmt, impls=impl.IMPLEMENTATIONS, block_n: int = 64, block_m=None, extra=None
) -> dict:
    """{name: O} for each implementation (and "golden", "ideal") on ``inputs`` in format
    ``fmt``. ``extra`` {name: (fn(q, k, v, low, scale) -> O, formats it supports)} adds
    implementations that run for real (GPU kernels), in the formats they support."""
    low = format_dtype(fmt)
    outs = {"golden": per_head(golden, inputs, low, inputs.scale)}
    outs["ideal"] = ideal(outs["golden"], low)
    for name in impls:
        outs[name] = per_head(
            lambda q, k, v: impl.run_in_format(
                name, q, k, v, low, inputs.scale, block_m=block_m, block_n=block_n
            ),
            inputs,
        )
    for name, (fn, supported) in (extra or {}).items():
        if format_name(low) not in supported:
            continue
        got = per_head(lambda q, k, v: fn(q, k, v, low, inputs.scale), inputs)
        outs[name] = got.to(outs["golden"].device, work_dtype(low))
    return outs


def precision_sweep(
    inputs: Inputs,
    formats=tuple(FORMATS),
    impls=impl.IMPLEMENTATIONS,
    block_n: int = 64,
    extra=None,
    progress=None,
) -> list[dict]:
    """Golden et al.'s Figs. 3–4: for every format and implementation, the deviation
    from the golden value, from the baseline in the same format, and from the ideal;
    plus the mean signed error in ulps (a bias, which Golden's measures do not see),
    that bias beyond the ideal's, and the share of outputs equal to the ideal."""
    records = []
    for fmt in formats if progress is None else progress(formats, desc=f"{inputs.name} formats"):
        low = format_dtype(fmt)
        outs = outputs(inputs, fmt, impls, block_n, extra=extra)
        gold, base, best = outs.pop("golden"), outs["baseline"], outs["ideal"]
        for name, out in outs.items():
            records.append(
                {
                    "inputs": inputs.name,
                    "n": inputs.n,
                    "format": fmt,
                    "impl": name,
                    "block_n": block_n,
                    "vs_golden": deviation(out, gold),
                    "vs_baseline": deviation(out, base),
                    "vs_ideal": deviation(out, best),
                    "bias_ulps": mean_ulps(out, gold, low),
                    "bias_beyond_ideal_ulps": mean_ulps(out, gold, low, best),
                    "same_as_ideal": float((out.to(best.dtype) == best).double().mean()),
                }
            )
    return records


def pick(records, **match) -> list[dict]:
    """The records whose fields equal every ``match`` value."""
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def one(records, **match) -> dict:
    """The single record matching ``match``; a clear error if there is none or
    several."""
    found = pick(records, **match)
    if len(found) != 1:
        raise LookupError(f"{len(found)} records match {match}")
    return found[0]


def ratio_table(
    records,
    fmt="bf16",
    inputs="gaussian",
    flash=("fa2", "paper", "fa1"),
    baselines=("baseline", "baseline_fp32", "ideal"),
    measures=("max_abs", "rel_norm"),
) -> list[dict]:
    """For each flash implementation, baseline and measure: flash's deviation from the
    golden value divided by the baseline's. Golden et al. report about 10 for BF16."""
    rows = []
    for f in flash:
        fr = one(records, format=fmt, inputs=inputs, impl=f)["vs_golden"]
        for b in baselines:
            br = one(records, format=fmt, inputs=inputs, impl=b)["vs_golden"]
            for m in measures:
                rows.append(
                    {
                        "flash": f,
                        "baseline": b,
                        "measure": m,
                        "flash_err": fr[m],
                        "baseline_err": br[m],
                        "ratio": fr[m] / br[m] if br[m] else math.inf,
                    }
                )
    return rows


# --------------------------------------------------------------------------------------
# sequence length (Fig. 5)
# --------------------------------------------------------------------------------------
def seqlen_sweep(
    ns,
    d: int = 64,
    heads: int = 1,
    block_n: int = 64,
    fmt="bf16",
    flash=("fa2", "paper", "fa1"),
    seed: int = 0,
    device="cpu",
    extra=None,
    progress=None,
) -> list[dict]:
    """Golden et al.'s Fig. 5 with the tile fixed at ``block_n`` keys: for each N, every
    flash implementation's difference from the baseline in the same format (max, mean ±
    std of |difference|) and from the golden value, the rms of O itself, and how often
    the running maximum grew per row inside the emulator (measured), next to the i.i.d.
    expectation."""
    low = format_dtype(fmt)
    records = []
    for n in ns if progress is None else progress(ns, desc="sequence lengths"):
        inputs = gaussian_inputs(n, d, heads, seed, device)
        outs = outputs(inputs, fmt, ("baseline", *flash), block_n, extra=extra)
        gold, base = outs["golden"], outs["baseline"]
        with impl.count_offset_changes() as counter:
            per_head(impl.RUNNERS["fa2"], inputs, low, inputs.scale, block_n=block_n)
        grew = counter.total().to(torch.float64)
        tiles = math.ceil(n / block_n)
        for name, out in outs.items():
            if name in ("golden", "baseline"):
                continue
            records.append(
                {
                    "n": n,
                    "impl": name,
                    "format": fmt,
                    "block_n": block_n,
                    "tiles": tiles,
                    "vs_baseline": deviation(out, base),
                    "vs_golden": deviation(out, gold),
                    "o_rms": float(gold.pow(2).mean().sqrt()),
                    "rescalings_mean": float(grew.mean()),
                    "rescalings_max": float(grew.max()),
                    "rescalings_expected": impl.expected_record_count(tiles),
                }
            )
    return records


def error_by_rescalings(
    n: int, d: int = 64, heads: int = 2, block_n: int = 64, fmt="bf16", seed: int = 0, device="cpu"
) -> dict:
    """At one N: each row's relative error ‖o − g‖/‖g‖ against the golden value, grouped
    by how often that row's running maximum grew. If rescalings caused the error, rows
    with more of them would be worse. Returns {impl: {count: (rows, mean relative
    error)}}."""
    low = format_dtype(fmt)
    inputs = gaussian_inputs(n, d, heads, seed, device)
    gold = per_head(golden, inputs, low, inputs.scale).to(torch.float64)
    found = {}
    for name in ("fa2", "paper"):
        with impl.count_offset_changes() as counter:
            out = per_head(impl.RUNNERS[name], inputs, low, inputs.scale, block_n=block_n)
        found[name] = (out, counter.total())
    pieces = [
        impl.fa1(
            inputs.q[:, h : h + 1],
            inputs.k[:, h : h + 1],
            inputs.v[:, h : h + 1],
            low,
            inputs.scale,
            block_n=block_n,
            with_counts=True,
        )
        for h in range(heads)
    ]
    found["fa1"] = tuple(torch.cat(parts, dim=1) for parts in zip(*pieces))
    table = {}
    for name, (out, grew) in found.items():
        row_err = torch.linalg.vector_norm(
            out.to(torch.float64) - gold, dim=-1
        ) / torch.linalg.vector_norm(gold, dim=-1)
        grew = grew.to(torch.int64)
        table[name] = {
            int(c): (int((grew == c).sum()), float(row_err[grew == c].mean()))
            for c in torch.unique(grew).tolist()
        }
    return table


# --------------------------------------------------------------------------------------
# tiles (Fig. 6)
# --------------------------------------------------------------------------------------
def tile_sweep(
    inputs: Inputs, tiles, formats=tuple(FORMATS), flash=("fa1", "fa2", "paper"), progress=None
) -> list[dict]:
    """Golden et al.'s Fig. 6: each (B_r, B_c) = (block_m, block_n) of ``tiles``, every
    format. FA1 runs its query blocks literally (the inner loop over B_r); the FA2
    emulator treats all rows at once (its rows are independent), so its records carry
    block_m = None and one record per B_c. Each record: deviation from the golden value
    and from the baseline."""
    tiles = [tuple(t) for t in tiles]
    for br, bc in tiles:
        if br < 1 or bc < 1:
            raise ValueError(f"tile sizes must be >= 1, got (B_r, B_c) = ({br}, {bc})")
    records = []
    for fmt in formats if progress is None else progress(formats, desc="formats"):
        low = format_dtype(fmt)
        gold = per_head(golden, inputs, low, inputs.scale)
        base = per_head(impl.baseline, inputs, low, inputs.scale)
        done = set()
        for br, bc in tiles:
            for name in flash:
                key = (name, br if name == "fa1" else None, bc)
                if key in done:
                    continue
                done.add(key)
                out = per_head(
                    lambda q, k, v: impl.run_in_format(
                        name, q, k, v, low, inputs.scale, block_m=key[1], block_n=bc
                    ),
                    inputs,
                )
                records.append(
                    {
                        "format": fmt,
                        "impl": name,
                        "block_m": key[1],
                        "block_n": bc,
                        "area": None if key[1] is None else br * bc,
                        "digest": digest(out),
                        "vs_golden": deviation(out, gold),
                        "vs_baseline": deviation(out, base),
                    }
                )
    return records


def digest(out: torch.Tensor) -> str:
    """A fingerprint of a tensor's bits: equal digests mean bit-identical outputs."""
    return hashlib.sha256(out.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def block_m_identical(records) -> dict:
    """For FA1 records: per (format, B_c), whether every B_r gave bit-identical outputs,
    i.e. whether B_r matters at all."""
    groups = {}
    for r in pick(records, impl="fa1"):
        groups.setdefault((r["format"], r["block_n"]), set()).add(r["digest"])
    return {key: len(found) == 1 for key, found in groups.items()}
