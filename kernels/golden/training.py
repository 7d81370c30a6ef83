"""Golden et al.'s second experiment: how far apart do the *weights* of two training
runs drift when the runs differ in one thing only (their Figs. 7–8)?

Runs are trained in lock-step with the book's GPT-2 trainer
(:class:`kernels.gpt2.train.Trainer`, same recorded batch order for every run), and
every ``snapshot_every`` steps each pair of runs is compared matrix by matrix with
Golden's two measures:

* ``max_diff``     max |W_a − W_b| over the elements of one weight matrix (an upper
  bound);
* ``wasserstein``  the 1-D Wasserstein distance between the two matrices'
  *distributions* of values (:func:`wasserstein_1d`, equal to
  ``scipy.stats.wasserstein_distance`` on the flattened matrices): it ignores which
  element is which, so two runs whose weights differ element by element but share a
  distribution are close.

Two sets of runs (:data:`GOLDEN_RUNS`, :data:`FAILURE_RUNS`) and their pairs:

* ``golden``  exact attention (fp32 softmax) as the reference; the same with torch's
  fused SDPA kernel (FlashAttention-2 on a GPU), with the paper's all-BF16 flash
  attention, with another initialisation seed (same batches), in fp32 instead of BF16
  autocast, and with one weight moved by one BF16 ulp at initialisation (the smallest
  perturbation there is);
* ``failure`` the GPT-2 chapter's failing path (paper attention, Ō held with 3 mantissa
  bits, δ from the rounded O), its control (δ from an fp32 O) and the control with
  another initialisation seed: does the failing run's weight deviation leave the seed
  noise before its loss explodes?"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..gpt2.diagnostics import find_explosion
from ..gpt2.train import TrainConfig, Trainer
from ..numerics.rounding import ulp_in_dtype

METRICS = ("max_diff", "wasserstein")


@dataclass(frozen=True)
class RunSpec:
    """One run of a set: a name, its training options beyond the set's base, and whether
    one weight is moved by one BF16 ulp after initialisation."""

    name: str
    options: dict = field(default_factory=dict)
    nudge: bool = False
    watch: bool = False  # stop the set some steps after this run's loss explodes


GOLDEN_RUNS = (
    RunSpec("exact", {"attn": "math32"}),
    RunSpec("flash", {"attn": "sdpa"}),
    RunSpec("emulated", {"attn": "paper:delta=o"}),
    RunSpec("seed", {"attn": "math32", "seed": 1}),
    RunSpec("fp32", {"attn": "math32", "autocast": "off"}),
    RunSpec("nudge", {"attn": "math32"}, nudge=True),
)
GOLDEN_PAIRS = (
    ("attention: fused SDPA vs exact", "flash", "exact"),
    ("attention: all-BF16 flash vs exact", "emulated", "exact"),
    ("initialisation seed", "seed", "exact"),
    ("precision: BF16 vs fp32", "exact", "fp32"),
    ("one weight, one BF16 ulp", "nudge", "exact"),
)
FAILURE_RUNS = (
    RunSpec("failing", {"attn": "paper:delta=o,obits=3"}, watch=True),
    RunSpec("control", {"attn": "paper:delta=o_fp32,obits=3"}),
    RunSpec("control_seed", {"attn": "paper:delta=o_fp32,obits=3", "seed": 1}),
)
FAILURE_PAIRS = (
    ("failing path vs its control", "failing", "control"),
    ("initialisation seed (control)", "control_seed", "control"),
)
SETS = {"golden": (GOLDEN_RUNS, GOLDEN_PAIRS), "failure": (FAILURE_RUNS, FAILURE_PAIRS)}

# Model and schedule. CPU: a tiny GPT-2 for the chapter's live cell. GPU: the GPT-2 chapter's
# model (4 layers, 4 heads, width 256, context 256, 64 sequences) and its 20,000-step schedule
# (peak lr 1e-3, cosine to 1e-4), of which a run trains as many steps as its time allows.
# fmt: off
CPU_BASE = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=8, warmup=20, lr=3e-3,
                min_lr=3e-4, steps=300, max_bytes=1_000_000)
GPU_BASE = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=64, warmup=200,
                lr=1e-3, min_lr=1e-4, steps=20_000, max_bytes=0)
# fmt: on


# --------------------------------------------------------------------------------------
# measures
# --------------------------------------------------------------------------------------
def weight_matrices(model) -> dict:
    """The model's weight matrices by name: token and position embeddings, and per layer
    the query, key and value projections (rows of ``c_attn``), the attention output, and
    the MLP's two matrices. (Biases and LayerNorm gains are left out, as in Golden et
    al.)"""
    width = model.cfg.n_embd
    out = {"wte": model.wte.weight, "wpe": model.wpe.weight}
    for i, block in enumerate(model.blocks):
        qkv = block.attn.c_attn.weight
        out[f"{i}.W_Q"], out[f"{i}.W_K"], out[f"{i}.W_V"] = (
            qkv[:width],
            qkv[width : 2 * width],
            qkv[2 * width :],
        )
        out[f"{i}.attn_out"] = block.attn.c_proj.weight
        out[f"{i}.mlp_in"] = block.mlp.c_fc.weight
        out[f"{i}.mlp_out"] = block.mlp.c_proj.weight
    return {name: w.detach().float().clone() for name, w in out.items()}


def wasserstein_1d(a: torch.Tensor, b: torch.Tensor) -> float:
    """W₁ between the empirical distributions of the values of ``a`` and ``b``.

    For equally many values it is the mean distance between the sorted values (computed
    on the tensors' device); otherwise ``scipy.stats.wasserstein_distance``."""
    a, b = a.detach().flatten().to(torch.float64), b.detach().flatten().to(torch.float64)
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError("wasserstein_1d needs two non-empty tensors")
    if a.numel() == b.numel():
        return float((torch.sort(a).values - torch.sort(b).values).abs().mean())
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(a.cpu().numpy(), b.cpu().numpy()))


def compare_weights(a: dict, b: dict) -> dict:
    """{matrix: {"max_diff": ..., "wasserstein": ...}} for two dicts of matrices."""
    if a.keys() != b.keys():
        raise ValueError("the two models have different weight matrices")
    return {
        name: {
            "max_diff": float((a[name] - b[name]).abs().max()),
            "wasserstein": wasserstein_1d(a[name], b[name]),
        }
        for name in a
    }


def nudge(model) -> tuple[str, float]:
    """Move one weight (layer 0's first MLP weight) up by one BF16 ulp; returns
    (where, by)."""
    with torch.no_grad():
        w = model.blocks[0].mlp.c_fc.weight
        step = float(ulp_in_dtype(w[0, 0].detach().cpu().to(torch.float64), torch.bfloat16))
        w[0, 0] += step
    return "0.mlp_in[0, 0]", step


# --------------------------------------------------------------------------------------
# training a set in lock-step
# --------------------------------------------------------------------------------------
def build_trainers(specs, base: dict, corpus, out_dir: str, device: str = "auto") -> dict:
    """One :class:`Trainer` per run; every run replays the same recorded batch order."""
    trainers = {}
    for spec in specs:
        options = {**base, **spec.options}
        options.pop("max_bytes", None)
        cfg = TrainConfig(
            name=spec.name,
            out_dir=out_dir,
            progress=False,
            monitor_every=0,
            device=device,
            **options,
        )
        trainer = Trainer(cfg, corpus)
        if spec.nudge:
            nudge(trainer.model)
        trainers[spec.name] = trainer
    return trainers


def snapshot_schedule(max_steps: int, every: int, early: int = 0, early_every: int = 1) -> list:
    """Steps at which weights are compared: every ``every`` steps, and in the first
    ``early`` steps every ``early_every`` (a perturbation grows fastest at the start).
    """
    if every < 1 or early_every < 1 or max_steps < 1:
        raise ValueError("max_steps, every and early_every must be >= 1")
    steps = set(range(0, max_steps + 1, every)) | set(
        range(0, min(early, max_steps) + 1, early_every)
    )
    return sorted(steps)


def train_set(
    name: str,
    base: dict,
    corpus,
    max_steps: int,
    snapshot_every,
    log_every: int = 10,
    minutes: float | None = None,
    stop_after_explosion: int | None = None,
    device: str = "auto",
    progress: bool = True,
    specs=None,
    pairs=None,
) -> dict:
    """Train one set of runs (:data:`SETS`) in lock-step for up to ``max_steps`` steps
    (or ``minutes``), comparing every pair's weights every ``snapshot_every`` steps (an
    int, or a list of steps such as :func:`snapshot_schedule` gives). Stops early when a
    run's loss is not finite, or ``stop_after_explosion`` steps after a watched run's
    loss exploded (:func:`kernels.gpt2.diagnostics.find_explosion`). Returns a
    JSON-ready record."""
    if name not in SETS and (specs is None or pairs is None):
        raise ValueError(
            f"set must be one of {tuple(SETS)} (or give specs and pairs), got {name!r}"
        )
    specs = SETS[name][0] if specs is None else specs
    pairs = SETS[name][1] if pairs is None else pairs
    if isinstance(snapshot_every, int):
        snapshot_every = snapshot_schedule(max_steps, snapshot_every)
    snapshot_at = set(int(s) for s in snapshot_every)
    if max_steps < 1 or log_every < 1 or not snapshot_at or min(snapshot_at) < 0:
        raise ValueError("max_steps and log_every must be >= 1, snapshot steps >= 0")
    names = [s.name for s in specs]
    for label, a, b in pairs:
        if a not in names or b not in names:
            raise ValueError(f"pair {label!r} names a run that is not in the set: {a}, {b}")
    start = time.time()
    with tempfile.TemporaryDirectory() as out_dir:
        trainers = build_trainers(specs, base, corpus, out_dir, device)
        limits = dict(
            max_steps=max_steps,
            snapshot_at=snapshot_at,
            log_every=log_every,
            minutes=minutes,
            stop_after_explosion=stop_after_explosion,
        )
        record = _train_lockstep(trainers, specs, pairs, limits, progress, start)
    first = next(iter(trainers.values()))
    record.update(
        set=name,
        base=base,
        device=str(first.device),
        runs={s.name: {**s.options, "nudge": s.nudge} for s in specs},
        params=first.model.num_params(),
        corpus=first.corpus.describe(),
    )
    return record


def _train_lockstep(trainers, specs, pairs, limits, progress, start) -> dict:
    """Train ``trainers`` step by step together until ``limits`` (max_steps, snapshot_at,
    log_every, minutes, stop_after_explosion) say stop; ``start``: when the run began."""
    max_steps, snapshot_at, log_every = (
        limits[k] for k in ("max_steps", "snapshot_at", "log_every")
    )
    minutes, stop_after_explosion = limits["minutes"], limits["stop_after_explosion"]
    from tqdm import tqdm

    watched = [s.name for s in specs if s.watch]
    loss = {n: {"step": [], "loss": []} for n in trainers}
    curves = [
        {"label": label, "a": a, "b": b, "max_diff": {}, "wasserstein": {}} for label, a, b in pairs
    ]
    snapshot_steps = []

    def snapshot(step):
        mats = {n: weight_matrices(t.model) for n, t in trainers.items()}
        snapshot_steps.append(step)
        for curve in curves:
            for matrix, got in compare_weights(mats[curve["a"]], mats[curve["b"]]).items():
                for metric in METRICS:
                    curve[metric].setdefault(matrix, []).append(got[metric])

    snapshot(0)
    stopped, step = "reached max_steps", 0
    bar = tqdm(total=max_steps, desc="lock-step training", mininterval=5, disable=not progress)
    while step < max_steps:
        for n, trainer in trainers.items():
            value, _ = trainer.train_step()
            if step % log_every == 0:
                loss[n]["step"].append(step)
                loss[n]["loss"].append(float(value))
        step += 1
        bar.update(1)
        if step in snapshot_at:
            snapshot(step)
        bad = [n for n in trainers if loss[n]["loss"] and not math.isfinite(loss[n]["loss"][-1])]
        if bad:
            where = loss[bad[0]]["step"][-1]
            stopped = f"non-finite loss in {', '.join(bad)} at step {where}"
            break
        if stop_after_explosion is not None and step in snapshot_at:
            booms = [find_explosion(loss[n]["step"], loss[n]["loss"]) for n in watched]
            if any(b is not None and step >= b + stop_after_explosion for b in booms):
                stopped = f"stopped {stop_after_explosion} steps after the loss exploded"
                break
        if minutes and time.time() - start > 60 * minutes:
            stopped = f"time limit of {minutes:g} min"
            break
    bar.close()
    if snapshot_steps[-1] != step:
        snapshot(step)
    wall = time.time() - start
    return {
        "snapshot_steps": snapshot_steps,
        "pairs": curves,
        "loss": loss,
        "explosion": {n: find_explosion(loss[n]["step"], loss[n]["loss"]) for n in loss},
        "steps_done": step,
        "wall_s": wall,
        "stopped": stopped,
        "matrices": list(curves[0]["max_diff"]) if curves else [],
    }


# --------------------------------------------------------------------------------------
# reading a record
# --------------------------------------------------------------------------------------
def pair_of(record: dict, label: str) -> dict:
    for curve in record["pairs"]:
        if curve["label"] == label:
            return curve
    raise LookupError(f"no pair {label!r}; pairs: {[c['label'] for c in record['pairs']]}")


def curve(record: dict, label: str, metric: str = "wasserstein", matrices="median"):
    """(steps, values) of one pair's ``metric``: one matrix by name, or "median" / "max"
    over all matrices at each snapshot."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    per = pair_of(record, label)[metric]
    steps = np.asarray(record["snapshot_steps"])
    if matrices in ("median", "max"):
        table = np.array([per[m] for m in per], dtype=float)
        values = np.median(table, 0) if matrices == "median" else table.max(0)
    else:
        if matrices not in per:
            raise LookupError(f"no matrix {matrices!r}; matrices: {list(per)}")
        values = np.asarray(per[matrices], dtype=float)
    return steps, values


def ratio_at(
    record: dict, top: str, bottom: str, metric: str = "wasserstein", matrices="median", steps=None
) -> dict:
    """{step: value(top) / value(bottom)} at the snapshot steps ``steps`` (default:
    all > 0)."""
    s, a = curve(record, top, metric, matrices)
    _, b = curve(record, bottom, metric, matrices)
    keep = s > 0 if steps is None else np.isin(s, steps)
    return {
        int(st): float(x / y) if y > 0 else math.inf for st, x, y in zip(s[keep], a[keep], b[keep])
    }


def first_above_for_good(steps, values, band) -> int | None:
    """The first step from which ``values`` stays above ``band`` (same steps) to the
    end."""
    above = np.asarray(values, dtype=float) > np.asarray(band, dtype=float)
    if not len(above) or not above[-1]:
        return None
    first = len(above) - int(np.argmin(above[::-1])) if not above.all() else 0
    return int(np.asarray(steps)[first])
