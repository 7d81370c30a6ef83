"""The CPU side of chapter 9's GPU script (kernels.gpt2.monitor_gpu): --small runs both stages
at tiny sizes and writes a file the chapter can read; the curve comparison that decides
"within noise" is checked on constructed curves."""

import re

import numpy as np
import pytest
import torch

import kernels  # noqa: F401
from kernels import results
from kernels.gpt2 import monitor_gpu as gpu


def test_curve_gap_on_constructed_curves():
    n, width = int(np.random.randint(20, 60)), int(np.random.randint(1, 5))
    a = np.random.rand(n)
    shift = float(np.random.uniform(0.01, 1))
    assert gpu.curve_gap(a, a, width) == 0.0
    assert gpu.curve_gap(a, a + shift, width) == pytest.approx(shift)
    late = np.r_[np.zeros(n // 2), np.full(n - n // 2, shift)]  # apart in the 2nd half
    assert gpu.curve_gap(np.zeros(n), late, width) == pytest.approx(shift)
    with pytest.raises(ValueError, match="two loss curves of one length"):
        gpu.curve_gap(a, a[:-1], width)


def test_within_noise_compares_each_seed_with_the_seed_to_seed_gap():
    base = np.linspace(5, 2, 40)
    noise = float(np.random.uniform(0.05, 0.2))
    curves = {
        ("sdpa", 0): base,
        ("sdpa", 1): base + noise,
        ("fix", 0): base + noise / 2,
        ("fix", 1): base + noise * 1.5,
    }
    got = gpu.within_noise(curves, 4, (0, 1))
    assert got["noise_between_seeds"] == pytest.approx(noise)
    assert got["gap_to_sdpa"]["0"] == pytest.approx(noise / 2)
    assert got["within_noise"] is True
    curves[("fix", 1)] = base + noise * 3
    assert gpu.within_noise(curves, 4, (0, 1))["within_noise"] is False


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One ``--small`` run of the script (both stages at tiny sizes): (its folder, what main
    returned), shared by the tests below."""
    folder = tmp_path_factory.mktemp("monitor_gpu")
    return folder, gpu.main(["--small", "--out", str(folder)])


def test_small_run_end_to_end(small_run):
    tmp_path, out = small_run
    assert out == tmp_path
    record = results.load("monitor_gpu", directory=tmp_path)
    assert (
        record["provenance"]["command"] == "python -m kernels.gpt2.monitor_gpu --small "
        f"--out {tmp_path}"
    )
    if not torch.cuda.is_available():
        assert record["provenance"]["gpu"] is None
    data, sizes = record["data"], gpu.SMALL
    assert data["small"] is True
    rows = {row["setting"]: row for row in data["overhead"]["rows"]}
    assert set(rows) == {"off"} | {
        f"every {e}{d}" for e in sizes["every"] for d in ("", ", no delta")
    }
    steps = [r * sizes["block"] + i for r in range(sizes["rounds"]) for i in range(sizes["block"])]
    for name, row in rows.items():
        assert row["steps"] == len(steps) and row["mean_ms"] > 0
        want = 0 if name == "off" else sum(s % row["every"] == 0 for s in steps)
        assert row["steps_read"] == want, name
        assert row["overhead_min"] <= row["overhead_median"] <= row["overhead_max"]
    assert rows["off"]["overhead_median"] == 0.0
    hf = data["hf"]
    assert set(hf["losses"]) == {f"{i}, seed {s}" for i in ("sdpa", "fix") for s in sizes["seeds"]}
    assert all(len(v) == sizes["hf_steps"] for v in hf["losses"].values())
    assert hf["finite"] is True and isinstance(hf["within_noise"], bool)
    # the same init and batches: the fix starts where SDPA starts (fp32 on the CPU)
    for s in sizes["seeds"]:
        assert hf["losses"][f"fix, seed {s}"][0] == pytest.approx(
            hf["losses"][f"sdpa, seed {s}"][0], rel=1e-5
        )


def test_the_chapter_figures_draw_a_record_and_a_cpu_run_is_not_one(small_run):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tmp_path, _ = small_run
    assert gpu.stored(tmp_path) is None  # a --small run on the CPU is no measurement
    assert gpu.stored(tmp_path / "absent") is None
    data = results.load("monitor_gpu", directory=tmp_path)["data"]
    fig, (a, b) = plt.subplots(1, 2)
    gpu.plot_overhead(a, data)
    gpu.plot_hf_losses(b, data)
    n_every = len(gpu.SMALL["every"])
    assert len(a.containers) == 2 and all(
        len(c.lines[0].get_xdata()) == n_every for c in a.containers
    )
    assert len(b.lines) == len(data["hf"]["losses"])
    for line, values in zip(b.lines, data["hf"]["losses"].values()):
        assert line.get_xdata()[-1] == len(values) - 1
    plt.close(fig)
    lines = gpu.overhead_lines(data)
    assert lines[0].startswith("without the monitor: mean") and len(lines) == 2 + 2 * n_every
    # every column says its statistic (means of ms, medians of the paired overhead), and the
    # header sits over its column: each header field ends where its cells end
    assert "mean" in lines[1] and lines[1].count("median") == 2
    ends = [m.end() for m in re.finditer(r"\S+(?: \S+)*", lines[1])]
    for line in lines[2:]:
        assert [m.end() for m in re.finditer(r"\S+(?: \S+)*", line)][-3:] == ends[-3:]
