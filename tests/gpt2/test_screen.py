"""The testbed screen's table (kernels/gpt2/screen.py): verdicts on runs built here, and on the
stored screen recomputed from the raw checks."""

import importlib.util

import numpy as np
import pandas as pd
import pytest

from kernels.env import REPO_ROOT
from kernels.gpt2 import report, screen
from kernels.gpt2.plans import SCREEN_BASE, variant_options

LAYERS, HEADS = 4, 4


def _run(rng, variant, logits, wq, steps=20_000, boom=None, every=200, log=10, **config):
    """A stored run of ``steps`` steps: ``logits(step)`` and ``wq(step)`` give each check's
    largest |S| and ‖W_Q‖₂ (layers × heads); the loss jumps by 4 nats at ``boom``."""
    history = {"step": list(range(0, steps, log))}
    loss = 1.0 + 0.05 * rng.random(len(history["step"]))
    if boom is not None:
        loss[np.asarray(history["step"]) >= boom] += 4.0
    history.update(loss=list(loss), wall_s=[s / 50 for s in history["step"]])
    checks = [
        {
            "step": s,
            "wq_norms": wq(s).tolist(),
            "layers": [{"max_logit": float(x)} for x in logits(s)],
        }
        for s in range(0, steps, every)
    ]
    cfg = dict(SCREEN_BASE, **variant_options(variant), **config)
    summary = {"steps_done": steps, "steps_per_s": 50.0}
    return {"config": cfg, "history": history, "monitor": checks, "summary": summary}


def _calm(rng, level=None):
    """Each check's largest |S| per layer (random, under 50) and ‖W_Q‖₂ per head (1 to 2)."""
    level = rng.uniform(5, 45) if level is None else level
    logits = lambda s: rng.uniform(0.2, 1.0, LAYERS) * level  # noqa: E731
    wq = lambda s: rng.uniform(1.0, 2.0, (LAYERS, HEADS))  # noqa: E731
    return logits, wq


def _runaway(rng, layer, head, start, factor, logit_top):
    """One head of ``layer`` whose ‖W_Q‖₂ grows ``factor`` times from ``start`` on, and that
    layer's largest |S| climbing to ``logit_top`` by the end."""
    base_logits, base_wq = _calm(rng, level=10.0)
    end = 20_000 - 200

    def logits(s):
        out = base_logits(s)
        out[layer] = max(out[layer], logit_top ** (max(s - start, 0) / (end - start)))
        return out

    def wq(s):
        out = np.full((LAYERS, HEADS), 1.5)
        out[layer, head] = 1.5 * factor ** (max(s - start, 0) / (end - start))
        return out

    return logits, wq


@pytest.fixture
def synthetic():
    rng = np.random.default_rng()
    boom = int(rng.integers(5, 15)) * 1_000 + 500
    layer, head = (int(x) for x in rng.integers(0, 4, 2))
    big = float(rng.uniform(1e3, 1e5))
    runs = {
        # a failing path that explodes next to a healthy control
        "xa-U-s1": _run(rng, "U", *_runaway(rng, 0, 1, 3_000, 50.0, 1e6), boom=boom),
        "xa-F-s1": _run(rng, "F", *_calm(rng)),
        # a control whose |S| runs away (and whose ‖W_Q‖ does too), next to a survivor
        "xb-U-s1": _run(rng, "U", *_runaway(rng, layer, head, 4_000, 30.0, big), lr=5e-4),
        "xb-F-s1": _run(rng, "F", *_runaway(rng, layer, head, 8_000, 10.0, big), lr=5e-4),
        # a control whose ‖W_Q‖ grows 4× while its |S| stays small
        "xc-U-s2": _run(rng, "U", *_calm(rng), batch_size=128),
        "xc-F-s2": _run(rng, "F", *_runaway(rng, 1, 2, 5_000, 4.0, 20.0), batch_size=128),
    }
    return runs, dict(boom=boom, layer=layer, big=big)


def test_verdicts_and_fates_of_runs_built_to_order(synthetic):
    runs, made = synthetic
    table = screen.screen_table(runs, reference={}).set_index("config")
    assert list(table.index) == ["xa", "xb", "xc"]
    assert list(table.verdict) == ["healthy", "runs away", "runs away"]
    assert list(table.changed) == ["none (the paper's)", "lr 5e-4", "batch 128"]
    explosion = table.loc["xa", "exploded"]
    assert abs(explosion - made["boom"]) <= 200  # the centre of a 20-log smoothing window
    assert table.loc["xa", "failing_path"] == f"exploded at {explosion:,}"
    assert table.loc["xb", "failing_path"].startswith("survived: |S| ")
    assert pd.isna(table.loc["xc", "exploded"])
    # the runaway control: its largest |S| in the layer made to run away, at the last check
    assert table.loc["xb", "layer"] == made["layer"]
    assert table.loc["xb", "max_logit"] == pytest.approx(made["big"], rel=1e-9)
    assert table.loc["xb", "wq_growth"] > screen.WQ_GROWTH_LIMIT
    assert table.loc["xc", "max_logit"] < screen.MAX_LOGIT_LIMIT  # caught by growth alone
    assert table.loc["xc", "wq_growth"] == pytest.approx(
        4.0 ** ((19_800 - 5_000) / 14_800) * 1.5 / runs["xc-F-s2"]["monitor"][10]["wq_norms"][1][2]
    )
    # the healthy control breaks the rule nowhere; the others at a check after their start
    assert pd.isna(table.loc["xa", "broken_at"])
    assert 8_000 < table.loc["xb", "broken_at"] < 20_000
    text = screen.as_text(table.reset_index())
    # pairs are named by what changed and their seed, never by the runs' file names
    assert "exploded at" in text and "seed" in text
    assert not any(f"{c} s" in text for c in ("xa", "xb", "xc"))
    lines = text.splitlines()
    assert any(line.startswith(table.loc["xa", "changed"]) for line in lines)
    # the step each run broke the rule at, "—" for the healthy control
    xb = next(line for line in lines if line.startswith(table.loc["xb", "changed"]))
    xa = next(line for line in lines if line.startswith(table.loc["xa", "changed"]))
    assert f"{table.loc['xb', 'broken_at']:,}" in xb and "—" in xa


def test_a_control_at_the_limit_runs_away(synthetic):
    runs, _ = synthetic
    control = runs["xa-F-s1"]
    control["monitor"][-1]["layers"][2]["max_logit"] = screen.MAX_LOGIT_LIMIT
    stats = screen.health(control)
    assert (stats["max_logit"], stats["layer"], stats["healthy"]) == (100.0, 2, False)
    assert screen.rule_broken_at(control) == control["monitor"][-1]["step"]


def test_first_steps_cuts_a_longer_run_to_the_screen():
    rng = np.random.default_rng()
    late = int(rng.integers(25, 70)) * 1_000
    run = _run(rng, "U", *_calm(rng), steps=80_000, boom=late, every=100, warmup=200)
    cut = screen.first_steps(run)
    steps = [m["step"] for m in cut["monitor"]]
    assert steps == list(range(0, screen.SCREEN_STEPS, screen.SCREEN_EVERY))
    assert max(cut["history"]["step"]) < screen.SCREEN_STEPS
    assert len(cut["history"]["loss"]) == len(cut["history"]["step"])
    assert cut["summary"]["steps_done"] == screen.SCREEN_STEPS
    assert report.outcome(run)["step"] > late - 200 > screen.SCREEN_STEPS  # past the cut
    assert screen.fate(cut)["exploded"] is None
    assert len(run["monitor"]) == 800  # the run itself is untouched
    assert "warmup 200" in screen.what_changed(run["config"])


def _recomputed(run, steps=None, every=None):
    """The rule's numbers straight from a run's raw checks."""
    checks = [
        m
        for m in run["monitor"]
        if (steps is None or m["step"] < steps) and (every is None or m["step"] % every == 0)
    ]
    logit = max(s["max_logit"] for m in checks for s in m["layers"])
    largest = [max(max(h) for h in m["wq_norms"]) for m in checks]
    base = next(w for m, w in zip(checks, largest) if m["step"] >= 2_000)
    return logit, largest[-1], largest[-1] / base


@pytest.fixture(scope="module")
def stored():
    runs = report.load_search("screen")["data"]["runs"]
    reference = report.real_bf16_runs()
    return runs, reference, screen.screen_table(runs, reference)


def test_the_stored_screen_recomputed_from_its_checks(stored):
    runs, reference, table = stored
    healthy = set()
    for row in table.itertuples():
        seed = f"s{row.seed}"
        if row.config == screen.REFERENCE:
            control = reference["F", seed]
            logit, wq, growth = _recomputed(control, steps=20_000, every=200)
        else:
            control = runs[f"{row.config}-F-{seed}"]
            logit, wq, growth = _recomputed(control)
        assert (row.max_logit, row.wq_end) == (logit, wq)
        assert row.wq_growth == pytest.approx(growth, rel=1e-12)
        if logit < 100 and growth < 3:
            healthy.add((row.config, row.seed))
        assert (row.verdict == "healthy") == ((row.config, row.seed) in healthy)
    # the screen's one healthy control is lr 5e-4's; the testbed's pass in their first 20k steps
    assert healthy == {("sb-lr5e-4", 1), (screen.REFERENCE, 0), (screen.REFERENCE, 1)}
    assert len(table) == 7 and set(table.config) == {
        "sa-paper",
        "sb-lr5e-4",
        "sc-n512",
        "sd-b128",
        screen.REFERENCE,
    }


def test_the_stored_failing_paths_and_the_testbeds_later_runaway(stored):
    runs, reference, table = stored
    for row in table.itertuples():
        if row.config == screen.REFERENCE:
            assert pd.isna(row.exploded)  # the testbed's seed 1 exploded only after 50k steps
            continue
        summary = runs[f"{row.config}-U-s{row.seed}"]["summary"]
        assert summary["explosion_step"] == (None if pd.isna(row.exploded) else row.exploded)
    for seed in screen.REFERENCE_SEEDS:  # over their full runs the testbed's controls run away
        logit, _, growth = _recomputed(reference["F", seed])
        assert logit >= 100 or growth >= 3
        assert screen.rule_broken_at(reference["F", seed]) > screen.SCREEN_STEPS


def test_the_reference_files_hold_the_reference_runs(stored):
    _, reference, _ = stored
    held = {}
    for name in screen.REFERENCE_FILES:
        for run_name, run in report.load_search(name)["data"]["runs"].items():
            _, variant, seed = report.parse_name(run_name)
            held[variant, seed] = run["summary"]["steps_done"]
    for seed in screen.REFERENCE_SEEDS:
        for variant in "UF":
            assert held[variant, seed] == reference[variant, seed]["summary"]["steps_done"]


def test_the_printed_table_passes_the_sites_table_check(stored):
    spec = importlib.util.spec_from_file_location("site_rules", REPO_ROOT / "tests/test_site.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    text = screen.as_text(stored[2])
    assert site.table_problems(text) == []
    assert max(map(len, text.splitlines())) <= site.MAX_TABLE_WIDTH


def test_page_numbers_hold_every_name_the_appendix_prose_glues(stored):
    """The appendix's prose reads the screen's numbers by glue name: each name it uses is one
    that :func:`screen.page_numbers` returns (a missing one fails the site build, late)."""
    import json
    import re

    chapter = json.loads((REPO_ROOT / "book/appendix_gpt2_search.ipynb").read_text())
    prose = "".join("".join(c["source"]) for c in chapter["cells"] if c["cell_type"] == "markdown")
    used = set(re.findall(r"\{glue:\w+\}`(a_scr_\w+)", prose))
    _, reference, table = stored
    numbers = screen.page_numbers(table, report.load_search("screen"), reference)
    assert used and used <= set(numbers), sorted(used - set(numbers))
    assert all(isinstance(v, (int, float)) for v in numbers.values())


def test_stored_profile_reads_the_header_and_the_profilers_numbers(tmp_path):
    from kernels.gpt2.profile import STORED_LOG, stored_profile

    launches = float(np.random.default_rng().integers(100, 2000))
    (tmp_path / STORED_LOG).write_text(
        "# python -m kernels.gpt2.profile on one GPU X (torch 9, triton 9), 2026-01-01.\n"
        "U alone: 40.6 steps/s\n"
        f'{{"wall_ms_per_step": 77.0, "launches_per_step": {launches}}}\n'
    )
    where, numbers = stored_profile(tmp_path)
    assert where == "one GPU X (torch 9, triton 9), 2026-01-01"
    assert numbers["launches_per_step"] == launches
