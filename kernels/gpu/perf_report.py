"""Chapter 10 ("What makes attention fast"): the one module the chapter imports, its tables
and the live benchmark, with the rest of its figures and models gathered here from the modules
that hold them, one job each:

* :mod:`kernels.gpu.records`        ``results/perf_*.json`` as rows
* :mod:`kernels.gpu.perf_figures`   the figures (speed, ablation, memory, host, first call, targets)
* :mod:`kernels.gpu.roofline`       the roofline model and what an ``exp2`` rewrite changes
* :mod:`kernels.gpu.speed_targets`  the kernel's speed targets
* :mod:`kernels.gpu.exercises`      the checks of the chapter's exercises

The measurements themselves are made by ``python -m kernels.gpu.perf`` (:mod:`kernels.gpu.perf`).
"""

from __future__ import annotations

import numpy as np

from .. import timing
from ..attention.registry import label, runner
from .perf_figures import (
    log2_axis,
    plot_ablation,
    plot_call_host,
    plot_first_call,
    plot_host,
    plot_host_floor,
    plot_memory,
    plot_speed,
    plot_targets,
    plot_tma,
)
from .records import (
    BOOK_CROSS,
    BOOK_OFF,
    HBM_TB_S,
    IMPL_ORDER,
    PEAK_TFLOPS,
    RECORDS,
    SETTINGS,
    STYLE,
    call_cost_record,
    first_call_times,
    host_floor_numbers,
    host_floor_record,
    host_label,
    impls_in,
    is_gpu_record,
    load,
    repeat_spread,
    runs_numbers,
    select,
    setting,
    specialisation,
    speed_rows,
    tma_against_speed,
    tma_ratios,
    tma_summary,
)
from .roofline import attainable_tflops, exp2_changes, intensity, p_bar, plot_roofline
from .speed_targets import (
    TARGET_TESTS,
    TARGET_TEXT,
    print_targets,
    print_targets_met,
    targets,
    targets_met,
)

__all__ = [
    "BOOK_CROSS",
    "BOOK_OFF",
    "HBM_TB_S",
    "IMPL_ORDER",
    "MATH_GUARD_BYTES_PER_SCORE",
    "PEAK_TFLOPS",
    "RECORDS",
    "SETTINGS",
    "STYLE",
    "TARGET_TESTS",
    "TARGET_TEXT",
    "ablation_value",
    "attainable_tflops",
    "bytes_per_score",
    "call_cost_record",
    "exp2_changes",
    "first_call_times",
    "host_floor_numbers",
    "host_floor_record",
    "fp16_over_bf16",
    "growth_exponent",
    "host_label",
    "impls_in",
    "intensity",
    "is_gpu_record",
    "live_benchmark",
    "load",
    "log2_axis",
    "p_bar",
    "plot_ablation",
    "plot_call_host",
    "plot_first_call",
    "plot_host",
    "plot_host_floor",
    "plot_memory",
    "plot_roofline",
    "plot_speed",
    "plot_targets",
    "plot_tma",
    "print_ablation",
    "print_host",
    "print_live",
    "print_memory",
    "print_shares",
    "print_speed_table",
    "print_targets",
    "print_targets_met",
    "select",
    "setting",
    "speed_rows",
    "speed_table",
    "targets",
    "runs_numbers",
    "tma_against_speed",
    "tma_ratios",
    "tma_summary",
    "repeat_spread",
    "specialisation",
    "print_specialisation",
    "print_tma",
    "targets_met",
]


def speed_table(rows, n, dtype="bf16", causal=True) -> list[tuple]:
    """(impl, fwd TFLOP/s, f+b TFLOP/s) at sequence length ``n``; None where not measured."""
    table = []
    for impl in impls_in(rows):
        got = {
            r["mode"]: r["tflops"]
            for r in rows
            if r["impl"] == impl
            and r["n"] == n
            and r["dtype"] == dtype
            and bool(r["causal"]) == causal
            and r.get("tflops")
        }
        table.append((impl, got.get("fwd"), got.get("fwd+bwd")))
    return table


def print_speed_table(rows, n, dtype="bf16", causal=True, peak=PEAK_TFLOPS):
    fmt = lambda x: f"{x:7.1f} {x / peak:5.1%}" if x else f"{'—':>13s}"  # noqa: E731
    print(
        f"{'N = ' + format(n, ','):24s}{'forward':>15s}{'fwd + bwd':>15s}   [TFLOP/s, "
        "share of peak]"
    )
    for impl, fwd, both in speed_table(rows, n, dtype, causal):
        print(f"  {impl:22s}{fmt(fwd):>15s}{fmt(both):>15s}")


def _mib(nbytes) -> str:
    return f"{nbytes / 2**20:,.1f}" if nbytes else "—"


def print_memory(rows):
    """Peak allocated memory [MiB] against N: the book's kernel and SDPA math, forward and
    forward + backward; a dash where the math backend was not run."""
    by = {(r["n"], r["mode"]): r for r in rows}
    print(f"{'N':>7s}{'book fwd':>11s}{'math fwd':>11s}{'book f+b':>11s}{'math f+b':>11s}   [MiB]")
    for n in sorted({r["n"] for r in rows}):
        cells = []
        for mode in ("fwd", "fwd+bwd"):
            row = by.get((n, mode), {})
            cells += [row.get("book_peak_bytes"), row.get("math_peak_bytes")]
        print(f"{n:7,d}" + "".join(f"{_mib(b):>11s}" for b in cells))


def growth_exponent(rows, name, mode) -> float:
    """p in peak memory ∝ N^p for ``name`` ('book' or 'math'): the least-squares slope of
    log(bytes) against log(N) over the lengths where it was measured."""
    pts = [(r["n"], r.get(f"{name}_peak_bytes")) for r in rows if r["mode"] == mode]
    pts = [(n, b) for n, b in pts if b]
    return float(np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0])


# kernels.gpu.perf.memory tries the math backend only where six fp32 N×N tensors per head (its
# guard's bytes per score) fit in 80 % of the free GPU memory
MATH_GUARD_BYTES_PER_SCORE = 6 * 4


def bytes_per_score(rows, mode) -> float:
    """The math backend's peak bytes per score (B·H·N² of them) at its largest measured N."""
    row = max(
        (r for r in rows if r["mode"] == mode and r.get("math_peak_bytes")), key=lambda r: r["n"]
    )
    return row["math_peak_bytes"] / (row["batch"] * row["heads"] * row["n"] ** 2)


def ablation_value(rows, step, n, mode):
    """TFLOP/s of the ablation row (``step``, sequence length ``n``, ``mode``)."""
    return next(
        r["tflops"] for r in rows if r["step"] == step and r["n"] == n and r["mode"] == mode
    )


def print_ablation(rows):
    """TFLOP/s after each speed-up (rows) at each shape, forward and forward + backward."""
    steps = list(dict.fromkeys(r["step"] for r in rows))
    shapes = list(dict.fromkeys((r["batch"], r["heads"], r["n"], r["d"]) for r in rows))
    print(f"{'TFLOP/s':16s}" + "".join(f"{f'B{b} H{h} N{n} D{d}':>20s}" for b, h, n, d in shapes))
    print(f"{'':16s}" + f"{'fwd':>11s}{'f+b':>9s}" * len(shapes))
    for step in steps:
        cells = [
            ablation_value(rows, step, shape[2], mode)
            for shape in shapes
            for mode in ("fwd", "fwd+bwd")
        ]
        print(
            f"{step:16s}"
            + "".join(f"{c:{11 if i % 2 == 0 else 9}.1f}" for i, c in enumerate(cells))
        )


def print_host(rows):
    """Host µs to issue one call, wall µs per call in a stream, GPU µs of its kernels."""
    print(f"{'B8 H12 N1024 D64, one call':32s}{'host':>8s}{'wall':>8s}{'GPU':>8s}   [µs]")
    for r in rows:
        gpu = f"{r['kernel_us']:8.0f}" if r.get("kernel_us") else f"{'—':>8s}"
        name = host_label(r) + (", fwd" if r["mode"] == "fwd" else ", fwd + bwd")
        print(f"  {name:30s}{r['host_us']:8.0f}{r['wall_us']:8.0f}{gpu}")


def print_shares(rows, n, mode="fwd+bwd", peak=PEAK_TFLOPS):
    """Share of the dense bf16 peak of every implementation at sequence length ``n``, in the
    four settings (bf16 / fp16, causal / no mask)."""
    print(
        f"N = {n:,}, {'forward' if mode == 'fwd' else 'forward + backward'}: "
        "share of the dense bf16 peak"
    )
    print(f"{'':24s}" + "".join(f"{setting(*s):>15s}" for s in SETTINGS))
    for impl in impls_in(rows):
        cells = []
        for dtype, causal in SETTINGS:
            hit = [
                r["tflops"]
                for r in select(rows, dtype, causal, mode)
                if r["impl"] == impl and r["n"] == n
            ]
            cells.append(f"{hit[0] / peak:15.1%}" if hit else f"{'—':>15s}")
        print(f"  {impl:22s}" + "".join(cells))


def fp16_over_bf16(rows, min_n=0) -> dict:
    """{impl: (lowest, highest)} of fp16 TFLOP/s over bf16 TFLOP/s, same mask, N and mode,
    over the lengths from ``min_n`` on."""
    bf16 = {
        (r["impl"], bool(r["causal"]), r["n"], r["mode"]): r["tflops"]
        for r in rows
        if r["dtype"] == "bf16"
    }
    out = {}
    for impl in impls_in(rows):
        ratios = [
            r["tflops"] / bf16[key]
            for r in rows
            if r["impl"] == impl
            and r["dtype"] == "fp16"
            and r["n"] >= min_n
            and (key := (impl, bool(r["causal"]), r["n"], r["mode"])) in bf16
        ]
        if ratios:
            out[impl] = (min(ratios), max(ratios))
    return out


def print_live(rows, peak=PEAK_TFLOPS):
    """The rows of :func:`live_benchmark`."""
    for r in rows:
        shown = (
            f"{r['tflops']:7.1f} TFLOP/s {r['tflops'] / peak:6.1%} of {peak:.0f}"
            if r.get("tflops")
            else r.get("error", "not measured")
        )
        mode = "fwd" if r["mode"] == "fwd" else "fwd + bwd"
        print(f"  {r['impl']:22s}{mode:11s}{shown}")


# --- a live benchmark (GPU only) -------------------------------------------------------
def live_benchmark(shape=(4, 16, 2048, 64), causal=True):
    """This machine's numbers: the book's kernel and SDPA flash, bf16, forward and forward +
    backward (do_bench medians). Returns rows, or None without a CUDA GPU."""
    import torch

    if not timing.on_gpu():
        return None
    tensors = timing.inputs(shape, torch.bfloat16, "cuda")
    rows = []
    for name in ("sdpa-flash", "triton", "triton/cross"):
        for mode in ("fwd", "fwd+bwd"):
            rows.append(
                timing.speed_row(
                    label(name),
                    runner(name, causal=causal),
                    tensors,
                    shape,
                    "bf16",
                    causal,
                    mode,
                    peak=PEAK_TFLOPS,
                    warmup=10,
                    rep=50,
                )
            )
    return rows


def print_specialisation(spec: dict) -> None:
    """The first call at N = 2,000 and the speed, lengths specialised and not (one print)."""
    lines = [
        f"N = 2,000, first call: {spec['first_specialised']:.2f} s specialised, "
        f"{1e3 * spec['first_plain']:.1f} ms not"
    ]
    lines += [
        f"N = {r['n']:,}, d = {r['d']:3d}, {r['mode']:7s}: {r['specialised']:5.1f} TFLOP/s "
        f"specialised, {r['plain']:5.1f} not ({r['plain'] / r['specialised'] - 1:+.0%})"
        for r in spec["rows"]
    ]
    print("\n".join(lines))


def print_tma(summary: list, compared: list | None = None) -> None:
    """Descriptors against pointers and the default's shares of cuDNN, per shape (one print);
    with ``compared`` (:func:`tma_against_speed`) the speed matrix's shares beside them."""
    lines = [
        "book ÷ cuDNN, bf16, causal (forward as read by default); descriptors against pointers",
        "run A: this section's run" + ("; run B: section 5's speed matrix" if compared else ""),
        f"{'':21s}{'TMA vs ptr':>12s}{'A fwd':>9s}{'A f+b':>8s}"
        + (f"{'B fwd':>11s}{'B f+b':>8s}" if compared else ""),
    ]
    other = {(c["n"], c["d"]): c for c in compared or ()}
    for t in summary:
        label = f"N = {t['n']:,}, d = {t['d']}:"
        line = f"{label:21s}{t['change']:+12.0%}{t['default']:9.2f}{t['fb']:8.2f}"
        if compared:
            c = other[t["n"], t["d"]]
            line += f"{c['speed_fwd']:11.2f}{c['speed_fb']:8.2f}"
        lines.append(line)
    print("\n".join(lines))


def roofline_series(fwd_rows: list, impls: tuple) -> list:
    """Section 1's points for :func:`plot_roofline`: each implementation's forward speeds
    (``fwd_rows``, d = 64) at the fused model's intensity, then the math backend's model
    ceiling at N = 4,096 for d = 64 and 128 (not timed: open markers on the roof)."""
    series = []
    for impl in impls:
        pts = sorted((r["n"], r["tflops"]) for r in fwd_rows if r["impl"] == impl)
        xs = [intensity(n, 64) for n, _ in pts]
        series.append((impl, xs, [t for _, t in pts], dict(STYLE[impl], ms=6)))
    math = [intensity(4096, d, "math") for d in (64, 128)]
    ceiling = ("SDPA math, model ceiling (d = 64, 128)", math, None)
    return series + [(*ceiling, dict(color="tab:red", marker="o", ms=7))]
