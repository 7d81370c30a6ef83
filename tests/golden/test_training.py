"""Weight distances over training (kernels/golden/training.py): the measures, the nudge,
and a lock-step set in which identical runs stay identical and a nudged run does not."""

import random

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

import kernels  # noqa: F401
from kernels.golden import training
from kernels.gpt2 import GPT, GPTConfig, load_corpus
from kernels.numerics.rounding import ulp_in_dtype

TINY = dict(
    n_layer=1,
    n_head=2,
    n_embd=32,
    block_size=32,
    batch_size=4,
    warmup=2,
    lr=3e-3,
    min_lr=3e-4,
    steps=20,
    autocast="off",
)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("stdlib", max_bytes=200_000)


def test_wasserstein_matches_scipy():
    rng = np.random.default_rng(random.SystemRandom().randrange(2**31))
    for n_a, n_b in ((500, 500), (300, 700)):
        a, b = rng.normal(0, 1, n_a), rng.standard_t(3, n_b) + 0.1
        ours = training.wasserstein_1d(torch.tensor(a), torch.tensor(b))
        assert ours == pytest.approx(wasserstein_distance(a, b), rel=1e-12)
    x = torch.randn(50)
    assert training.wasserstein_1d(x, x[torch.randperm(50)]) == 0.0  # order does not matter
    with pytest.raises(ValueError, match="non-empty"):
        training.wasserstein_1d(torch.tensor([]), x)


def test_weight_matrices_and_compare():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))
    mats = training.weight_matrices(model)
    assert len(mats) == 2 + 6 * 2
    assert mats["1.W_Q"].shape == (32, 32) and mats["0.mlp_in"].shape == (128, 32)
    same = training.compare_weights(mats, mats)
    assert all(v["max_diff"] == 0 and v["wasserstein"] == 0 for v in same.values())
    with pytest.raises(ValueError, match="different weight matrices"):
        training.compare_weights(mats, {"wte": mats["wte"]})


def test_nudge_moves_one_weight_by_one_bf16_ulp():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    before = training.weight_matrices(model)
    where, step = training.nudge(model)
    after = training.weight_matrices(model)
    diff = after["0.mlp_in"] - before["0.mlp_in"]
    assert (diff != 0).sum() == 1 and where == "0.mlp_in[0, 0]"
    expected = float(ulp_in_dtype(before["0.mlp_in"][0, 0].double(), torch.bfloat16))
    assert diff[0, 0].item() == pytest.approx(expected, rel=1e-6) and step == expected
    assert all(torch.equal(before[k], after[k]) for k in before if k != "0.mlp_in")


def test_lockstep_identical_runs_stay_identical_and_a_nudge_does_not(corpus):
    specs = (
        training.RunSpec("a", {"attn": "math32"}),
        training.RunSpec("b", {"attn": "math32"}),
        training.RunSpec("c", {"attn": "math32"}, nudge=True),
    )
    pairs = (("identical", "b", "a"), ("nudged", "c", "a"))
    rec = training.train_set(
        "custom", TINY, corpus, 8, 4, log_every=2, progress=False, specs=specs, pairs=pairs
    )
    assert rec["snapshot_steps"] == [0, 4, 8] and rec["steps_done"] == 8
    _, same = training.curve(rec, "identical", "max_diff", "max")
    assert (same == 0).all()
    _, nudged = training.curve(rec, "nudged", "max_diff", "max")
    assert nudged[0] > 0 and nudged[-1] > 0
    steps, w = training.curve(rec, "nudged", "wasserstein", "0.W_Q")
    assert w[0] == 0 and w[-1] > 0  # W_Q itself starts equal
    assert rec["loss"]["a"]["loss"] == rec["loss"]["b"]["loss"]
    assert set(rec["explosion"]) == {"a", "b", "c"}


def test_train_set_rejects_what_it_cannot_run(corpus):
    with pytest.raises(ValueError, match="set must be one of"):
        training.train_set("nope", TINY, corpus, 4, 2)
    specs = (training.RunSpec("a", {"attn": "math32"}),)
    with pytest.raises(ValueError, match="not in the set"):
        training.train_set("x", TINY, corpus, 4, 2, specs=specs, pairs=(("p", "a", "z"),))
    with pytest.raises(ValueError, match=">= 1"):
        training.snapshot_schedule(10, 0)


def test_snapshot_schedule_and_first_above_for_good():
    assert training.snapshot_schedule(20, 10, early=4, early_every=2) == [0, 2, 4, 10, 20]
    steps = [0, 1, 2, 3, 4]
    assert training.first_above_for_good(steps, [0, 2, 0, 2, 2], [1] * 5) == 3
    assert training.first_above_for_good(steps, [2] * 5, [1] * 5) == 0
    assert training.first_above_for_good(steps, [2, 2, 2, 2, 0], [1] * 5) is None


def test_curve_and_ratio_at():
    rec = {
        "snapshot_steps": [0, 10, 20],
        "pairs": [
            {
                "label": "x",
                "a": "p",
                "b": "q",
                "max_diff": {"m1": [0, 1, 2], "m2": [0, 3, 6]},
                "wasserstein": {"m1": [0, 1, 4], "m2": [0, 1, 2]},
            },
            {
                "label": "y",
                "a": "p",
                "b": "q",
                "max_diff": {"m1": [0, 1, 1], "m2": [0, 1, 1]},
                "wasserstein": {"m1": [0, 2, 2], "m2": [0, 2, 2]},
            },
        ],
    }
    assert training.curve(rec, "x", "max_diff", "max")[1].tolist() == [0, 3, 6]
    assert training.curve(rec, "x", "wasserstein", "median")[1].tolist() == [0, 1, 3]
    assert training.ratio_at(rec, "x", "y") == {10: 0.5, 20: 1.5}
    with pytest.raises(LookupError, match="no pair"):
        training.curve(rec, "z")
    with pytest.raises(ValueError, match="metric"):
        training.curve(rec, "x", "mean")
