"""The bias chapters' measurement scripts: the GPU script end to end in its CPU mode (the
website's explorers are tested in test_site_explorers.py)."""

import json

from kernels.rounding_lab import fixes_gpu


def test_fixes_gpu_small_runs_end_to_end_on_the_cpu(tmp_path):
    fixes_gpu.main(["--small", "--out", str(tmp_path)])
    rec = json.loads((tmp_path / "bias_sources_gpu.json").read_text())
    assert rec["provenance"]["command"] == "python -m kernels.rounding_lab.fixes_gpu --small"
    rows = rec["data"]["records"]
    impls = {r["impl"] for r in rows}
    assert {"ideal", "emulator/fa2", "triton/none", "triton/delta_dp"} <= impls
    for r in rows:
        if r["impl"] == "ideal":
            assert r["out"]["same_as_ideal"] == 1.0 and abs(r["out"]["worst"]) <= 0.5
        if r["impl"] in ("triton/delta_dp", "triton/delta_fp32", "triton/delta_hilo"):
            assert abs(r["delta"]["bias"]) < 0.02, r
    assert (tmp_path / "lab_sweep_gpu.json").exists()
