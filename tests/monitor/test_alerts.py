"""The alert rules (kernels.monitor.alerts): thresholds that are what the stored healthy
runs reached, alerts that fire on every stored failing run before its loss exploded and
on no healthy run, once per crossing, through warnings and on_alert, from a live
monitor too."""

import math
import warnings

import numpy as np
import pytest
import torch

import kernels  # noqa: F401
from kernels.gpt2 import GPT, GPTConfig, report
from kernels.monitor import THRESHOLDS, Alert, Alerts, AttentionAlert, AttentionMonitor
from kernels.monitor.alerts import RULES, replay, thresholds_from_runs


def stored_runs():
    """Chapter 9's healthy and failing runs (§6)."""
    first, amp = {}, {}
    for plan in ("probe", "probe2", "seeds"):
        first.update(report.load_search(plan)["data"]["runs"])
    for plan in ("amplify", "amp_seeds", "amp_final"):
        amp.update(report.load_search(plan)["data"]["runs"])
    stored = {**first, **amp}
    ended = {name: report.outcome(run) for name, run in stored.items()}
    healthy = {
        name: run
        for name, run in stored.items()
        if ended[name]["event"] is None
        and not run["config"]["qk_norm"]
        and (name in first or report.parse_name(name)[1] == "F")
    }
    failing = {name: run for name, run in stored.items() if ended[name]["event"] == "explosion"}
    return healthy, failing, ended


@pytest.fixture(scope="module")
def runs():
    return stored_runs()


def test_thresholds_are_what_the_healthy_runs_reached(runs):
    healthy, _, _ = runs
    drawn = thresholds_from_runs(healthy.values())
    assert set(drawn) == set(RULES) == set(THRESHOLDS)
    for rule in RULES:
        assert THRESHOLDS[rule] == drawn[rule], rule  # exactly: no rounding


def test_fires_on_every_failing_run_before_it_explodes_and_never_on_a_healthy_one(runs):
    healthy, failing, ended = runs
    for name, run in healthy.items():
        assert replay(run) == [], name
    for name, run in failing.items():
        fired = replay(run, until=ended[name]["step"])
        assert fired, name
        assert {a.rule for a in fired} >= {"ties_bf16", "wq_growth", "max_logit"}, name
        assert min(a.step for a in fired) < ended[name]["step"] - 200, name


def test_once_per_crossing_and_on_alert():
    """A random walk around a random threshold: one alert per upward crossing, none while
    it stays above. A ceiling is watched from step 0, whatever the warmup."""
    threshold = float(np.random.uniform(1, 10))
    values = threshold * (1 + 0.3 * np.random.randn(60))
    got = []
    alerts = Alerts({"max_logit": threshold}, early=(0, 5), on_alert=got.append, warn=False)
    for step, value in enumerate(values):
        alerts.update(step, 0, {"max_logit": float(value)})
    above = values > threshold
    want = [s for s in range(60) if above[s] and (s == 0 or not above[s - 1])]
    assert [a.step for a in got] == want
    assert got == alerts.fired and all(isinstance(a, Alert) for a in got)
    assert all(a.value > threshold and a.rule == "max_logit" for a in got)


def test_wq_growth_is_against_the_layers_own_early_level():
    level = float(np.random.uniform(0.5, 5))
    alerts = Alerts(early=(0, 3), warn=False)
    for step in range(4):  # early: level, level...
        alerts.update(step, 1, {"wq_norm": level})
    assert alerts.update(4, 1, {"wq_norm": level * THRESHOLDS["wq_growth"] * 0.99}) == []
    fired = alerts.update(5, 1, {"wq_norm": level * THRESHOLDS["wq_growth"] * 1.01})
    assert [(a.rule, a.layer) for a in fired] == [("wq_growth", 1)]
    assert fired[0].value == pytest.approx(THRESHOLDS["wq_growth"] * 1.01)


def test_a_lean_alone_is_no_alert():
    alerts = Alerts(early=(0, 0), warn=False)
    alerts.update(0, 0, {"wq_norm": 1.0})
    for step in range(1, 12):  # leans +1 but W_Q stays at its level
        assert alerts.update(step, 0, {"wq_norm": 1.0, "delta_err": 1.0, "delta_abs": 1.0}) == []
    fired = alerts.update(12, 0, {"wq_norm": 10.0, "delta_err": 1.0, "delta_abs": 1.0})
    assert {a.rule for a in fired} == {"wq_growth", "delta_lean"}


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError, match="unknown alert rule 'ties'"):
        Alerts({"ties": 0.1})
    with pytest.raises(ValueError, match="finite number or None"):
        Alerts({"max_logit": math.nan})
    with pytest.raises(TypeError, match="on_alert must be a function"):
        Alerts(on_alert=3)


def test_the_monitor_warns_once_per_crossing_and_calls_on_alert():
    """A live monitor with a threshold below what the model reads: a warning and a
    callback for each layer once, not again on the next reading step."""
    model = GPT(GPTConfig(block_size=24, n_layer=2, n_head=2, n_embd=32, attn="sdpa"))
    got = []
    mon = AttentionMonitor.attach(model, every=1, on_alert=got.append, alerts={"max_logit": 1e-9})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            mon.step(step)
            idx = torch.randint(0, 256, (2, 24))
            model(idx, idx)[1].backward()
        mon.close()
    alerts = [w for w in caught if issubclass(w.category, AttentionAlert)]
    assert [(a.step, a.layer, a.rule) for a in got] == [(0, 0, "max_logit"), (0, 1, "max_logit")]
    assert len(alerts) == 2 and "step 0, layer 0: max_logit" in str(alerts[0].message)
    assert "(your threshold)" in str(alerts[0].message)
    book = Alert(5, 0, "ties_bf16", 0.5, THRESHOLDS["ties_bf16"]).message
    assert "the most any healthy run of the book reached" in book
    logits = {(s, l): v for s, l, h, m, v in mon.rows if m == "max_logit" and h == 0}
    assert got[0].value >= logits[(0, 0)]
    quiet = AttentionMonitor.attach(model, every=1, alerts=False)
    assert quiet.alerts is None
    with pytest.raises(ValueError, match="on_alert needs alerts on"):
        AttentionMonitor.attach(model, alerts=False, on_alert=print)
