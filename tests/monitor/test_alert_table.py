"""The replay of every stored GPT-2 run (kernels.monitor.stored_alerts.alert_table): the right
lead and false alarms on synthetic runs, every stored failing run flagged before it
departed, and the false alarms the table reports are those a direct replay gives."""

import numpy as np
import pytest

from kernels.gpt2 import screen
from kernels.monitor.alerts import THRESHOLDS, WARMUP_STEPS, replay
from kernels.monitor.stored_alerts import (
    alert_row,
    alert_summary,
    alert_table,
    own_growth,
    replay_warmup,
    run_kind,
    runs_away,
    stored_runs,
)


def synthetic(steps, logits, explosion=None, layers=1, wq=None, warmup=None):
    """A stored run of readings every 100 steps: calm readings but for ``logits``
    (step -> largest |S|) and ``wq`` (step -> the largest head's ‖W_Q‖₂, else 1); ``warmup``:
    the run's learning-rate warmup (config.warmup)."""
    wq = wq or {}
    monitor = [
        {
            "step": step,
            "wq_norms": [[wq.get(step, 1.0), 1.0] for _ in range(layers)],
            "layers": [
                {"rows": 100, "rows_tied_bf16": 1, "max_logit": logits.get(step, 20.0)}
                for _ in range(layers)
            ],
        }
        for step in range(0, steps, 100)
    ]
    summary = {"steps_done": steps, "explosion_step": explosion}
    run = {"monitor": monitor, "summary": summary}
    if warmup is not None:
        run["config"] = {"warmup": warmup}
    return run


def test_a_failing_run_that_alerts_before_it_departs_gets_its_lead():
    run = synthetic(5000, {3000: 1e3, 3100: 1e4, 4500: 1e6}, explosion=4600)
    row = alert_row("x-U-s1", run, run_kind("x-U-s1", run))
    assert row["kind"] == "failing path"
    assert (row["departed"], row["first_alert"], row["first_rule"]) == (4600, 3000, "max_logit")
    assert row["lead"] == 1600
    assert row["false_alarms"] == 0


def test_the_first_alert_names_the_layer_it_came_from():
    layer = 1 + int(np.random.default_rng().integers(2))  # layer 1 or 2 of three
    run = synthetic(4000, {}, layers=3)
    for reading in run["monitor"]:
        if reading["step"] >= 2000:
            reading["layers"][layer]["max_logit"] = THRESHOLDS["max_logit"] * 2
    row = alert_row("x-A-s1", run, run_kind("x-A-s1", run))
    assert (row["first_alert"], row["first_rule"], row["first_layer"]) == (2000, "max_logit", layer)


def test_a_healthy_run_with_one_spike_counts_one_false_alarm():
    run = synthetic(5000, {2500: THRESHOLDS["max_logit"] + 1})
    row = alert_row("x-F-s1", run, run_kind("x-F-s1", run))
    assert row["kind"] == "healthy control"
    assert row["departed"] is None and row["lead"] is None
    assert (row["alerts"], row["false_alarms"], row["rules"]) == (1, 1, "max_logit")


def test_a_spike_past_the_screens_rule_makes_a_control_runaway_not_a_false_alarm():
    run = synthetic(5000, {2500: 500.0})
    row = alert_row("x-F-s1", run, run_kind("x-F-s1", run))
    assert row["kind"] == "runaway control" and row["false_alarms"] == 0 and row["alerts"] == 1


def test_the_other_variants_are_each_a_kind_and_a_row_of_their_own():
    run = synthetic(5000, {})
    kinds = {name: run_kind(name, run) for name in ("tb-W-s1", "tb-V-s1", "tb-A-s1")}
    assert kinds == {"tb-W-s1": "FA2 kernel", "tb-V-s1": "FA2 kernel's control", "tb-A-s1": "SDPA"}
    assert run_kind("k4c-B-s1", run) == run_kind("k4c-N-s1", run) == "perturbed control"
    assert run_kind("single-paper", run) == "check" and run_kind("x-Q-s1", run) == "other"
    runs = [
        ("f", "x-W-s1", synthetic(5000, {3000: 1e3}, explosion=4600)),
        ("f", "x-A-s1", synthetic(5000, {})),
        ("f", "x-B-s1", synthetic(5000, {})),
        ("f", "ddp2-paper", synthetic(300, {})),
        ("f", "x-U-s1", synthetic(5000, {}, explosion=4000)),
    ]
    groups = [g["group"] for g in alert_summary(alert_table(runs))]
    assert groups == [
        "failing paths, departed",
        "FA2 kernel, departed",
        "SDPA flash",
        "control, δ biased or noised",
        "DDP checks",
    ]
    w = alert_summary(alert_table(runs))[1]
    assert (w["runs"], w["alerted"], w["lead_min"]) == (1, 1, 1600)


def test_a_long_lr_warmup_moves_the_wq_level_after_it():
    assert replay_warmup(synthetic(5000, {})) == WARMUP_STEPS
    assert replay_warmup(synthetic(5000, {}, warmup=200)) == WARMUP_STEPS
    assert replay_warmup(synthetic(5000, {}, warmup=2000)) == 4000
    # ‖W_Q‖ low while the learning rate warms up (to step 2,000), then 4 from there on: a
    # level taken in warmup (steps 500 to 1,000) makes the run look 4 times grown
    wq = {step: 1.0 if step < 2000 else 4.0 for step in range(0, 8000, 100)}
    in_warmup = synthetic(8000, {}, wq=wq)
    after = synthetic(8000, {}, wq=wq, warmup=2000)
    assert [a.rule for a in replay(in_warmup)] == ["wq_growth"]
    row = alert_row("x-F-s1", after, run_kind("x-F-s1", after))
    assert row["alerts"] == 0 and row["rules"] == ""
    assert alert_row("x-F-s1", in_warmup, "healthy control")["rules"] == "wq_growth"
    # the largest |S| over its own level uses the same window
    logits = {step: 10.0 if step < 2000 else 40.0 for step in range(0, 8000, 100)}
    assert own_growth(synthetic(8000, logits)) == 4.0
    assert own_growth(synthetic(8000, logits, warmup=2000)) == 1.0


def test_the_summary_counts_the_synthetic_runs():
    runs = [
        ("f", "x-U-s1", synthetic(5000, {3000: 1e3}, explosion=4600)),
        ("f", "x-U-s2", synthetic(5000, {}, explosion=4000)),
        ("f", "x-F-s1", synthetic(5000, {2500: 70.0})),
        ("f", "x-F-s2", synthetic(5000, {})),
    ]
    groups = {g["group"]: g for g in alert_summary(alert_table(runs))}
    failing, healthy = groups["failing paths, departed"], groups["healthy controls"]
    assert (failing["runs"], failing["alerted"], failing["lead_min"]) == (2, 1, 1600)
    assert (healthy["runs"], healthy["alerted"], healthy["false_alarms"]) == (2, 1, 1)


@pytest.fixture(scope="module")
def stored():
    return {name: run for _, name, run in stored_runs()}, alert_table()


def test_every_stored_failing_run_is_flagged_before_it_departs(stored):
    _, table = stored
    failing = table[(table.kind == "failing path") & table.departed.notna()]
    assert len(failing) >= 18
    assert failing.first_alert.notna().all(), list(failing.run[failing.first_alert.isna()])
    assert (failing.first_alert < failing.departed).all()
    assert (failing.lead == failing.departed - failing.first_alert).all()


def test_the_false_alarms_are_those_a_direct_replay_gives(stored):
    runs, table = stored
    for row in table.itertuples():
        run = runs[row.run]
        fired = replay(run, warmup_steps=replay_warmup(run)) if row.departed != row.departed else []
        want = len(fired) if row.kind == "healthy control" else 0
        assert row.false_alarms == want, row.run
        if fired:
            assert row.rules == ",".join(sorted({a.rule for a in fired})), row.run
    # the long real-BF16 controls alert, and the table says so
    long_controls = table[table.run.isin(["bf16-F-s0", "bf16-F-s1"])]
    assert (long_controls.alerts > 0).all() and long_controls.long.all()


def test_runs_away_is_the_screens_rule(stored):
    runs, _ = stored
    for name, run in runs.items():
        if run["monitor"][-1]["step"] >= screen.BASE_STEP and "-F-" in name:
            assert runs_away(run) == (not screen.health(run)["healthy"]), name


def test_what_chapter_9_says_of_the_table(stored):
    """The prose: which healthy controls alarm, that every runaway control alerts, and
    that the long controls' largest |S| grows far more over its own level than a
    healthy control's."""
    from kernels.monitor.stored_alerts import alert_numbers

    _, table = stored
    alarmed = table[table.false_alarms > 0]
    assert set(alarmed.run) == {"e-qknorm-lr2e-3-F-s0", "h-qknorm-const6e-3-F-s0", "sb-lr5e-4-F-s1"}
    assert set(alarmed.rules[alarmed.run.str.contains("qknorm")]) == {"ties_bf16"}
    numbers = alert_numbers(table)
    assert numbers["m9_all_flagged"] == numbers["m9_all_failing"]
    assert numbers["m9_all_runaway_alerted"] == numbers["m9_all_runaway"]
    assert numbers["m9_all_growth_long"] > 10 * numbers["m9_all_growth_healthy"]
    # the long real-BF16 controls alert last, after the screen's and the second testbed's
    firsts = [numbers[f"m9_all_{g}_first_hi"] for g in ("runaway", "long_tb")]
    assert max(firsts) < numbers["m9_all_long_real_first_lo"]
    # no stored run falls outside the named kinds, and the second testbed's warmup is longer
    assert "other" not in set(table.kind)
    assert numbers["m9_all_warmup_max"] == 4000
    assert numbers["m9_all_w_alerted"] == numbers["m9_all_w"] > 0
