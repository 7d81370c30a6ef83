"""The second testbed's report (kernels/gpt2/testbed.py): survival counted right on runs built
here, repeats and the screen's runs gathered from files, and the stored arms recounted."""

import json

import numpy as np
import pytest

from kernels.gpt2 import testbed
from kernels.gpt2.plans import plan

LAYERS, HEADS = 4, 4


def _run(rng, name, steps, boom=None, begin=None, every=200, log=10):
    """A stored run called ``name`` (its config the plan's, steps changed): the loss jumps by 4
    nats at ``boom``; layer 0's largest |S| jumps to 1e4 at check ``begin``."""
    config = dict(dict(plan("testbed"))[name], steps=steps, name=name)
    history = {"step": list(range(0, steps, log))}
    loss = 1.0 + 0.05 * rng.random(len(history["step"]))
    if boom is not None:
        loss[np.asarray(history["step"]) >= boom] += 4.0
    history.update(loss=list(loss), wall_s=[s / 50 for s in history["step"]])
    checks = []
    for s in range(0, steps, every):
        logits = rng.uniform(1, 50, LAYERS)
        if begin is not None and s >= begin:
            logits[0] = 1e4
        norms = rng.uniform(1, 2, (LAYERS, HEADS)).tolist()
        checks.append({"step": s, "wq_norms": norms, "layers": [{"max_logit": x} for x in logits]})
    summary = {"steps_done": steps, "steps_per_s": 50.0}
    return {"config": config, "history": history, "monitor": checks, "summary": summary}


def _store(directory, name, runs):
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"provenance": {}, "data": {"runs": runs}}))


def _km_by_definition(pairs):
    """Kaplan–Meier at each distinct explosion step t: Π (1 − d_t / n_t), n_t the runs whose last
    step is ≥ t, d_t the explosions at t."""
    times = sorted({step for step, exploded in pairs if exploded})
    share, out = 1.0, []
    for t in times:
        n = sum(step >= t for step, _ in pairs)
        d = sum(step == t and exploded for step, exploded in pairs)
        share *= 1 - d / n
        out.append((t, share))
    return out


def test_kaplan_meier_matches_its_definition():
    rng = np.random.default_rng()
    for _ in range(50):
        n = int(rng.integers(1, 12))
        steps = rng.integers(1, 8, n) * 1_000  # few distinct steps: ties of all kinds
        pairs = list(zip(steps.tolist(), (rng.random(n) < 0.5).tolist()))
        km_steps, km_shares = testbed.kaplan_meier(pairs)
        assert km_steps[0] == 0 and km_shares[0] == 1.0
        expected = _km_by_definition(pairs)
        # the curve after the last explosion at each step equals the definition's value there
        for t, share in expected:
            last = np.flatnonzero(km_steps == t)[-1]
            assert km_shares[last] == pytest.approx(share, abs=1e-12)
        assert np.all(np.diff(km_shares) <= 0)


def test_runs_repeats_and_the_screens_runs_are_gathered(tmp_path):
    rng = np.random.default_rng()
    boom = int(rng.integers(12, 25)) * 1_000 + 500
    begin = int(rng.integers(5, 40)) * 200
    first = {
        "tb-W-s1": _run(rng, "tb-W-s1", 30_000, boom=boom, begin=begin),
        "tb-F-s1": _run(rng, "tb-F-s1", 32_000),
    }
    again = {"tb-F-s1": _run(rng, "tb-F-s1", 28_000, begin=begin + 400)}
    _store(tmp_path, "gpt2_testbed", first)
    _store(tmp_path, "gpt2_testbed_F_repeat", again)
    screen_u = _run(rng, "tb-U-s1", 20_000)
    screen_f = _run(rng, "tb-F-s1", 20_000)
    _store(tmp_path, "gpt2_screen", {"sb-lr5e-4-U-s1": screen_u, "sb-lr5e-4-F-s1": screen_f})
    runs = testbed.testbed_runs(tmp_path)
    assert sorted(runs) == ["F-s1", "U-s1", "W-s1"]
    assert [r["summary"]["steps_done"] for r in runs["F-s1"]] == [32_000, 28_000, 20_000]
    ((seed, step, exploded),) = testbed.arm_endings(runs, "W")
    assert seed == "s1" and exploded and abs(step - boom) <= 200
    assert testbed.arm_endings(runs, "F", repeats=True) == [
        ("s1", 32_000, False),
        ("s1", 28_000, False),
        ("s1", 20_000, False),
    ]
    assert testbed.runaway_begins(runs["W-s1"][0]) == begin
    assert testbed.runaway_begins(runs["F-s1"][0]) is None
    table = testbed.survival_table(runs).set_index("arm")
    fa2 = table.loc[testbed.ARM_WORDS["W"]]
    assert (fa2.seeds, fa2.exploded) == (1, 1)
    assert fa2["seed: last step (× exploded)"].strip() == f"1: {step:,}×"
    control = table.loc[testbed.ARM_WORDS["F"], "seed: last step (× exploded)"]
    assert control.strip() == "1: 32,000"
    # one width for every arm's cell, so that the printed columns line up
    assert len(control) == len(fa2["seed: last step (× exploded)"])
    numbers = testbed.testbed_numbers(runs)
    assert numbers["g7_tb_F_runs"] == 3 and numbers["g7_tb_F_begin_lo"] == begin + 400
    assert numbers["g7_tb_F_reached"] == 1 and numbers["g7_tb_W_reached"] == 1
    assert numbers["g7_tb_W_boom"] == 1 and numbers["g7_tb_U_boom"] == 0
    assert (numbers["g7_tb_F_rep"], numbers["g7_tb_F_rep_boom"]) == (2, 0)
    assert (numbers["g7_tb_W_rep"], numbers["g7_tb_U_rep"]) == (0, 0)
    line = testbed.repeat_line(runs, "F")
    assert "seed 1 alive at 28,000" in line and "seed 1 alive at 20,000" in line
    assert "32,000" not in line and testbed.repeat_line(runs, "W") == ""
    # a screen run trained otherwise is refused, not silently counted
    screen_u["config"]["lr"] = 1e-3
    _store(tmp_path, "gpt2_screen", {"sb-lr5e-4-U-s1": screen_u, "sb-lr5e-4-F-s1": screen_f})
    with pytest.raises(ValueError, match="sb-lr5e-4-U-s1"):
        testbed.testbed_runs(tmp_path)


def test_stored_arms_recounted_from_the_logs():
    """The stored testbed: each arm's explosions recounted from the raw losses (a jump of a
    nat above the running minimum, for good), and every run trained as the plan says."""
    runs = testbed.testbed_runs()
    planned = dict(plan("testbed"))
    numbers = testbed.testbed_numbers(runs)
    for key, stored in runs.items():
        for run in stored:
            assert testbed.same_training(run, planned[f"tb-{key}"])
    for arm in "WVAF":
        longest = [runs[key][0] for key in runs if key[0] == arm]
        booms = []
        for run in longest:
            loss = np.asarray(run["history"]["loss"], dtype=float)
            smooth = np.convolve(loss, np.ones(20) / 20, mode="valid")
            floor = np.minimum.accumulate(smooth)
            booms.append(bool((smooth[-40:] > floor[-40:] + 0.5).all()))
        assert numbers[f"g7_tb_{arm}_boom"] == sum(booms), arm
        assert numbers[f"g7_tb_{arm}_seeds"] == len(longest)


def test_wq_ratios_pair_seeds_at_the_reading_before_the_step():
    """Seed by seed, one arm's layer-0 largest ‖W_Q‖ over another's at the last reading at or
    before the step; seeds missing either arm, or too short, are left out; none left is an
    error."""
    rng = np.random.default_rng()
    runs = {
        "W-s1": [_run(rng, "tb-W-s1", 2_000)],
        "A-s1": [_run(rng, "tb-A-s1", 2_000)],
        "W-s2": [_run(rng, "tb-W-s2", 2_000)],  # no A in seed 2
        "W-s3": [_run(rng, "tb-W-s3", 400)],  # too short for any step drawn below
        "A-s3": [_run(rng, "tb-A-s3", 2_000)],
    }
    step = int(rng.integers(500, 1_900))
    reading = (step // 200) * 200  # the monitor reads every 200 steps
    norms = {}
    for key in ("W-s1", "A-s1"):
        check = next(c for c in runs[key][0]["monitor"] if c["step"] == reading)
        check["wq_norms"][0][int(rng.integers(HEADS))] = norms[key] = float(rng.uniform(5, 50))
    got = testbed.wq_ratios(runs, "W", "A", step)
    assert got == [pytest.approx(norms["W-s1"] / norms["A-s1"])]
    with pytest.raises(ValueError, match="no seed has both"):
        testbed.wq_ratios(runs, "W", "A", 5_000)


def test_a_plans_record_is_described_without_its_run_list():
    """The command a chapter prints under a GPU search keeps the plan and drops the run codes
    (``--only tb-W-s1,…``), pointing to results/README.md for them; a command without them is
    printed whole."""
    from kernels.gpt2 import chapter_tables as tables

    rng = np.random.default_rng()
    codes = ",".join(f"tb-{a}-s{int(rng.integers(1, 9))}" for a in rng.choice(list("WAF"), 3))
    provenance = {"gpu": "H200", "torch": "2", "triton": "3", "date": "2026-11-28",
                  "command": f"python -m kernels.gpt2.search --plan testbed --only {codes} "
                             "--fast --minutes 8.4"}  # fmt: skip
    text = tables.describe_plan({"provenance": provenance})
    assert codes not in text and "tb-" not in text
    assert "--plan testbed …" in text and "--fast --minutes 8.4" in text
    assert "results/README.md" in text
    whole = dict(provenance, command="python -m kernels.gpt2.search --plan ddp")
    assert "README" not in tables.describe_plan({"provenance": whole})


def test_the_end_loss_line_names_only_arms_that_trained_the_whole_schedule():
    rng = np.random.default_rng()
    lo, hi = sorted(rng.uniform(0.2, 0.5, 2))
    numbers = {"g7_tb_steps": 80_000, "g7_tb_V_end_lo": lo, "g7_tb_V_end_hi": hi,
               "g7_tb_V_full": 2, "g7_tb_A_end_lo": 0.0, "g7_tb_A_end_hi": 0.0,
               "g7_tb_A_full": 0}  # fmt: skip
    line = testbed.end_loss_line(numbers, "VA")
    assert f"{lo:.3f}–{hi:.3f} (2 runs)" in line and testbed.ARM_WORDS["A"] not in line
    one = testbed.end_loss_line({**numbers, "g7_tb_V_end_hi": lo, "g7_tb_V_full": 1}, "V")
    assert one.endswith(f"{testbed.ARM_WORDS['V']} {lo:.3f} (1 run)")


def test_run_name_and_parse_name_are_inverse():
    from kernels.gpt2.plans import run_name
    from kernels.gpt2.runs import parse_name

    rng = np.random.default_rng()
    config = rng.choice(["k4", "tb", "sb-lr5e-4", "f-const3e-3"])
    variant, seed = rng.choice(list("UFWVAPZS")), int(rng.integers(0, 9))
    assert parse_name(run_name(config, variant, seed)) == (config, variant, f"s{seed}")
