"""The bias chapters' measurement scripts: the GPU script end to end in its CPU mode, and the
website's slider grid (its figure moves between computed states)."""

import json

from kernels.lab import fixes_gpu, slider_grid


def test_fixes_gpu_small_runs_end_to_end_on_the_cpu(tmp_path):
    fixes_gpu.main(["--small", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "bias_sources_gpu.json").read_text())
    assert rec["provenance"]["command"] == "python -m kernels.lab.fixes_gpu --small"
    rows = rec["data"]["records"]
    impls = {r["impl"] for r in rows}
    assert {"ideal", "emulator/fa2", "triton/none", "triton/delta_dp"} <= impls
    for r in rows:
        if r["impl"] == "ideal":
            assert r["out"]["same_as_ideal"] == 1.0 and abs(r["out"]["worst"]) <= 0.5
        if r["impl"] in ("triton/delta_dp", "triton/delta_fp32", "triton/delta_hilo"):
            assert abs(r["delta"]["bias"]) < 0.02, r
    assert (tmp_path / "lab_sweep_gpu.json").exists()


def test_slider_grid_marks_the_extremes_and_the_figure_switches_states():
    grid = slider_grid.beta_grid(
        betas=(1.0005, 2.0, 64.0), n_keys=128, batch=2, v_settings={"tied −1, other 0": (-1.0, 0.0)}
    )
    by = {r["beta"]: r for r in grid}
    assert by[None]["bias"] > 0.05  # the rule off: the storage bias
    assert by[1.0005]["bias"] < 0  # β too close to 1 flips its sign
    assert abs(by[2.0]["bias"]) < abs(by[None]["bias"])
    assert by[64.0]["nonfinite"] > 0  # ℓ underflows, reported not raised
    fig = slider_grid.beta_slider_figure(grid)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["1.0005", "2", "64"]
    shown = [s.args[0]["visible"] for s in steps]
    assert len({tuple(v) for v in shown}) == 3 and all(v[0] for v in shown)
