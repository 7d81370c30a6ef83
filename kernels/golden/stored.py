"""Golden et al.'s weight measures applied to the GPT-2 chapter's stored GPU runs.

The stored runs (``results/gpt2_*.json``) hold logs, not checkpoints: every 100 steps,
each layer's ‖W_Q‖₂ per head, the loss and the attention diagnostics. So the weight
measure here is the one the logs allow: per layer, the *distribution of the heads'
‖W_Q‖₂*, compared between two runs with ``scipy.stats.wasserstein_distance`` (heads are
not matched one to one, which is right across seeds, where head h of one run has no
counterpart in the other).

The question: the failing path and its control share seed and batches; the controls of
three seeds give the size of seed-to-seed noise (they differ in initialisation *and*
batch order). From which step does the failing run's distance from its control stay
above that noise band, and how long is that before its loss explodes?"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.stats import wasserstein_distance

from ..gpt2 import report
from ..gpt2.plans import run_name
from ..results import load
from .training import first_above_for_good

PLANS = ("amplify", "amp_seeds", "amp_final")
FAILING, CONTROL = report.FAILING, report.CONTROL  # the two arms' letters in the run names


def weight_files(directory=None) -> list[str]:
    """The checkpoints or weight files among the stored results (none: the runs keep logs)."""
    from ..env import RESULTS_DIR

    folder = RESULTS_DIR if directory is None else directory
    return sorted(p.name for p in folder.iterdir()
                  if p.suffix in (".pt", ".pth", ".ckpt") or "ckpt" in p.name)  # fmt: skip


def load_runs(plans=PLANS, directory=None) -> dict:
    """Every stored run of ``plans``, by name (e.g. ``k4-U-s1``)."""
    runs = {}
    for plan in plans:
        record = load(f"gpt2_{plan}", directory)
        runs.update(record["data"]["runs"])
    return runs


def head_norms(run: dict, layer: int = 0):
    """(steps, array (steps, heads)) of ‖W_Q‖₂ per head of one layer, finite checks
    only."""
    steps, norms = [], []
    for m in run["monitor"]:
        row = np.asarray(m["wq_norms"][layer], dtype=float)
        if np.all(np.isfinite(row)):
            steps.append(m["step"])
            norms.append(row)
    return np.asarray(steps), np.asarray(norms)


def head_norm_distance(run_a: dict, run_b: dict, layer: int = 0):
    """(steps, W₁) between the two runs' distributions of per-head ‖W_Q‖₂ at the steps
    both logged."""
    sa, na = head_norms(run_a, layer)
    sb, nb = head_norms(run_b, layer)
    common = np.intersect1d(sa, sb)
    ia, ib = {s: i for i, s in enumerate(sa)}, {s: i for i, s in enumerate(sb)}
    w1 = [wasserstein_distance(na[ia[s]], nb[ib[s]]) for s in common]
    return common, np.asarray(w1)


def seed_band(runs: dict, names, layer: int = 0):
    """(steps, largest W₁ over every pair of ``names``) at the steps all of them
    logged."""
    curves = [
        dict(zip(*head_norm_distance(runs[a], runs[b], layer)))
        for a, b in itertools.combinations(names, 2)
    ]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return np.asarray(steps), np.asarray([max(c[s] for c in curves) for s in steps])


def amplified(runs: dict, arm: str, seed: int) -> dict:
    """The stored run of Ō with 4 bits, ``arm`` ('U' failing path, 'F' control), ``seed``."""
    return runs[amplified_name(arm, seed)]


def amplified_name(arm: str, seed: int) -> str:
    """How the GPT-2 search names that run."""
    return run_name("k4", arm, seed)


def seed_against_band(runs: dict, seed: int, seeds=(1, 2, 3), layer: int = 0):
    """:func:`against_band` for the failing path of Ō with 4 bits in ``seed`` against its
    control, with the controls of ``seeds`` as the band."""
    controls = [amplified_name("F", s) for s in seeds]
    failing, control = amplified_name("U", seed), amplified_name("F", seed)
    return against_band(runs, failing, control, controls, layer)


def against_band(runs: dict, failing: str, control: str, band_names, layer: int = 0):
    """(steps, W₁(failing, control), band) on the steps they share."""
    steps, dist = head_norm_distance(runs[failing], runs[control], layer)
    band_steps, band = seed_band(runs, band_names, layer)
    common = np.intersect1d(steps, band_steps)
    pick = lambda s, v: np.asarray(v)[np.isin(s, common)]  # noqa: E731
    return common, pick(steps, dist), pick(band_steps, band)


def lead_table(runs: dict, prefix: str = "k4", seeds=("s1", "s2", "s3"), layers=range(4)):
    """One row per seed: for each layer, the step from which W₁(failing, control) of the
    layer's head norms stays above the seed band of the controls (None: not before the
    run ended); the GPT-2 chapter's departure steps of layer 0 (‖W_Q‖ 25 % above the
    control's, tie share 10 % above); and the failing run's explosion step."""
    import pandas as pd

    controls = [f"{prefix}-F-{s}" for s in seeds]
    rows = []
    for seed in seeds:
        fail, ctrl = f"{prefix}-U-{seed}", f"{prefix}-F-{seed}"
        dep = report.pair_departures(runs[fail], runs[ctrl])
        row = {"seed": seed}
        for layer in layers:
            steps, dist, band = against_band(runs, fail, ctrl, controls, layer)
            row[f"W1 layer {layer}"] = first_above_for_good(steps, dist, band)
        row.update(
            {
                "ties 10%": dep["rows_tied_bf16"],
                "W_Q 25%": dep["wq"],
                "explosion": report.outcome(runs[fail])["step"],
            }
        )
        rows.append({k: (np.nan if v is None else v) for k, v in row.items()})
    table = pd.DataFrame(rows)
    numbers = [c for c in table.columns if c != "seed"]
    table[numbers] = table[numbers].astype(float)
    return table
