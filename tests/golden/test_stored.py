"""Golden et al.'s weight measure on the GPT-2 chapter's stored logs
(kernels/golden/stored.py)."""

import numpy as np
import pytest

import kernels  # noqa: F401
from kernels.golden import stored


@pytest.fixture(scope="module")
def runs():
    return stored.load_runs(("amp_seeds",))


def test_a_run_is_at_distance_zero_from_itself(runs):
    steps, dist = stored.head_norm_distance(runs["k4-F-s1"], runs["k4-F-s1"])
    assert len(steps) > 50 and (dist == 0).all()


def test_seed_band_covers_each_pair(runs):
    names = ["k4-F-s1", "k4-F-s2", "k4-F-s3"]
    band_steps, band = stored.seed_band(runs, names)
    steps, one_pair = stored.head_norm_distance(runs[names[0]], runs[names[1]])
    common = np.isin(steps, band_steps)
    assert (one_pair[common] <= band[np.isin(band_steps, steps)] + 1e-12).all()


def test_layer_zero_leaves_the_seed_noise_before_the_explosion(runs):
    table = stored.lead_table(runs)
    assert len(table) == 3
    assert (table["W1 layer 0"] < table["explosion"]).all()
    assert (table["W1 layer 0"] < table["W_Q 25%"]).all()


def test_seed_against_band_is_the_named_pair_against_the_controls(runs):
    seed = int(np.random.default_rng().integers(1, 4))
    got = stored.seed_against_band(runs, seed)
    names = [f"k4-F-s{s}" for s in (1, 2, 3)]
    want = stored.against_band(runs, f"k4-U-s{seed}", f"k4-F-s{seed}", names)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert stored.amplified(runs, "U", seed) is runs[f"k4-U-s{seed}"]
