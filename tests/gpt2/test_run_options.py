"""A GPT-2 run in its two forms: the one options object (:class:`TrainConfig`) and its JSON,
which the search hands to the training process; and the one table of variants."""

import json

import pytest

import kernels  # noqa: F401  (sets the Triton interpreter switch first)
from kernels.gpt2 import plans, runs
from kernels.gpt2.config import TrainConfig
from kernels.gpt2.search import run_config
from kernels.gpt2.train import Trainer, main

SHRINK = dict(
    n_embd=64,
    block_size=32,
    batch_size=4,
    steps=3,
    warmup=1,
    autocast="off",
    max_bytes=200_000,
    monitor_every=2,
    log_every=1,
    checkpoint_every=0,
)


def _plan_run(plan_name: str, run_name: str) -> dict:
    return {**dict(plans.plan(plan_name))[run_name], **SHRINK}


@pytest.mark.parametrize(
    "plan_name, run_name", [("controls", "k4c-B-s1"), ("amp_head", "k4h-H-s1")]
)
def test_options_survive_the_json_round_trip_and_train_the_same(tmp_path, plan_name, run_name):
    cfg = run_config(run_name, _plan_run(plan_name, run_name), tmp_path, 1.0, resume=False)
    path = tmp_path / "run.config.json"
    cfg.write_json(path)
    assert TrainConfig.read_json(path) == cfg
    in_process = Trainer(cfg)
    in_process.run()
    main(["--config", str(path)])  # what the search's training process runs
    logged = json.loads((tmp_path / f"{run_name}.json").read_text())
    assert logged["history"]["loss"] == in_process.history["loss"]  # bit for bit
    assert logged["config"] == json.loads(path.read_text())


def test_a_bad_option_is_named_when_the_config_is_made(tmp_path):
    with pytest.raises(ValueError, match="TrainConfig.attn"):
        TrainConfig(attn="paper:delta=x")
    with pytest.raises(ValueError, match="TrainConfig.layer_attn"):
        TrainConfig(n_layer=2, layer_attn="5=paper")
    with pytest.raises(ValueError, match="TrainConfig.layer_attn"):
        TrainConfig(layer_attn="0=paper:obits=9")
    with pytest.raises(ValueError, match="TrainConfig.autocast"):
        TrainConfig(autocast="fp16")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"attn": "sdpa", "lr_typo": 1.0}))
    with pytest.raises(ValueError, match="lr_typo"):
        TrainConfig.read_json(path)


def test_the_variant_tables_are_views_of_one_table():
    letters = list(plans.VARIANT_TABLE)
    for view in (plans.VARIANTS, plans.VARIANT_NAMES, plans.VARIANT_COLOURS):
        assert list(view) == letters
    assert runs.VARIANT_NAMES is plans.VARIANT_NAMES
    assert runs.VARIANT_COLOURS is plans.VARIANT_COLOURS
    assert all(plans.VARIANTS[v] == row.attn for v, row in plans.VARIANT_TABLE.items())
