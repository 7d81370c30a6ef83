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
