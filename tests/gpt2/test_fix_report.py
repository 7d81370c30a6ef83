"""Chapter 7's comparison of the fixes in training, read from the stored GPU runs."""

import copy

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kernels.gpt2 import figures, report  # noqa: E402


def _stored_fix_runs():
    runs = {}
    for plan in ("amp_seeds", "amp_fixes", "amp_fixes_p"):
        runs.update(report.load_search(plan)["data"]["runs"])
    return report.fix_runs(runs)


def test_fix_runs_hold_three_seeds_of_each_route_and_the_controls():
    runs = _stored_fix_runs()
    variants = {report.parse_name(n)[1] for n in runs}
    assert variants == set(report.FIX_ORDER)
    for variant in "USDPF":
        seeds = {report.parse_name(n)[2] for n in runs if report.parse_name(n)[1] == variant}
        assert seeds == {"s1", "s2", "s3"}, variant


def test_ratio_to_control_at_is_one_against_itself_and_follows_a_scaled_run():
    runs = _stored_fix_runs()
    control = runs["k4-F-s2"]
    assert report.ratio_to_control_at(control, control, 5_000) == 1.0
    scaled = copy.deepcopy(control)
    factor = 1.0 + np.random.default_rng().uniform(0.5, 3.0)
    for check in scaled["monitor"]:
        check["wq_norms"] = [[w * factor for w in layer] for layer in check["wq_norms"]]
    assert abs(report.ratio_to_control_at(scaled, control, 5_000) - factor) < 1e-9


def test_fix_table_counts_every_run_once_and_matches_outcome():
    runs = _stored_fix_runs()
    table = report.fix_table(runs)
    assert table.runs.sum() == len(runs)
    for row in table.itertuples():
        names = [n for n in runs if report.parse_name(n)[1] == row.variant]
        failed = sum(report.outcome(runs[n])["step"] is not None for n in names)
        assert row.failed == failed
    fig, ax = plt.subplots()
    figures.plot_fix_growth(ax, runs)
    assert len(ax.lines) >= len(runs) - 3  # one line per run, the control as a rule
    plt.close(fig)


def test_run_label_names_a_longer_schedule_only_when_asked():
    steps = int(np.random.choice([6_000, 60_000, 80_000]))
    from kernels.gpt2 import variant_options

    attn = variant_options("U")["attn"]  # real BF16: Ō with 7 bits
    run = {"config": {"steps": steps, "decay_steps": None, "attn": attn}}
    plain = report.run_label("bf16-U-s1", run)
    assert plain == "BF16, seed 1"
    named = report.run_label("bf16-U-s1", run, schedule=True)
    assert named == f"BF16, seed 1, {steps // 1000}k-step schedule"
    run["config"].update(steps=20_000)
    assert report.run_label("bf16-U-s1", run, schedule=True) == plain
    run["config"].update(steps=80_000, decay_steps=60_000)  # cosine over 60k, then flat
    assert report.run_label("bf16-U-s1", run, schedule=True).endswith(", 60k-step schedule")


def _stored_run(steps_done: int) -> dict:
    return {"summary": {"steps_done": steps_done}}


def test_real_bf16_runs_reads_every_long_file_and_keeps_the_longer_copy(tmp_path):
    from kernels import results

    rng = np.random.default_rng()
    short, long = int(rng.integers(1_000, 40_000)), int(rng.integers(40_000, 90_000))
    results.save("gpt2_bf16_real_long", {"runs": {"bf16-U-s0": _stored_run(short)}}, "t", tmp_path)
    results.save(
        "gpt2_bf16_real_long_more",
        {"runs": {"bf16-U-s0": _stored_run(long), "bf16-P-s1": _stored_run(short)}},
        "t",
        tmp_path,
    )
    results.save("gpt2_bf16_real", {"runs": {"bf16-F-s0": _stored_run(long)}}, "t", tmp_path)
    found = report.real_bf16_runs(tmp_path)
    assert set(found) == {("U", "s0"), ("P", "s1")}  # not the short-run file's
    assert found["U", "s0"]["summary"]["steps_done"] == long


def test_the_real_bf16_figure_draws_each_stored_run_once_per_panel_and_names_the_missing():
    runs = report.real_bf16_runs()
    fig = plt.figure()
    axes, (handles, labels) = figures.plot_real_bf16_seeds(fig, runs, variants="UFPZ")
    for row, seed in zip(axes, ("s0", "s1")):
        stored = [v for v in "UFPZ" if (v, seed) in runs]
        drawn = [line for line in row[1].lines if line.get_label()[:1] != "_"]
        assert len(drawn) == len(stored), seed
        note = " ".join(" ".join(t.get_text().split()) for t in row[1].texts)
        for v in "UFPZ":
            assert (report.VARIANT_NAMES[v] in note) == ((v, seed) not in runs), (v, seed)
    assert len(labels) == len(set(labels)) == len({v for v, _ in runs})
    plt.close(fig)


def test_control_rows_scale_with_the_run_and_blank_after_an_explosion():
    runs = report.load_search("amp_seeds")["data"]["runs"]
    controls = report.control_runs()
    assert {"k4c-B-s1", "k4c-X-s1", "k4c-B-s2"} <= set(controls)  # both sittings are read
    rows = report.control_rows(runs, controls, seeds=("s1", "s2"))
    assert [r["variant"] for r in rows if r["seed"] == "s1"] == list("MXBNG")
    mean_error = next(r for r in rows if r["variant"] == "M")
    assert mean_error["exploded"] < 7_000 and np.isnan(mean_error["ratio"][1])
    # a control whose ‖W_Q‖ is scaled by a fresh factor reads that factor at every step
    factor = 1.0 + np.random.default_rng().uniform(0.5, 3.0)
    scaled = copy.deepcopy(runs["k4-F-s2"])
    for check in scaled["monitor"]:
        check["wq_norms"] = [[w * factor for w in layer] for layer in check["wq_norms"]]
    (row,) = report.control_rows(runs, {"k4c-N-s2": scaled}, seeds=("s2",))
    assert row["exploded"] is None and np.allclose(row["ratio"], factor, rtol=1e-9)
    fig = plt.figure()
    axes, (handles, labels) = figures.plot_controls(fig, runs, controls, seeds=("s1", "s2"))
    assert len(axes) == 2 and len(labels) == len(set(labels)) == 7  # 5 controls, U, F
    plt.close(fig)
