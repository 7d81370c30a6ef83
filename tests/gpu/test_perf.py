"""Chapter 10's measurement script and report (kernels.gpu.perf, kernels.gpu.perf_report).

* the plotting and table code on a synthetic GPU record made here (never committed);
* CPU records (``--small``) are never taken for GPU measurements;
* the roofline model, the exp2 measurement, issue 15's target ratios;
* the tables the chapter prints fit the column (88 characters, at most 12 rows);
* ``python -m kernels.gpu.perf --small`` runs end to end on the CPU and records why the GPU-only
  parts were skipped.
"""

from __future__ import annotations

import json
import math

import matplotlib
import numpy as np
import pytest
import torch

import kernels  # noqa: F401
from kernels import results, timing
from kernels.env import native_bf16
from kernels.gpu import perf, perf_report as pr, records
from kernels.tools import style

matplotlib.use("Agg")
ON_GPU = native_bf16()
PROVENANCE = dict(
    gpu="Synthetic GPU (test)",
    gpu_count=1,
    torch="x",
    triton="y",
    cuda="z",
    python="3",
    host="test",
    date="2026-01-01T00:00:00+00:00",
    command="made by tests/gpu/test_perf.py",
)


def synthetic_speed_rows():
    rows = []
    for dtype in ("bf16", "fp16"):
        for causal in (True, False):
            for i, (b, h, n, d) in enumerate(perf.SHAPES):
                for mode in ("fwd", "fwd+bwd"):
                    for j, impl in enumerate(perf.IMPLS):
                        tflops = 100.0 + 40 * i + 10 * j + (20 if mode == "fwd" else 0)
                        rows.append(
                            dict(
                                impl=impl,
                                dtype=dtype,
                                causal=causal,
                                batch=b,
                                heads=h,
                                n=n,
                                d=d,
                                mode=mode,
                                ms=1.0,
                                tflops=tflops,
                                fraction_of_peak=tflops / pr.PEAK_TFLOPS,
                            )
                        )
    rows.append(
        dict(
            rows[0],
            impl="SDPA cuDNN",
            n=512,
            ms=None,
            tflops=None,
            fraction_of_peak=None,
            error="RuntimeError: not available",
        )
    )
    return rows


def write(directory, name, data, provenance=PROVENANCE):
    (directory / f"perf_{name}.json").write_text(json.dumps(dict(provenance=provenance, data=data)))


@pytest.fixture
def synthetic(tmp_path):
    speed = dict(rows=synthetic_speed_rows(), skipped_groups=[])
    host = dict(
        ceilings=dict(matmul_tflops=780.0, copy_gb_per_s=3000.0),
        rows=[
            dict(
                impl="book, rule off",
                direct_launch=d,
                mode=m,
                shape=[8, 12, 1024, 64],
                host_us=h,
                wall_us=max(h, 250.0),
                kernel_us=k,
                kernels={"_flash_fwd_kernel": 60.0},
                cpu_ops_profiled={},
            )
            for d, h in ((False, 500.0), (True, 90.0))
            for m, k in (("fwd", 60.0), ("fwd+bwd", 260.0))
        ]
        + [
            dict(
                impl="SDPA flash",
                direct_launch=None,
                mode=m,
                shape=[8, 12, 1024, 64],
                host_us=40.0,
                wall_us=200.0,
                kernel_us=180.0,
                kernels={},
                cpu_ops_profiled={},
            )
            for m in ("fwd", "fwd+bwd")
        ],
    )
    memory = dict(
        rows=[
            dict(
                n=n,
                mode=m,
                batch=1,
                heads=16,
                d=64,
                causal=True,
                book_peak_bytes=n * 2048 * (1 if m == "fwd" else 4),
                math_peak_bytes=None if n > 8192 else n * n * 64,
            )
            for m in ("fwd", "fwd+bwd")
            for n in perf.MEMORY_NS
        ]
    )
    ablation = dict(
        steps=[s for s, _ in perf.ABLATION_STEPS],
        rows=[
            dict(
                impl="book, rule off",
                step=s,
                batch=b,
                heads=h,
                n=n,
                d=d,
                mode=m,
                dtype="bf16",
                causal=True,
                tflops=50.0 + 30 * i,
            )
            for i, (s, _) in enumerate(perf.ABLATION_STEPS)
            for b, h, n, d in perf.ABLATION_SHAPES
            for m in ("fwd", "fwd+bwd")
        ],
    )
    for name, data in (
        ("speed", speed),
        ("host", host),
        ("memory", memory),
        ("ablation", ablation),
    ):
        write(tmp_path, name, data)
    return tmp_path


def assert_legible(fig):
    assert style.legibility_problems(fig) == []


def test_figures_and_tables_from_a_synthetic_record(synthetic, capsys):
    import matplotlib.pyplot as plt

    style.apply()
    found = pr.load(synthetic)
    assert all(found[name] is not None for name in pr.RECORDS)
    rows = pr.speed_rows(found["speed"])
    assert all(r["tflops"] for r in rows), "rows without a time are left out"
    fig = pr.plot_speed(rows)
    assert_legible(fig)
    labels = fig.legends[0].get_texts()
    assert [t.get_text() for t in labels] == pr.IMPL_ORDER
    for ax in fig.axes[:2]:
        for line in ax.get_lines():
            assert list(line.get_xdata()) == [s[2] for s in perf.SHAPES]
    for figure in (
        pr.plot_ablation(found["ablation"]["data"]["rows"]),
        pr.plot_memory(found["memory"]["data"]["rows"]),
        pr.plot_host(found["host"]["data"]["rows"]),
        pr.plot_targets(pr.targets(rows)),
        pr.plot_roofline(
            [("fused", [512.0, 2048.0], None), ("measured", 512.0, 300.0, dict(color="tab:red"))]
        ),
    ):
        assert_legible(figure)
    plt.close("all")
    pr.print_speed_table(rows, 1024)
    printed = capsys.readouterr().out
    assert "SDPA cuDNN" in printed and "book, cross-tile rule" in printed
    assert max(len(line) for line in printed.splitlines()) <= 88


def test_cpu_records_are_not_gpu_measurements(tmp_path):
    results.save("perf_speed", dict(rows=synthetic_speed_rows()), "cpu", directory=tmp_path)
    if not torch.cuda.is_available():
        assert pr.load(tmp_path)["speed"] is None
    write(tmp_path, "host", {}, provenance=dict(PROVENANCE, gpu=None))
    assert pr.load(tmp_path)["host"] is None
    assert pr.load(tmp_path / "nothing here")["speed"] is None


def test_targets_are_the_issue_ratios(capsys):
    rows = synthetic_speed_rows()
    table = pr.targets(rows)
    first = next(t for t in table if t["dtype"] == "bf16" and t["causal"] and t["n"] == 1024)
    # synthetic speeds: impl j adds 10·j, fwd adds 20 (cuDNN j=1, flash j=0, off j=3, cross j=4)
    assert first["fwd_vs_cudnn"] == pytest.approx(150 / 130)
    assert first["fb_vs_flash"] == pytest.approx(130 / 100)
    assert first["fb_vs_cudnn"] == pytest.approx(130 / 110)
    assert first["rule_cost_fb"] == pytest.approx(1 - 140 / 130)
    met = pr.targets_met(table)
    assert met["fb_vs_flash"] == (20, 20) and met["rule_cost_fwd"] == (20, 20)
    pr.print_targets(table)
    assert max(len(x) for x in capsys.readouterr().out.splitlines()) <= 88


def test_roofline_model():
    assert pr.intensity(4096, 128) == pytest.approx(2048.0)  # N/2 for bf16
    assert pr.intensity(4096, 64, "math") < 64 / 2  # at most D/2
    assert pr.attainable_tflops(1e6) == pr.PEAK_TFLOPS
    assert pr.attainable_tflops(10.0) == pytest.approx(10 * pr.HBM_TB_S)
    with pytest.raises(ValueError, match="impl must be"):
        pr.intensity(1024, 64, "flash")


def test_the_peak_is_above_every_stored_measurement():
    """A peak cannot be exceeded: the datasheet's bf16 peak and HBM bandwidth lie above what the
    stored GPU records measured (a large matmul and a copy, every attention timing)."""
    found = pr.load()
    if found["host"] is None or found["speed"] is None:
        pytest.skip("no stored GPU record")
    ceilings = found["host"]["data"]["ceilings"]
    assert ceilings["matmul_tflops"] < pr.PEAK_TFLOPS
    assert ceilings["copy_gb_per_s"] / 1e3 < pr.HBM_TB_S
    assert max(r["tflops"] for r in pr.speed_rows(found["speed"])) < ceilings["matmul_tflops"]


def test_roofline_draws_a_measured_ceiling_under_the_peak():
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = pr.plot_roofline([("fused", [512.0, 2048.0], None)], measured=("matmul", 800.0))
    dashed = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert [list(line.get_ydata()) for line in dashed] == [[800.0, 800.0]]
    assert "matmul" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close("all")


def test_the_math_guard_is_the_one_the_run_applies():
    """Chapter 10 quotes the memory run's guard in bytes per score: the constant must be the
    expression in kernels.gpu.perf.memory (six fp32 N×N tensors per head)."""
    import inspect

    assert pr.MATH_GUARD_BYTES_PER_SCORE == 6 * 4
    assert "math_fits = 6 * batch * heads * n * n * 4 < 0.8 * free" in inspect.getsource(
        perf.memory
    )


def test_exp2_rewrite_changes_p_bar_a_little():
    """The kernels' exp2 rewrite (log₂e folded into the scale and the offset) changes fp32 P̄
    values and some of their bf16 roundings, by a relative 1e-5 at most; the row maximum's P̄
    stays within a few ulps of 1 (fresh scores each run)."""
    import torch

    # about 2e-5 of the bf16 values flip: half a million of them (~12 flips), fresh each run
    changed = pr.exp2_changes(rows=1024, keys=512, seed=int(torch.randint(0, 2**31, ()).item()))
    assert changed["fp32_changed"] > 0.05
    assert changed["bf16_changed"] > 0
    assert changed["max_relative_change"] < 1e-5
    s = torch.randn(32, 96) * 8
    folded, plain = pr.p_bar(s, 0.125, True), pr.p_bar(s, 0.125, False)
    assert ((folded - plain).abs() / plain).max().item() < 1e-5
    assert (folded.amax(-1) - 1).abs().max().item() <= 2**-20  # 8 ulps of 1


def test_printed_tables_fit_the_column(synthetic, capsys):
    found = pr.load(synthetic)
    rows = pr.speed_rows(found["speed"])
    memory = found["memory"]["data"]["rows"]
    pr.print_memory(memory)
    pr.print_ablation(found["ablation"]["data"]["rows"])
    pr.print_host(found["host"]["data"]["rows"])
    pr.print_shares(rows, 4096)
    pr.print_targets_met(pr.targets(rows))
    pr.print_live([dict(rows[0], impl="book, rule off"), dict(rows[-1])])
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 88
    assert "None" not in "\n".join(lines)
    assert pr.growth_exponent(memory, "book", "fwd") == pytest.approx(1.0)
    assert pr.growth_exponent(memory, "math", "fwd") == pytest.approx(2.0)
    assert pr.bytes_per_score(memory, "fwd") == pytest.approx(64 / 16)


def test_live_benchmark_needs_a_gpu():
    if not torch.cuda.is_available():
        assert pr.live_benchmark() is None


@pytest.mark.skipif(ON_GPU, reason="--small is the CPU test of the script")
def test_small_run_end_to_end(tmp_path):
    out = perf.main(["--small", "--out", str(tmp_path)])
    assert out == tmp_path
    files = {p.name for p in tmp_path.iterdir()}
    assert {"perf_host.json", "perf_speed.json", "perf_memory.json", "perf_ablation.json"} <= files
    assert {"perf_tuning.json", "perf_log.txt"} <= files
    # the interpreter runs one fixed tile shape: nothing was tuned, so nothing to store
    assert results.load("perf_tuning", directory=tmp_path)["data"]["entries"] == []
    log = (tmp_path / "perf_log.txt").read_text().splitlines()
    assert "CPU, Triton interpreter" in log[0] and "done in" in log[-1]
    host = results.load("perf_host", directory=tmp_path)
    assert host["provenance"]["gpu"] is None and host["data"]["small"]
    assert host["data"]["all_checks_pass"]
    assert "no CUDA GPU" in host["data"]["compile"]["skipped"]
    speed = results.load("perf_speed", directory=tmp_path)["data"]["rows"]
    sdpa = [r for r in speed if r["impl"].startswith("SDPA")]
    assert sdpa and all("SDPA's CUDA backends cannot run" in r["error"] for r in sdpa)
    book = [r for r in speed if r["impl"].startswith("book")]
    assert len(book) == 2 * 2 * 2 * 2 * len(perf.SMALL_SHAPES) and all(r["ms"] for r in book)
    memory = results.load("perf_memory", directory=tmp_path)["data"]
    assert memory["rows"] == [] and "allocator" in memory["skipped"]
    ablation = results.load("perf_ablation", directory=tmp_path)["data"]
    assert [r["step"] for r in ablation["rows"][::2]] == ablation["steps"]
    assert all(v is None for v in pr.load(tmp_path).values()), "CPU files are not GPU data"
    assert math.isfinite(host["data"]["elapsed_s"])


def test_the_gpu_check_times_with_perfs_functions_and_rows(monkeypatch):
    """``python -m kernels.gpu.check`` keeps no speed table of its own: its speed section is
    :func:`kernels.gpu.perf.speed` (bf16, causal) and its rows have perf_speed.json's fields."""
    from kernels.gpu import check

    shape = perf.SMALL_SHAPES[0]
    monkeypatch.setattr(check, "SPEED_SHAPES", [shape])
    got = check.speed(timing.Budget(600))
    rows, skipped = [], []
    for _ in perf.speed(True, timing.Budget(600), rows, skipped, shapes=[shape]):
        pass
    assert got["skipped_groups"] == []
    assert {(r["impl"], r["mode"]) for r in got["rows"]} == {
        (name, mode) for name in perf.IMPLS for mode in ("fwd", "fwd+bwd")
    }
    assert all(r["dtype"] == "bf16" and r["causal"] for r in got["rows"])
    assert [sorted(r) for r in got["rows"]] == [
        sorted(r) for r in rows if r["dtype"] == "bf16" and r["causal"]
    ]
    if not torch.cuda.is_available():
        assert check.memory(timing.Budget(600))["rows"] == []  # needs CUDA's allocator


def test_roofline_series_places_each_forward_speed_at_its_intensity():
    import numpy as np

    from kernels.gpu import perf_report as pr

    rng = np.random.default_rng()
    impls = tuple(pr.STYLE)[:2]
    lengths = [512, 1024, 2048, 4096]
    rows = [{"impl": impl, "n": int(n), "tflops": float(rng.uniform(50, 500))}
            for impl in impls for n in rng.choice(lengths, 3, replace=False)]  # fmt: skip
    series = pr.roofline_series(rows, impls)
    assert [s[0] for s in series[:-1]] == list(impls)
    for impl, xs, ys, _ in series[:-1]:
        mine = sorted((r["n"], r["tflops"]) for r in rows if r["impl"] == impl)
        assert xs == [pr.intensity(n, 64) for n, _ in mine] and ys == [t for _, t in mine]
    math_points = [pr.intensity(4096, d, "math") for d in (64, 128)]
    assert series[-1][2] is None and series[-1][1] == math_points


def test_the_floor_of_an_eager_call_from_fresh_numbers():
    """host_floor_numbers: the floor is the autograd-only rows' range, each implementation's
    excess is its median over the allocating floor's median; a record in which an
    implementation is issued faster than the floor no longer says what chapter 10 says."""
    rng = np.random.default_rng()
    floor = rng.uniform(50, 120, size=(2, 3))
    book, flash = rng.uniform(150, 400, size=3), rng.uniform(150, 400, size=3)
    host_us = {
        "autograd alone, nothing allocated": list(floor[0]),
        "autograd alone, outputs allocated": list(floor[1]),
        "book": list(book),
        "flash": list(flash),
    }
    numbers = pr.host_floor_numbers(host_us, "book", "flash")
    assert numbers["c10_floor_lo"] == floor.min() and numbers["c10_floor_hi"] == floor.max()
    assert math.isclose(numbers["c10_floor_book_over"], np.median(book) - np.median(floor[1]))
    assert math.isclose(numbers["c10_floor_flash_over"], np.median(flash) - np.median(floor[1]))
    host_us["flash"][rng.integers(3)] = floor.max() - 1.0  # one round under the floor
    with pytest.raises(ValueError, match="costs more than the floor"):
        pr.host_floor_numbers(host_us, "book", "flash")


def test_the_stored_floor_is_a_gpu_record_with_every_row():
    record = pr.host_floor_record()
    host_us = record["data"]["host_us"]
    assert record["provenance"]["gpu"] and record["data"]["shape"] == [8, 12, 1024, 64]
    assert set(records.FLOOR_ROWS) < set(host_us)
    assert all(len(us) == 3 and min(us) > 0 for us in host_us.values())
