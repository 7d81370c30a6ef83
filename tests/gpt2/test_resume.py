"""A run split into calls (stop, checkpoint, resume in a new Trainer) continues bit-identically.

The GPU plans split 120,000-step runs into calls of under ten minutes, so a resumed run must be
the same run: same parameters, same optimizer state, same logged losses and diagnostics. The
attention here draws random numbers every step (stochastic rounding of Ō), so a checkpoint that
forgot a generator would fail this test (the second test shows that it would).
"""

import random

import numpy as np
import pytest
import torch

import kernels  # noqa: F401
from kernels.gpt2 import TrainConfig, Trainer, load_corpus

STEPS = 8


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("stdlib", max_bytes=200_000)


def _cfg(tmp_path, name, **kw):
    base = dict(
        name=name,
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=32,
        batch_size=4,
        steps=STEPS,
        warmup=2,
        lr=3e-3,
        autocast="off",
        out_dir=str(tmp_path),
        log_every=1,
        monitor_every=2,
        progress=False,
        checkpoint_every=100,
        attn="paper:delta=o,obits=3,oround=sr",
    )
    return TrainConfig(**{**base, **kw})


def _scramble_generators():
    """What other code between two calls might do to the global generators."""
    random.random(), np.random.rand(3), torch.rand(5)


def _train_split(tmp_path, corpus, name, stop_at):
    first = Trainer(_cfg(tmp_path, name, stop_at=stop_at), corpus)
    first.run()
    assert first.step == stop_at and first.status.startswith("stopped: paused")
    _scramble_generators()
    second = Trainer(_cfg(tmp_path, name, resume=True), corpus)
    assert second.step == stop_at
    second.run()
    return second


def _assert_same_run(a: Trainer, b: Trainer):
    assert a.step == b.step == STEPS and a.status == b.status == "finished"
    assert a.history["step"] == b.history["step"]
    assert a.history["loss"] == b.history["loss"]  # exact float equality
    assert a.history["grad_norm"] == b.history["grad_norm"]
    strip = lambda mon: [{k: v for k, v in m.items()} for m in mon]  # noqa: E731
    assert strip(a.monitor) == strip(b.monitor)  # ties, δ errors, rank-1 cosines
    for (name, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), name
    sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    for i in sa:
        for key in sa[i]:
            assert torch.equal(sa[i][key], sb[i][key]), (i, key)


def test_resumed_run_is_bit_identical(corpus, tmp_path):
    whole = Trainer(_cfg(tmp_path, "whole"), corpus)
    whole.run()
    split = _train_split(tmp_path, corpus, "split", stop_at=STEPS // 2)
    _assert_same_run(whole, split)
    # the CSV of the split run holds every step once, as the uninterrupted run's does
    assert (tmp_path / "split.csv").read_text().count("\n") == STEPS + 1
    assert (tmp_path / "whole.csv").read_text().count("\n") == STEPS + 1


def test_resume_without_the_generators_would_differ(corpus, tmp_path, monkeypatch):
    whole = Trainer(_cfg(tmp_path, "whole"), corpus)
    whole.run()
    monkeypatch.setattr(Trainer, "_set_rng_state", staticmethod(lambda state: None))
    split = _train_split(tmp_path, corpus, "split", stop_at=STEPS // 2)
    assert split.history["loss"][STEPS // 2 :] != whole.history["loss"][STEPS // 2 :]


def test_resume_refuses_a_different_run(corpus, tmp_path):
    Trainer(_cfg(tmp_path, "a", stop_at=2), corpus).run()
    with pytest.raises(ValueError, match="lr"):
        Trainer(_cfg(tmp_path, "a", resume=True, lr=1e-3), corpus)
    with pytest.raises(FileNotFoundError):
        Trainer(_cfg(tmp_path, "missing", resume=True), corpus)


def test_search_resumes_a_plan_across_calls(tmp_path):
    """Three calls of the launcher: the first pauses the run, the second resumes it to the end,
    the third finds it ended and does not start it again; the log equals an uninterrupted run's."""
    from kernels.gpt2.search import launch

    base = dict(
        n_layer=1,
        n_head=2,
        n_embd=32,
        block_size=32,
        batch_size=4,
        steps=6,
        warmup=1,
        max_bytes=200_000,
        autocast="off",
        log_every=1,
        monitor_every=2,
        checkpoint_every=100,
        attn="paper:delta=o,obits=3,oround=sr",
        seed=0,
        data_seed=0,
    )
    whole = launch([("w-U-s0", base)], 5, tmp_path / "whole")["w-U-s0"]
    first = launch([("r-U-s0", {**base, "stop_at": 3})], 5, tmp_path / "split")["r-U-s0"]
    assert first["summary"]["status"].startswith("stopped: paused") and first["returncode"] == 0
    second = launch([("r-U-s0", base)], 5, tmp_path / "split")["r-U-s0"]
    assert second["summary"]["status"] == whole["summary"]["status"] == "finished"
    assert second["history"]["loss"] == whole["history"]["loss"]
    third = launch([("r-U-s0", base)], 5, tmp_path / "split")["r-U-s0"]
    assert third["stdout_tail"] == "ended in an earlier call"


def test_cuda_graph_needs_a_gpu(tmp_path):
    """The CUDA-graph step is refused, with a clear message, where there is no CUDA GPU."""
    from kernels.gpt2.train import TrainConfig, Trainer

    cfg = TrainConfig(
        n_layer=1,
        n_head=2,
        n_embd=32,
        block_size=16,
        batch_size=2,
        steps=2,
        max_bytes=20_000,
        device="cpu",
        out_dir=str(tmp_path),
        cuda_graph=True,
        progress=False,
    )
    with pytest.raises(ValueError, match="cuda_graph needs one CUDA GPU"):
        Trainer(cfg)
