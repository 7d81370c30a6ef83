"""The figures of chapters 3 and 4 (kernels.attention.figures) draw from the stored records and
from small live numbers, legibly and within the site's text column."""

from __future__ import annotations

import matplotlib
import numpy as np

import kernels  # noqa: F401
from kernels import results
from kernels.attention import figures, registry, tiling
from kernels.tools import style

matplotlib.use("Agg")


def assert_legible(fig):
    import matplotlib.pyplot as plt

    assert style.legibility_problems(fig) == []
    plt.close(fig)


def test_figures_from_stored_records():
    style.apply()
    assert_legible(figures.plot_stored_memory(results.load("perf_memory")["data"]["rows"]))
    bench = figures.chapter3_speed_rows(results.load("perf_speed")["data"]["rows"])
    assert {r["impl"] for r in bench} == {registry.label(n) for n in figures.CHAPTER3_IMPLS}
    assert all(r["dtype"] == "bf16" and r["causal"] and r["tflops"] > 0 for r in bench)
    assert_legible(figures.plot_stored_speed(bench))
    check = results.load("gpu_check")["data"]["explicit_vs_native"]
    assert_legible(figures.plot_stored_backward([r for r in check if r["pass_"] == "bwd"]))


def test_figures_from_live_numbers():
    import torch

    style.apply()
    q, k, v = (torch.randn(1, 1, 128, 16, dtype=torch.float64) for _ in range(3))
    _, _, trace = tiling.online_attention(q, k, v, block_m=64, block_n=32, trace_row=5)
    assert_legible(figures.plot_online_stats(trace, row=5))
    series = {"kernel": [1e-3, 2e-3], "naive": [3e-3, 1e-2]}
    assert_legible(figures.plot_error_bars(["a", "b"], series, "relative error", "title"))
    memory = {"naive": {128: 1e5, 256: 4e5}, "flash": {128: 2e3, 256: 4e3}}
    assert_legible(figures.plot_measured_memory(memory, [128, 256], 4, "measured"))
    assert_legible(figures.plot_delta_gap(np.linspace(-1e-3, 1e-3, 64)))
    errors = dict(zip(("fa2", "paper"), np.random.default_rng().uniform(1e-3, 2e-2, 2)))
    fig = figures.plot_mode_errors(errors)
    assert [p.get_height() for p in fig.axes[0].patches] == list(errors.values())
    assert_legible(fig)


def test_chapter3_record_reports_print_narrow_tables_and_return_the_glued_numbers(
    capsys, monkeypatch
):
    import matplotlib.pyplot as plt

    style.apply()
    monkeypatch.setattr(plt, "show", lambda *a, **k: None)  # Agg; the figures are closed below
    numbers = {}
    for show in (
        figures.show_gpu_check_forward,
        figures.show_stored_memory,
        figures.show_stored_speed,
    ):
        numbers |= show()
        plt.close("all")
    out = capsys.readouterr().out
    assert out and max(len(line) for line in out.splitlines()) <= 88
    prefixes = ("c3_gpu_", "c3_mem_", "c3_speed_")
    assert all(name.startswith(prefixes) for name in numbers)
    assert len(numbers) == 20
    assert 0 < numbers["c3_mem_flash"] < numbers["c3_mem_naive"]
    assert 0 < numbers["c3_gpu_same_min"] <= 1
