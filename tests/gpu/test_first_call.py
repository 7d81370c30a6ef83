"""The first-call measurement of ``kernels.gpu.check`` and ``kernels.gpu.call_cost``
(kernels.gpu.first_call, issue 28), on the CPU at tiny lengths (in the Triton interpreter
nothing is autotuned, so only the logic runs): the report's fields, a fresh Triton cache folder
inside the measurement and the old one after, the switch restored, and lengths outside the
warm-up's bucket refused; then chapter 10's bars and figure from a stored record."""

from __future__ import annotations

import pytest
from triton import knobs

import kernels  # noqa: F401
from kernels.attention import current_speedups, speedups
from kernels.attention.launcher import not_specialised
from kernels.env import native_bf16
from kernels.gpu import first_call

pytestmark = pytest.mark.skipif(native_bf16(), reason="kernels.gpu.check runs it on a GPU")


def test_first_calls_reports_each_new_length_with_the_switch_on_and_off(monkeypatch):
    folders = []
    timed = first_call.first_call_seconds

    def seconds(n, shape, device, dtype="bf16", causal=True):
        keys = ("tune_by_bucket", "nearest_bucket", "parallel_compile")
        now = current_speedups()
        switches = tuple(getattr(now, k) for k in keys)
        folders.append((n, knobs.cache.dir, switches, now.stored_tuning))
        return timed(n, shape, device, dtype, causal)

    monkeypatch.setattr(first_call, "first_call_seconds", seconds)
    before, nearest = knobs.cache.dir, current_speedups().nearest_bucket
    kept = current_speedups().stored_tuning
    stored = (("fp16", True, 40, 16), ("bf16", False, 50, 32))
    report = first_call.first_calls(
        20,
        {"on": (21, 30), "off": (22,)},
        (1, 1, 16),
        "cpu",
        log=lambda *a: None,
        nearest=(200,),
        stored=stored,
    )
    assert report["bucket"] == 128 and report["warm_up"]["n"] == 20
    assert [r["n"] for r in report["on"]] == [21, 30] and [r["n"] for r in report["off"]] == [22]
    assert report["nearest"] == [dict(n=200, bucket=256, seconds=report["nearest"][0]["seconds"])]
    # the CPU has no stored picks (they serve the GPU model they were measured on)
    assert [
        (r["dtype"], r["causal"], r["n"], r["d"], r["stored"], r["parallel"])
        for r in report["stored"]
    ] == [(*case, False, parallel) for parallel in (True, False) for case in stored]
    assert report["warm_up_serial"]["n"] == 20
    timed_calls = (
        report["warm_up"],
        report["warm_up_serial"],
        *report["on"],
        *report["off"],
        *report["nearest"],
    )
    assert all(r["seconds"] > 0 for r in (*timed_calls, *report["stored"]))
    # the stored picks only where measured: the tuning measurements must tune
    assert [(n, switch, kept) for n, _, switch, kept in folders] == [
        (20, (True, False, True), False),
        (20, (True, False, False), False),
        (21, (True, False, True), False),
        (30, (True, False, True), False),
        (22, (False, False, True), False),
        (200, (True, True, True), False),
        (40, (True, True, True), True),
        (50, (True, True, True), True),
        (40, (True, True, False), True),
        (50, (True, True, False), True),
    ]
    # one fresh cache folder for the measurement, and a fresh one for each "new process"
    fresh = [folder for _, folder, _, _ in folders]
    assert fresh[0] != before and fresh[1] not in (before, fresh[0])
    assert set(fresh[2:6]) == {fresh[0]} and fresh[6] == fresh[7] != fresh[8] == fresh[9]
    assert fresh[6] not in (before, fresh[0], fresh[1])
    now = current_speedups()
    assert knobs.cache.dir == before and now.tune_by_bucket is True
    assert now.nearest_bucket is nearest and now.stored_tuning is kept


def test_first_calls_refuses_lengths_of_another_bucket():
    with pytest.raises(ValueError, match="bucket 1024"):
        first_call.first_calls(1000, {"on": (1030,), "off": ()}, device="cpu")
    with pytest.raises(ValueError, match="outside bucket 1024"):
        first_call.first_calls(1000, {"on": (1010,), "off": ()}, device="cpu", nearest=(1020,))


def _legible(fig):
    from kernels.tools import style

    assert style.legibility_problems(fig) == []


def _stored_first_call(rng):
    """A first-call section as ``first_calls`` writes it, with fresh random seconds."""
    draw = lambda: float(rng.uniform(1e-4, 40.0))  # noqa: E731
    return dict(
        warm_up=dict(n=1000, seconds=draw()),
        on=[dict(n=n, seconds=draw()) for n in (1004, 1010)],
        off=[dict(n=1006, seconds=draw())],
        nearest=[
            dict(n=2001, bucket=2048, seconds=draw()),
            dict(n=2000, bucket=2048, seconds=draw()),
            dict(n=4000, bucket=4096, seconds=draw()),
        ],
        stored=[
            dict(dtype="fp16", causal=True, n=3000, d=64, seconds=draw(), stored=True),
            dict(dtype="bf16", causal=False, n=1500, d=64, seconds=draw(), stored=False),
            dict(
                dtype="fp16", causal=True, n=3000, d=64, seconds=draw(), stored=True, parallel=False
            ),
        ],
        warm_up_serial=dict(n=1000, seconds=draw()),
    )


def test_first_call_times_keep_the_order_and_name_each_case():
    import numpy as np

    from kernels.gpu import records

    first = _stored_first_call(np.random.default_rng())
    bars = records.first_call_times(first)
    timed = [
        first["warm_up"],
        first["warm_up_serial"],
        *first["on"],
        *first["off"],
        *first["nearest"],
        *first["stored"],
    ]
    assert [s for _, s in bars] == [r["seconds"] for r in timed]
    assert bars.pop(1)[0] == "N=1,000: tunes, one compile at a time"
    labels = [label for label, _ in bars]
    assert labels[0].startswith("N=1,000") and "tunes" in labels[0]
    assert "retuned" in labels[3] and "retuned" not in labels[1]
    assert labels[4] == "N=2,001: new bucket, borrows"  # 2,001 is no multiple of 16
    assert labels[5] == "N=2,000: same new bucket, a multiple of 16"
    assert labels[6] == "N=4,000: new bucket, borrows, a multiple of 16"
    assert labels[7] == "N=3,000 fp16 D=64: stored pick"
    assert labels[8] == "N=1,500 bf16 full D=64: tunes, none stored"
    assert labels[9] == "N=3,000 fp16 D=64: stored pick, one at a time"
    del first["stored"], first["warm_up_serial"]  # records made before these existed
    assert len(records.first_call_times(first)) == 7


def test_first_call_figure_marks_calls_over_the_target():
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from kernels.gpu import perf_figures, records

    first = _stored_first_call(np.random.default_rng())
    first["on"][0]["seconds"] = 0.0  # a call that compiled nothing: drawn at the axis floor
    fig = perf_figures.plot_first_call(first, target_s=3.0)
    ax = fig.axes[0]
    dots = ax.collections[-1]  # the scatter, drawn after the guide lines
    seconds = [s for _, s in records.first_call_times(first)]
    assert [x for x, _ in dots.get_offsets()] == [max(s, 1e-4) for s in seconds]
    red = matplotlib.colors.to_rgba("tab:red")
    over = [tuple(c) == red for c in dots.get_facecolors()]
    assert over == [s > 3.0 for s in seconds]
    _legible(fig)
    seconds = [s for _, s in records.first_call_times(first)]
    assert over == [s > 3.0 for s in seconds]


def test_call_cost_needs_a_gpu_and_its_record_must_be_one(tmp_path):
    from kernels import results
    from kernels.gpu import call_cost, records

    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        call_cost.main(["--out", str(tmp_path)])
    results.save("call_cost", dict(host=[]), "a CPU test", directory=tmp_path)
    with pytest.raises(ValueError, match="no GPU measurement"):
        records.call_cost_record(tmp_path)


def test_call_host_figure_draws_host_and_gpu_bars_per_row():
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from kernels.gpu import perf_figures

    rng = np.random.default_rng()
    rows = [
        dict(
            impl=impl,
            issued=how,
            host_us=float(rng.uniform(1, 600)),
            kernel_us=float(rng.uniform(50, 400)),
        )
        for impl in ("book, rule off", "SDPA flash")
        for how in ("eager", "CUDA graph")
    ]
    fig = perf_figures.plot_call_host(rows)
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [r["host_us"] for r in rows] + [r["kernel_us"] for r in rows]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{r['impl']}, {r['issued']}" for r in rows]
    assert ax.get_xlim()[1] > max(max(widths), 1.0)
    _legible(fig)


def _tma_rows(rng):
    """``call_cost.json["tma"]`` rows as ``tma_rows`` writes them, with fresh random speeds."""
    rows = []
    for n, d in ((1024, 64), (8192, 128)):
        cases = [(loads, "fwd") for loads in ("pointers", "TMA at D = 128", "TMA at every D")]
        cases += [("TMA at D = 128", "fwd+bwd"), (None, "fwd"), (None, "fwd+bwd")]
        for loads, mode in cases:
            impl = "SDPA cuDNN" if loads is None else "book, rule off"
            tflops = float(rng.uniform(50, 600))
            rows.append(dict(impl=impl, n=n, d=d, mode=mode, loads=loads, tflops=tflops))
    return rows


def test_tma_ratios_sort_timings_by_how_the_tiles_were_read():
    import numpy as np

    from kernels.gpu import records

    rows = _tma_rows(np.random.default_rng())
    speed = {(r["n"], r["loads"], r["mode"]): r["tflops"] for r in rows}
    narrow, wide = records.tma_ratios(rows)
    cudnn = speed[1024, None, "fwd"]
    # d = 64: the default reads through pointers, as the "pointers" row does
    assert narrow["pointers"] == [
        speed[1024, k, "fwd"] / cudnn for k in ("pointers", "TMA at D = 128")
    ]
    assert narrow["descriptors"] == [speed[1024, "TMA at every D", "fwd"] / cudnn]
    cudnn = speed[8192, None, "fwd"]
    assert wide["pointers"] == [speed[8192, "pointers", "fwd"] / cudnn]
    assert wide["descriptors"] == [
        speed[8192, k, "fwd"] / cudnn for k in ("TMA at D = 128", "TMA at every D")
    ]
    assert wide["fb"] == speed[8192, "TMA at D = 128", "fwd+bwd"] / speed[8192, None, "fwd+bwd"]


def test_tma_figure_draws_every_timing():
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from kernels.gpu import perf_figures, records

    rows = _tma_rows(np.random.default_rng())
    fig = perf_figures.plot_tma(rows)
    ax = fig.axes[0]
    table = records.tma_ratios(rows)
    drawn = sorted(float(y) for dots in ax.collections for _, y in dots.get_offsets())
    assert drawn == sorted(v for t in table for v in t["pointers"] + t["descriptors"])
    _legible(fig)


def test_length_specialisation_switch():
    """Triton may specialise on the lengths by default; with the switch off every kernel lists
    them as not specialised (the head count never is)."""
    assert not_specialised("N_Q", "N_K") == (
        ["H"] if current_speedups().specialise_lengths else ["H", "N_Q", "N_K"]
    )
    with speedups(specialise_lengths=False):
        assert not_specialised("N_Q") == ["H", "N_Q"]


def test_tma_summary_and_repeat_spread(capsys):
    import numpy as np

    from kernels.gpu import perf_report, records

    rows = _tma_rows(np.random.default_rng())
    table = records.tma_ratios(rows)
    summary = records.tma_summary(rows)
    for t, s in zip(table, summary):
        mean = lambda v: sum(v) / len(v)  # noqa: E731
        assert s["change"] == mean(t["descriptors"]) / mean(t["pointers"]) - 1
        assert s["default"] == mean(t["descriptors"] if t["d"] >= 128 else t["pointers"])
    pairs = [v for t in table for v in (t["pointers"], t["descriptors"]) if len(v) == 2]
    assert records.repeat_spread(rows) == max(max(v) / min(v) - 1 for v in pairs)
    perf_report.print_tma(summary)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 + len(summary) and max(map(len, printed)) <= 88
    assert "perf_speed.json" not in "\n".join(printed)


def _matrix_rows(rng):
    """perf_speed.json rows at the shapes of :func:`_tma_rows`: the book (rule off) and cuDNN,
    bf16 causal, and decoys in other settings that must not be read."""
    rows = []
    for n, d in ((1024, 64), (8192, 128)):
        for impl in ("book, rule off", "SDPA cuDNN", "SDPA flash"):
            for dtype, causal in (("bf16", True), ("fp16", True), ("bf16", False)):
                for mode in ("fwd", "fwd+bwd"):
                    tflops = float(rng.uniform(50, 600))
                    rows.append(
                        dict(impl=impl, dtype=dtype, causal=causal, n=n, d=d, mode=mode)
                        | dict(tflops=tflops)
                    )
    return rows


def test_tma_rows_beside_the_speed_matrix(capsys):
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np

    from kernels.gpu import perf_figures, perf_report, records

    rng = np.random.default_rng()
    rows, matrix = _tma_rows(rng), _matrix_rows(rng)
    compared = records.tma_against_speed(rows, matrix)
    summary = records.tma_summary(rows)

    def speed(impl, n, mode):
        return next(
            r["tflops"]
            for r in matrix
            if (r["impl"], r["n"], r["mode"], r["dtype"], r["causal"])
            == (impl, n, mode, "bf16", True)
        )

    cudnn = {(r["n"], r["mode"]): r["tflops"] for r in rows if r["loads"] is None}
    assert [(c["n"], c["d"]) for c in compared] == [(1024, 64), (8192, 128)]
    for c, s in zip(compared, summary):
        assert (c["fwd"], c["fb"]) == (s["default"], s["fb"])
        for mode, key in (("fwd", "speed_fwd"), ("fwd+bwd", "speed_fb")):
            want = speed("book, rule off", c["n"], mode) / speed("SDPA cuDNN", c["n"], mode)
            assert c[key] == pytest.approx(want)
        assert c["cudnn_fb"] == cudnn[c["n"], "fwd+bwd"]
        assert c["speed_cudnn_fb"] == speed("SDPA cuDNN", c["n"], "fwd+bwd")
    perf_report.print_tma(summary, compared)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 + len(summary) and max(map(len, printed)) <= 88
    assert "run B: section 5's speed matrix" in printed[1]
    assert printed[-1].split()[-2:] == [f"{compared[-1][k]:.2f}" for k in ("speed_fwd", "speed_fb")]
    fig = perf_figures.plot_tma(rows, compared=compared)
    crosses = [line for line in fig.axes[0].get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1
    assert list(crosses[0].get_ydata()) == [c["speed_fwd"] for c in compared]
    _legible(fig)


def test_runs_numbers_say_where_the_two_runs_part():
    from kernels.gpu import records

    def row(n, fwd, fb, speed_fwd, speed_fb, cudnn_fb=80.0, speed_cudnn_fb=200.0):
        return dict(n=n, d=64, fwd=fwd, fb=fb, speed_fwd=speed_fwd, speed_fb=speed_fb) | dict(
            cudnn_fb=cudnn_fb, speed_cudnn_fb=speed_cudnn_fb
        )

    compared = [row(1024, 0.9, 1.0, 0.8, 0.4), row(2048, 0.9, 0.8, 0.95, 0.82)]
    got = records.runs_numbers(compared)
    assert got["c10_runs_gap"] == pytest.approx(0.05)
    assert (got["c10_runs_small_fb"], got["c10_runs_small_speed_fb"]) == (1.0, 0.4)
    assert (got["c10_runs_cudnn_fb"], got["c10_runs_speed_cudnn_fb"]) == (80.0, 200.0)
    with pytest.raises(ValueError, match="differ most"):
        records.runs_numbers([row(1024, 0.9, 1.0, 0.88, 0.99), compared[1]])
    with pytest.raises(ValueError, match="slower"):
        records.runs_numbers([row(1024, 0.9, 1.0, 0.8, 0.4, 300.0), compared[1]])


def test_specialisation_pairs_each_timing_with_its_twin(capsys):
    import numpy as np

    from kernels.gpu import perf_report, records

    rng = np.random.default_rng()

    def speeds():
        return [
            dict(n=n, d=d, mode=m, tflops=float(rng.uniform(100, 400)))
            for n, d in ((4096, 64), (8192, 128))
            for m in ("fwd", "fwd+bwd")
        ]

    first = _stored_first_call(rng)
    plain_first = _stored_first_call(rng)
    data = dict(
        first_call=first,
        specialisation=dict(
            specialised=dict(speed=speeds()),
            not_specialised=dict(first_call=plain_first, speed=speeds()),
        ),
    )
    spec = records.specialisation(data)
    assert spec["first_specialised"] == first["nearest"][1]["seconds"]  # N = 2,000
    assert spec["first_plain"] == plain_first["nearest"][1]["seconds"]
    one, other = data["specialisation"]["specialised"], data["specialisation"]["not_specialised"]
    assert [r["specialised"] for r in spec["rows"]] == [r["tflops"] for r in one["speed"]]
    assert [r["plain"] for r in spec["rows"]] == [r["tflops"] for r in other["speed"]]
    perf_report.print_specialisation(spec)
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and max(map(len, printed)) <= 88
