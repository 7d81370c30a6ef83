"""A monitor that never breaks training and whose alerts can be trusted (issue 44): each test
here failed before its fix. Readings that cannot be made (NaN or inf weights and activations,
meta tensors) are NaN rows with an alert, never an exception in the user's step; the ceilings
watch from step 0; on_alert runs after the rows are written, outside autograd; a resumed run
appends and marks the step it went back to; a model compiled before the monitor came is named
as such; the Hugging Face callback lets go when training fails; steps are whole numbers; the
rows kept in memory are bounded; alert warnings point at the user's line. CPU only, tiny
models, fresh random inputs each run."""

import copy
import inspect
import json
import logging
import math
import traceback
import warnings

import numpy as np
import pytest
import torch

import kernels  # noqa: F401  (sets the Triton interpreter switch first)
from kernels.gpt2 import GPT, GPTConfig
from kernels.monitor import Alerts, AttentionAlert, AttentionMonitor, layer_table, read_rows


def book_model(attn="sdpa", n_layer=2):
    return GPT(GPTConfig(block_size=24, n_layer=n_layer, n_head=2, n_embd=32, attn=attn))


def batch(size=2):
    return torch.randint(0, 256, (size, 24))


def train_pass(model, idx=None):
    idx = batch() if idx is None else idx
    loss = model(idx, idx.roll(-1, 1))[1]
    loss.backward()
    return loss


def quietly(fn, *args, **kwargs):
    """``fn(...)`` with the monitor's alert warnings recorded, not shown."""
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        return fn(*args, **kwargs)


def bits(values) -> bytes:
    """The bytes of a list of fp32 losses: equal bytes are equal losses, NaN included."""
    return torch.stack([v.detach().float() for v in values]).numpy().tobytes()


# ------------------------------------------------------------- 1. never breaks a step
def train_twice(plain, steps, **options):
    """``steps`` AdamW steps of ``plain`` and of a copy watched by a monitor reading every
    step (``options`` to attach); both losses and the monitor."""
    watched = copy.deepcopy(plain)
    mon = AttentionMonitor.attach(watched, every=1, **options)
    losses = {"plain": [], "watched": []}
    opts = {
        k: torch.optim.AdamW(m.parameters(), lr=1e-2)
        for k, m in (("plain", plain), ("watched", watched))
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            idx = batch()
            for key, model in (("plain", plain), ("watched", watched)):
                if key == "watched":
                    mon.step(step)
                opts[key].zero_grad()
                losses[key].append(train_pass(model, idx))
                opts[key].step()
        mon.close()
    return losses, mon, [w for w in caught if issubclass(w.category, AttentionAlert)]


def test_nan_in_wq_trains_the_same_with_and_without_the_monitor(tmp_path):
    """A NaN in one head's W_Q: the watched copy trains the same steps to the same losses, bit
    for bit (NaN included), without an exception; the readings are NaN rows, kept NaN per
    layer, and an alert names the non-finite W_Q."""
    plain = book_model(attn="paper:delta=o")
    with torch.no_grad():
        plain.blocks[0].attn.c_attn.weight[int(np.random.randint(0, 16)), 5] = math.nan
    steps = int(np.random.randint(3, 5))
    losses, mon, alerts = train_twice(plain, steps, delta=True, path=tmp_path / "m.jsonl")
    assert bits(losses["plain"]) == bits(losses["watched"])
    assert math.isnan(float(losses["watched"][0]))
    rows = read_rows(tmp_path / "m.jsonl")
    assert sorted(set(rows.step)) == list(range(steps))
    first = rows[(rows.step == 0) & (rows.layer == 0)].set_index(["head", "metric"]).value
    assert math.isnan(first[(0, "wq_norm")]) and math.isfinite(first[(1, "wq_norm")])
    assert math.isnan(first[(0, "max_logit")]) and math.isnan(first[(0, "ties_bf16")])
    per_layer = layer_table(tmp_path / "m.jsonl")
    assert per_layer.loc[(0, 0)].isna()[["wq_norm", "max_logit", "delta_err"]].all()
    said = [str(a.message) for a in alerts]
    assert any("non-finite W_Q in layer 0" in s for s in said), said
    assert any("non-finite activations in layer 0" in s for s in said), said
    assert ("non_finite_wq", 0, 0) in {(a.rule, a.layer, a.step) for a in mon.alerts.fired}


def test_nan_activations_are_no_healthy_reading():
    """A NaN in one token's embedding: W_Q is finite, but the heads that see the token read
    NaN (not the largest finite logit, not 0 ties), with an alert."""
    model = book_model()
    with torch.no_grad():
        model.wte.weight[7, int(np.random.randint(0, 32))] = math.nan
    mon = AttentionMonitor.attach(model, every=1)
    idx = batch()
    idx[:, int(np.random.randint(0, 24))] = 7
    quietly(mon.step, 0)
    train_pass(model, idx)
    quietly(mon.close)
    fired = mon.alerts.fired
    got = {(l, h, m): v for s, l, h, m, v in mon.rows}
    for h in range(2):
        assert math.isfinite(got[(0, h, "wq_norm")])
        for metric in ("max_logit", "ties_bf16", "p1_fa2"):
            assert math.isnan(got[(0, h, metric)]), (h, metric)
    assert {(a.rule, a.layer) for a in fired} >= {("non_finite_activations", 0)}
    assert "non-finite activations in layer 0" in fired[0].message


def test_meta_weights_read_as_nan():
    """A model on the meta device (no data): its ‖W_Q‖ cannot be read, so it is NaN."""
    with torch.device("meta"):
        model = book_model()
    mon = AttentionMonitor.attach(model, every=1)
    assert all(math.isnan(v) for v in mon.layers[0].wq_norms())


def test_layer_table_keeps_nan():
    """A head's NaN makes its layer's number NaN, for every rule (a sum over heads read 0.0,
    a max or mean skipped the NaN head)."""
    finite = float(np.random.uniform(1, 5))
    rows = []
    for metric in ("ties_bf16", "wq_norm", "max_logit", "delta_err", "delta_abs"):
        rows += [(0, 0, 0, metric, math.nan), (0, 0, 1, metric, finite)]
        rows += [(0, 1, 0, metric, math.nan), (0, 1, 1, metric, math.nan)]
        rows += [(0, 2, 0, metric, finite), (0, 2, 1, metric, finite)]
    table = layer_table(rows)
    assert table.loc[(0, 0)].isna().all() and table.loc[(0, 1)].isna().all()
    assert not table.loc[(0, 2)].isna().any()


# ------------------------------------------------------- 2. early steps are watched
def test_ceilings_watch_from_step_zero():
    """Logits far over the ceiling at step 0 (W_Q and W_K scaled up, as a high learning rate
    makes them within a few hundred steps): an alert at once, not after step 1,000."""
    model = book_model(n_layer=1)
    with torch.no_grad():
        model.blocks[0].attn.c_attn.weight[:64] *= float(np.random.uniform(40, 60))
    mon = AttentionMonitor.attach(model, every=1)
    quietly(mon.step, 0)
    quietly(train_pass, model)
    quietly(mon.close)
    assert [(a.step, a.rule) for a in mon.alerts.fired if a.rule == "max_logit"] == [
        (0, "max_logit")
    ]


def test_relative_rules_start_once_the_baseline_exists():
    """‖W_Q‖ growth is judged against the layer's own level, the median over the second half
    of ``warmup_steps``: nothing before it exists, an alert after."""
    warmup = int(np.random.randint(4, 20))
    alerts = Alerts(warmup_steps=warmup, warn=False)
    assert alerts.early == (warmup // 2, warmup)
    level = float(np.random.uniform(0.5, 5))
    for step in range(warmup + 1):  # a jump inside the warmup is no growth yet
        wq = level * (10 if step == warmup // 2 - 1 else 1)
        assert alerts.update(step, 0, {"wq_norm": wq}) == [], step
    fired = alerts.update(warmup + 1, 0, {"wq_norm": level * 4})
    assert [(a.rule, a.step) for a in fired] == [("wq_growth", warmup + 1)]


def test_attach_takes_warmup_steps_and_says_what_is_watched(caplog):
    model = book_model()
    with caplog.at_level(logging.INFO, logger="kernels.monitor"):
        mon = AttentionMonitor.attach(model, warmup_steps=200)
    assert mon.alerts.early == (100, 200)
    said = [r.getMessage() for r in caplog.records if "alerts" in r.getMessage()]
    assert len(said) == 1, said
    assert "from step 0" in said[0] and "max_logit" in said[0] and "non-finite" in said[0]
    assert "after step 200" in said[0] and "wq_growth" in said[0]
    assert "warmup_steps" in AttentionMonitor.attach.__doc__
    with pytest.raises(ValueError, match="warmup_steps.*Alerts"):
        AttentionMonitor.attach(model, alerts=Alerts(), warmup_steps=10)
    with pytest.raises(ValueError, match="warmup_steps must be"):
        AttentionMonitor.attach(model, warmup_steps=-1)


# ------------------------------------------------ 3. on_alert after the rows are written
class Stop(Exception):
    """What a user's on_alert raises to stop training."""


@pytest.mark.parametrize("delta", [False, True], ids=["forward", "delta"])
def test_on_alert_runs_after_the_rows_are_written_outside_autograd(tmp_path, delta):
    """on_alert raises (to stop training): the pass that made the reading still ends, the
    step's rows are in memory and in the file, and on_alert ran outside every forward pass
    and backward pass (at the next step() call; the alert after the one that raised waits
    for the next call, here close())."""
    path = tmp_path / "m.csv"
    model = book_model()
    seen = []

    def on_alert(alert):
        inside_forward = any(f.name == "_call_impl" for f in traceback.extract_stack())
        inside_backward = torch._C._current_autograd_node() is not None
        rows_written = len(read_rows(path)) if path.exists() else 0
        seen.append((alert.step, inside_forward, inside_backward, rows_written))
        if len(seen) == 1:
            raise Stop

    mon = AttentionMonitor.attach(
        model, every=1, delta=delta, path=path, alerts={"max_logit": 1e-9}, on_alert=on_alert
    )
    per_step = 2 * 2 * (6 if delta else 4)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        mon.step(0)
        train_pass(model)  # the alert does not interrupt the pass
        assert len(mon.rows) == per_step
        with pytest.raises(Stop):
            mon.step(1)
    assert seen == [(0, False, False, per_step)]
    quietly(mon.close)  # says the alert still waiting (layer 1's)
    assert seen == [(0, False, False, per_step)] * 2
    assert len(read_rows(path)) == per_step


# ------------------------------------------------------- 4. a resumed run appends
def run_steps(model, path, steps, every, **options):
    mon = AttentionMonitor.attach(model, every=every, path=path, alerts=False, **options)
    for step in steps:
        mon.step(step)
        train_pass(model)
    mon.close()
    return mon


def blocks(rows):
    """The file's rows as consecutive blocks: (step, "resume") for a resume row, (step, "")
    for a step's readings."""
    keys = [(s, "resume" if m == "resume" else "") for s, m in zip(rows.step, rows.metric)]
    return [k for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_resumed_run_appends_and_marks_where_it_went_back(tmp_path, suffix, caplog):
    """A run reads steps 0 to 20 and stops; resumed from step 10 with the defaults, it keeps
    what the file held (one logged line says so), writes a resume row, and the table holds
    each step once, the resumed run's values where the two overlap, with no warning."""
    path, model = tmp_path / f"m{suffix}", book_model()
    run_steps(model, path, range(0, 25), every=10)
    with caplog.at_level(logging.INFO, logger="kernels.monitor"):
        resumed = run_steps(model, path, range(10, 35), every=10)
    said = [r.getMessage() for r in caplog.records if "appending" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "step 20" in said[0], said
    rows = read_rows(path)
    assert blocks(rows) == [
        (0, ""),
        (10, ""),
        (20, ""),
        (10, "resume"),
        (10, ""),
        (20, ""),
        (30, ""),
    ]
    assert rows[rows.metric == "resume"].value.tolist() == [20]  # where it went back from
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "repeated rows" warning: the resume says why
        table = layer_table(path)
    assert sorted(set(table.index.get_level_values("step"))) == [0, 10, 20, 30]
    again = layer_table(resumed)
    for step in (10, 20):
        assert table.loc[(step, 1)].max_logit == again.loc[(step, 1)].max_logit
    with caplog.at_level(logging.INFO, logger="kernels.monitor"):
        run_steps(model, path, [0], every=1, append=False)  # asked: starts over
    assert sorted(set(read_rows(path).step)) == [0]
    assert any("starting it over" in r.getMessage() for r in caplog.records)


def cpu_trainer_args(tmp_path, steps, **changes):
    """Hugging Face TrainingArguments for a few quiet CPU steps of a tiny model."""
    from transformers import TrainingArguments

    quiet = dict(report_to=[], logging_strategy="no", use_cpu=True, disable_tqdm=True)
    return TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=2,
        **{"save_strategy": "no", **quiet, **changes},
    )


def test_hugging_face_resume_from_checkpoint_keeps_the_first_steps(tmp_path):
    """The issue's case: a Trainer resumed from a checkpoint lost the steps read before it."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    from kernels.monitor import callbacks

    def trainer(steps, callback):
        model = GPT2LMHeadModel(
            GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
        )
        args = cpu_trainer_args(
            tmp_path, steps, learning_rate=1e-3, save_strategy="steps", save_steps=2
        )
        data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (16, 16))]
        return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])

    path = tmp_path / "m.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(4, callbacks.MonitorTrainerCallback(every=2, path=path, alerts=False)).train()
        assert sorted(set(read_rows(path).step)) == [0, 2]
        trainer(6, callbacks.MonitorTrainerCallback(every=2, path=path, alerts=False)).train(
            resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2")
        )
    assert blocks(read_rows(path)) == [(0, ""), (2, ""), (2, "resume"), (2, ""), (4, "")]
    assert sorted(set(layer_table(path).index.get_level_values("step"))) == [0, 2, 4]


# -------------------------------------------- 5. a model compiled before the monitor came
def through_a_wrapper(model):
    return torch.compile(model, backend="eager")


def through_a_compiled_function(model):
    loss_of = torch.compile(lambda idx, y: model(idx, y), backend="eager")
    return loss_of


@pytest.mark.parametrize(
    "compile_first", [through_a_wrapper, through_a_compiled_function], ids=["wrapper", "function"]
)
def test_a_model_compiled_before_attach_is_named_compiled(compile_first):
    """Compiled (and run) before the monitor is attached to the module itself: the hooks added
    later are never called. One warning says the model is compiled, the monitor switches off;
    no warning blames a pass without gradients."""
    torch._dynamo.reset()
    model = book_model()
    run = compile_first(model)
    train_pass(run)
    mon = AttentionMonitor.attach(model, every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            mon.step(step)
            train_pass(run)
        mon.close()
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "without gradients" in m], said
    off = [m for m in said if "disables itself" in m]
    assert len(off) == 1 and "compiled by torch.compile before the monitor" in off[0], said
    assert "hooks" in off[0] and mon.enabled is False and mon.rows == []


# ----------------------------------------- 6. the Hugging Face callback lets go on failure
class Boom(Exception):
    """A training step that fails."""


def failing_trainer(tmp_path, callback, fail_at):
    """A Trainer whose ``fail_at``-th forward pass raises between its two attention layers
    (the monitor's hooks of the second still on, on a reading step)."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    )
    calls = []

    def fail(module, args):
        calls.append(1)
        if len(calls) == fail_at:
            raise Boom

    model.transformer.h[0].mlp.register_forward_pre_hook(fail)
    args = cpu_trainer_args(tmp_path, 6)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (16, 16))]
    return Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]), model


def monitor_hooks(model):
    """Hooks on the attention modules and their projections (where the monitor hooks)."""
    attention = [m for m in model.modules() if hasattr(m, "c_attn")]
    modules = attention + [p for m in attention for p in (m.c_attn, m.c_proj)]
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in modules)


def test_hugging_face_callback_lets_go_when_training_fails(tmp_path):
    """Training fails on a reading step: ``with callback:`` around ``train()`` detaches the
    monitor (hooks gone, the file closed with what was read)."""
    from kernels.monitor import callbacks

    callback = callbacks.MonitorTrainerCallback(every=2, path=tmp_path / "m.csv")
    trainer, model = failing_trainer(tmp_path, callback, fail_at=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Boom), callback:
            trainer.train()
    assert callback.monitor.detached and monitor_hooks(model) == 0
    assert sorted(set(read_rows(tmp_path / "m.csv").step)) == [0, 2]


def test_hugging_face_callback_lets_go_when_it_is_collected(tmp_path):
    """Without ``with``: once the failed Trainer and its callback are collected, the monitor
    is detached (a finalizer, safe where ``__del__`` is not)."""
    import gc

    from kernels.monitor import callbacks

    callback = callbacks.MonitorTrainerCallback(every=2, path=tmp_path / "m.csv")
    trainer, model = failing_trainer(tmp_path, callback, fail_at=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.train()
        except Boom:
            pass
        monitor = callback.monitor
        assert not monitor.detached and monitor_hooks(model) > 0  # what failing leaves
        del trainer, callback
        gc.collect()
    assert monitor.detached and monitor_hooks(model) == 0


# --------------------------------------------------------- 7. a step is a whole number
@pytest.mark.parametrize("kind", ["tensor", "numpy"])
def test_step_takes_tensors_and_numpy_integers(tmp_path, kind):
    """step(torch.tensor(s)) wrote "tensor(0)" (and a NumPy integer broke JSON lines): both
    are whole numbers, written as such."""
    path, model = tmp_path / "m.jsonl", book_model()
    mon = AttentionMonitor.attach(model, every=2, path=path, alerts=False)
    make = {"tensor": torch.tensor, "numpy": np.int64}[kind]
    for step in range(4):
        assert mon.step(make(step)) is (step % 2 == 0)
        train_pass(model)
    mon.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert {line["step"] for line in lines} == {0, 2}
    assert all(type(line["step"]) is int for line in lines)
    assert all(type(row[0]) is int for row in mon.rows)


def test_step_refuses_what_is_no_whole_number():
    mon = AttentionMonitor.attach(book_model(), every=1)
    for bad in (1.5, "3", torch.tensor([1, 2]), torch.tensor(2.0), True, [3]):
        with pytest.raises(TypeError, match="step must be a whole number"):
            mon.step(bad)
    with pytest.raises(ValueError, match="step must be >= 0"):
        mon.step(-1)


# ------------------------------------------------------ 8. the rows in memory are bounded
def test_rows_in_memory_are_bounded(tmp_path, monkeypatch):
    """.rows keeps the latest ROWS_KEPT rows (the sinks are the record): one warning when a
    monitor without a sink starts to drop rows; keep_rows=0 keeps none, None all."""
    import kernels.monitor.monitor as monitor_module

    kept = int(np.random.randint(10, 30))
    monkeypatch.setattr(monitor_module, "ROWS_KEPT", kept)
    per_step = 2 * 2 * 4

    def run(**options):
        model = book_model()
        mon = AttentionMonitor.attach(model, every=1, alerts=False, **options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(3):
                mon.step(step)
                train_pass(model)
            mon.close()
        return mon, [str(w.message) for w in caught if "rows" in str(w.message)]

    mon, said = run()
    assert len(mon.rows) == kept and mon.rows[-1][0] == 2
    assert len(said) == 1 and f"the latest {kept:,} rows" in said[0]
    everything, said = run(path=tmp_path / "m.csv")
    assert len(everything.rows) == kept and said == []  # the file holds them all
    assert len(read_rows(tmp_path / "m.csv")) == 3 * per_step
    assert len(run(keep_rows=None)[0].rows) == 3 * per_step
    assert run(keep_rows=0, sink=lambda rows: None)[0].rows == []
    assert "ROWS_KEPT" in AttentionMonitor.attach.__doc__


# ------------------------------------------------ 9. warnings point at the user's line
def test_alert_warnings_point_at_the_users_line():
    """The alerts of a step are said by the next step() call: the warning names that line of
    the user's loop (not a line of the monitor or of torch); so do the monitor's other
    warnings and an Alerts fed by hand."""
    model = book_model()
    mon = AttentionMonitor.attach(model, every=1, alerts={"max_logit": 1e-9})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mon.step(0)
        train_pass(model)
        mon.step(1)  # says the alerts of step 0
        here = inspect.currentframe().f_lineno - 1
        mon.step(2)  # step 1 was armed but not run: a RuntimeWarning
        there = inspect.currentframe().f_lineno - 1
        Alerts({"max_logit": 1.0}, warmup_steps=0).update(0, 0, {"max_logit": 2.0})
        by_hand = inspect.currentframe().f_lineno - 1
        mon.close()
    alerts = [w for w in caught if issubclass(w.category, AttentionAlert)]
    assert len(alerts) == 3 and all(w.filename == __file__ for w in alerts)
    assert [w.lineno for w in alerts] == [here, here, by_hand]
    armed = [w for w in caught if "step 1 was armed" in str(w.message)]
    assert len(armed) == 1 and (armed[0].filename, armed[0].lineno) == (__file__, there)


def test_alert_warnings_under_a_trainer_point_at_train(tmp_path):
    """Under the Hugging Face callback the user's line is the one that calls train()."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer

    from kernels.monitor import callbacks

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    )
    args = cpu_trainer_args(tmp_path, 2)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (8, 16))]
    callback = callbacks.MonitorTrainerCallback(every=1, alerts={"max_logit": 1e-9})
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
        line = inspect.currentframe().f_lineno - 1
    alerts = [w for w in caught if issubclass(w.category, AttentionAlert)]
    assert alerts and all((w.filename, w.lineno) == (__file__, line) for w in alerts)
