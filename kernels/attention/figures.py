"""The figures of chapters 3 and 4 (the forward and backward kernels), as chapters 6-10 have
theirs: each function draws one figure from numbers the chapter computed or loaded, and returns
it (the chapter calls ``plt.show()``).

* :func:`plot_online_stats`      the running max and sum of one row, tile by tile (ch. 3)
* :func:`plot_error_bars`        relative errors of the kernel and naive attention (ch. 3, 4)
* :func:`plot_measured_memory`   peak memory against N measured on this machine (ch. 3)
* :func:`plot_stored_memory`     the stored GPU peak memory, forward and backward (ch. 3)
* :func:`chapter3_speed_rows`    the stored speed rows chapter 3 shows (bf16, causal)
* :func:`plot_stored_speed`      the stored GPU TFLOP/s per shape (ch. 3)
* :func:`print_speed_table`      the same TFLOP/s as a printed table (ch. 3)
* :func:`tflops_at`              one row's TFLOP/s, picked by implementation and call (ch. 3)
* :func:`plot_stored_backward`   the stored GPU errors of dQ, dK, dV by δ source (ch. 4)
* :func:`plot_delta_gap`         δ_lp − δ_hp per row and its running sum (ch. 4)
* :func:`show_gpu_check_forward`, :func:`show_stored_memory`, :func:`show_stored_speed`: chapter
  3's stored GPU records, loaded, shown and reduced to the numbers its prose glues
"""

from __future__ import annotations

import numpy as np

from .. import results
from .registry import label

GRADS = ("dq", "dk", "dv")


def _plt():
    import matplotlib.pyplot as plt

    return plt


def plot_mode_errors(errors: dict):
    """Relative error of O against fp64 per numerics mode (``{"fa2": …, "paper": …}``), one
    bar each: the same bf16 inputs through the two modes of the forward kernel."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(errors), list(errors.values()), color=["tab:blue", "tab:red"][: len(errors)])
    ax.set_xlabel("numerics mode")
    ax.set_ylabel("relative error of O vs fp64")
    ax.set_title("same bf16 inputs, two numerics modes")
    fig.tight_layout()
    return fig


def plot_online_stats(trace, row):
    """``trace`` of :func:`kernels.attention.tiling.online_attention` (tile, m, ℓ per key tile)
    for query row ``row``: the running max (steps) and the running sum (dashed, right axis)."""
    tiles, ms, ells = zip(*trace)
    fig, ax = _plt().subplots()
    ax.step(tiles, ms, where="post", marker="o", label="running max $m$")
    ax.set_xlabel("key tile $j$ (32 keys each)")
    ax.set_ylabel("running max $m$")
    ax2 = ax.twinx()
    ax2.plot(tiles, ells, "s--", color="tab:orange", label=r"running sum $\ell$")
    ax2.set_ylabel(r"running sum $\ell$ (relative to the current $m$)")
    ax.set_title(f"online softmax statistics of query row {row} (key 200 is large)")
    fig.legend(loc="center left", bbox_to_anchor=(0.12, 0.55))
    return fig


def plot_error_bars(
    labels, series, ylabel, title, figsize=(6.8, 3.6), legend=None, tight=False, xlabel=None
):
    """Relative errors on a log axis, one group per label: ``series`` is ``{name: values}`` (one
    to a few), drawn side by side in each group as points (on a log axis a bar has no base, so
    its length would mean nothing). ``legend``: keyword arguments of the legend (None: the
    default place). ``figsize`` None: the style's size; ``tight``: ``tight_layout`` (a legend
    beside the axes)."""
    fig, ax = _plt().subplots(figsize=figsize)
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for i, ((name, values), marker) in enumerate(zip(series.items(), MARKERS)):
        _points(ax, x + (i - (len(series) - 1) / 2) * width, values, name, marker)
    ax.set_yscale("log")
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(**(legend or {}))
    if tight:
        fig.tight_layout()
    return fig


MARKERS = "osD^v<>"


def _points(ax, x, values, label, marker, **style):
    """One series of a grouped dot plot: markers only, no line, no bar."""
    ax.plot(x, list(values), marker=marker, linestyle="none", markersize=7, label=label, **style)


def plot_measured_memory(memory, sizes, element_bytes, title, head_dim=64):
    """``memory``: {implementation: {N: peak bytes}} measured on this machine; with the two
    guide lines ∝ N² and 2Nd elements."""
    fig, ax = _plt().subplots()
    for (name, by_n), marker in zip(memory.items(), "osD"):
        ax.loglog(list(by_n), list(by_n.values()), marker=marker, label=name)
    n0 = np.array(sizes, dtype=float)
    ax.loglog(n0, element_bytes * n0**2, "k:", label=r"$\propto N^2$")
    ax.loglog(n0, 2 * element_bytes * head_dim * n0, "k--", alpha=0.5, label=r"$2Nd$ elements")
    ax.set_xlabel(f"sequence length N (1 head, d = {head_dim})")
    ax.set_ylabel("peak memory beyond the inputs (bytes)")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.minorticks_off()
    ax.set_title(title)
    ax.legend(fontsize=9)
    return fig


def plot_stored_memory(rows):
    """The rows of ``results/perf_memory.json``: peak GPU memory beyond the inputs (MiB) of
    SDPA's math backend (which stores S and P) and of the book's flash kernel against N,
    forward (solid) and forward + backward (dashed); the legend below the axes."""
    fig, ax = _plt().subplots(figsize=(6.4, 4.6), layout="constrained")
    for key, marker, color, name in [
        ("math_peak_bytes", "o", "tab:blue", "SDPA math (stores S, P)"),
        ("book_peak_bytes", "D", "tab:green", "the book's flash kernel"),
    ]:
        for mode, style in [("fwd", "-"), ("fwd+bwd", "--")]:
            rows_m = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["n"])
            pts = [(r["n"], r[key] / 2**20) for r in rows_m if r.get(key) is not None]
            if pts:
                ax.loglog(*zip(*pts), style, marker=marker, color=color, label=f"{name}, {mode}")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak GPU memory beyond the inputs (MiB)")
    first = rows[0]
    causal = "causal" if first.get("causal", True) else "full"
    ax.set_title(f"stored GPU record: B {first['batch']}, H {first['heads']}, d {first['d']}, "
                 f"bf16, {causal}", fontsize=10)  # fmt: skip
    fig.legend(loc="outside lower center", ncols=2, fontsize=9)
    return fig


# the implementations chapter 3 compares, in the order of its bars and columns
CHAPTER3_IMPLS = {
    "triton": "book",
    "triton/cross": "book+rule",
    "sdpa-flash": "SDPA flash",
    "sdpa-cudnn": "cuDNN",
}


def chapter3_speed_rows(rows) -> list:
    """The timed rows of ``results/perf_speed.json`` chapter 3 shows: bf16, causal, the
    implementations of :data:`CHAPTER3_IMPLS`, in that order."""
    order = {label(name): i for i, name in enumerate(CHAPTER3_IMPLS)}
    kept = [
        r
        for r in rows
        if r["impl"] in order and r["dtype"] == "bf16" and r["causal"] and r.get("tflops")
    ]
    return sorted(kept, key=lambda r: order[r["impl"]])


def shape_of(row) -> tuple:
    return row["batch"], row["heads"], row["n"], row["d"]


def plot_stored_speed(rows):
    """Timed rows of ``results/perf_speed.json`` (:func:`chapter3_speed_rows`): TFLOP/s of each
    implementation per shape, forward (left) and forward + backward (right)."""
    shapes = sorted({shape_of(r) for r in rows}, key=lambda s: s[2])
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    tflops = {(r["impl"], r["mode"], shape_of(r)): r["tflops"] for r in rows}
    fig, axes = _plt().subplots(1, 2, figsize=(6.8, 3.6), sharey=True)
    width = 0.8 / len(impls)
    for ax, mode in zip(axes, ["fwd", "fwd+bwd"]):
        for i, impl in enumerate(impls):
            tf = [tflops.get((impl, mode, s), np.nan) for s in shapes]
            ax.bar(
                np.arange(len(shapes)) + (i - (len(impls) - 1) / 2) * width, tf, width, label=impl
            )
        ticks = [f"N {n // 1024}k\nd {d}" for _, _, n, d in shapes]
        ax.set_xticks(np.arange(len(shapes)), ticks, fontsize=9)
        ax.set_title(f"{mode}, bf16, causal")
        ax.set_xlabel("sequence length, head dim")
    axes[0].set_ylabel("TFLOP/s")
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="lower center",
        ncols=2,
        bbox_to_anchor=(0.5, -0.02),
    )
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def print_speed_table(rows) -> None:
    """Print timed rows of ``results/perf_speed.json`` (:func:`chapter3_speed_rows`): TFLOP/s
    of the book's kernel (with and without the cross-tile rule), SDPA flash and cuDNN per shape
    and pass, and the ratio book / SDPA flash."""
    columns = {label(name): short for name, short in CHAPTER3_IMPLS.items()}
    book, flash = label("triton"), label("sdpa-flash")
    print("TFLOP/s. book: the book's kernel; book+rule: with the cross-tile β rule;")
    print("ratio: book / SDPA flash; shape: batch B, heads H, sequence length N, head dim d;")
    print("pass: forward alone (fwd) or forward and backward (fwd+bwd)")
    header = "".join(f"{c:>11s}" for c in columns.values())
    print(f"{'shape':19s}{'pass':9s}{header}{'ratio':>7s}")
    for b, h, n, d in sorted({shape_of(r) for r in rows}, key=lambda s: s[2]):
        for mode in ["fwd", "fwd+bwd"]:
            got = {
                r["impl"]: r["tflops"]
                for r in rows
                if r["mode"] == mode and shape_of(r) == (b, h, n, d)
            }
            tf = "".join(f"{got[k]:11.0f}" if k in got else f"{'-':>11s}" for k in columns)
            ratio = got.get(book, np.nan) / got.get(flash, np.nan)
            print(f"{f'B{b} H{h} N{n} d{d}':19s}{mode:9s}{tf}{ratio:7.2f}")


def tflops_at(rows, impl: str, **call) -> float:
    """The TFLOP/s of the first row of ``impl`` whose fields equal ``call``
    (``batch=8, heads=12, ...``); a KeyError names the call when no row matches."""
    for r in rows:
        if r["impl"] == impl and all(r.get(k) == v for k, v in call.items()):
            return r["tflops"]
    raise KeyError(f"no row of {impl!r} at {call}")


def plot_stored_backward(bwd):
    """The backward rows of ``results/gpu_check.json``: relative errors of dQ, dK, dV against
    fp64 autograd for each δ source, and SDPA flash's on the same inputs, one panel per d."""
    plt = _plt()
    dims = sorted({r["d"] for r in bwd})
    fig, axes = plt.subplots(1, len(dims), figsize=(6.8, 3.4), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, d in zip(axes, dims):
        rows_d = [r for r in bwd if r["d"] == d]
        x = np.arange(3)
        for i, (r, marker) in enumerate(zip(rows_d, MARKERS)):
            _points(
                ax,
                x + (i - 1.5) * 0.2,
                [r[g]["rel_err_native"] for g in GRADS],
                f'ours, delta_source="{r["delta_source"]}"',
                marker,
            )
        _points(
            ax,
            x + 1.5 * 0.2,
            [rows_d[0][g]["rel_err_sdpa_flash"] for g in GRADS],
            label("sdpa-flash"),
            "x",
            color="k",
        )
        ax.set_xticks(x, ["dQ", "dK", "dV"])
        ax.set_xlim(-0.6, 2.6)
        ax.set_title(f"d = {d}")
    axes[0].yaxis.set_major_formatter(lambda y, _: f"{y * 1e3:.2f}")
    axes[0].set_ylabel("relative error vs fp64 autograd [10⁻³]")
    plt.tight_layout()
    fig.legend(
        *axes[0].get_legend_handles_labels(),
        loc="upper center",
        ncol=2,
        fontsize=9,
        bbox_to_anchor=(0.5, 1.16),
    )
    return fig


def plot_delta_gap(gap):
    """(δ_lp − δ_hp) per query row (left) and its running sum, the coefficient of the paper's
    Eq. (3) (right)."""
    plt = _plt()
    gap = np.asarray(gap)  # a CPU array or tensor
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(6.8, 3.4), layout="constrained")
    rows_t = np.arange(len(gap))
    ax1.plot(rows_t, gap, ".", markersize=4)
    ax1.axhline(0, color="k", linewidth=0.8)
    ax1.set_xlabel("query row T")
    ax1.set_ylabel(r"$(\delta_{lp} - \delta_{hp})[T]$")
    ax1.set_title("δ error per row, bf16 O vs fp32 O")
    ax2.plot(rows_t, np.cumsum(gap), color="tab:red")
    ax2.axhline(0, color="k", linewidth=0.8)
    ax2.set_xlabel("query row T")
    ax2.set_ylabel(r"$\sum_{t \leq T} (\delta_{lp} - \delta_{hp})[t]$")
    ax2.set_title("running sum over query rows")
    return fig


# ----------------------------------------------------------------------------------------------
# Chapter 3's stored GPU records: each function loads its record, shows it (figure, provenance,
# table) and returns the numbers the chapter's prose glues.
# ----------------------------------------------------------------------------------------------


def show_gpu_check_forward() -> dict:
    """Print the forward rows of ``results/gpu_check.json`` (offset fix off): the share of the
    native kernel's outputs equal to the emulator's and to the explicit path's, its relative error
    and SDPA flash's. Returns chapter 3's numbers (``c3_gpu_*``)."""
    check = results.load("gpu_check")
    rows = [
        r
        for r in check["data"]["explicit_vs_native"]
        if r["pass_"] == "fwd" and r["stable"] == "off"
    ]
    print(results.describe(check, prefix=results.GPU_PREFIX))
    print("the native kernel: share of its outputs equal to the emulator's and to the")
    print("explicit path's, its relative error vs fp64, and SDPA flash's on the same inputs")
    print(
        f"{'head dim':>8s}{'causal':>8s}{'numerics':>10s}{'= emulator':>12s}"
        f"{'= explicit':>12s}{'rel. error':>12s}{'SDPA flash':>12s}"
    )
    for r in rows:
        print(
            f"{r['d']:8d}{r['causal']!s:>8s}{r['numerics']:>10s}"
            f"{r['native_vs_emulator']['identical']:12.2%}"
            f"{r['native_vs_explicit']['identical']:12.2%}"
            f"{r['rel_err_native']:12.2e}{r['rel_err_sdpa_flash']:12.2e}"
        )
    over = {
        mode: [r["rel_err_native"] / r["rel_err_sdpa_flash"] for r in rows if r["numerics"] == mode]
        for mode in ("fa2", "paper")
    }
    return {
        "c3_gpu_name": check["provenance"]["gpu"],
        "c3_gpu_same_min": min(r["native_vs_emulator"]["identical"] for r in rows),
        "c3_gpu_fa2_off": max(abs(x - 1) for x in over["fa2"]),
        "c3_gpu_paper_lo": min(over["paper"]),
        "c3_gpu_paper_hi": max(over["paper"]),
    }


def _mib(peak: dict, mode: str, n: int, key: str) -> str:
    """Peak MiB beyond the inputs; '-': not measured (skipped by the run's guard)."""
    r = peak.get((mode, n))
    return "-" if r is None or r.get(key) is None else f"{r[key] / 2**20:.1f}"


def show_stored_memory() -> dict:
    """Plot and print ``results/perf_memory.json`` (:func:`plot_stored_memory`, its provenance,
    a table of MiB per N); returns chapter 3's numbers (``c3_mem_*``)."""
    record = results.load("perf_memory")
    rows = record["data"]["rows"]
    plot_stored_memory(rows)
    _plt().show()
    print(results.describe(record, prefix=results.GPU_PREFIX))
    peak = {(r["mode"], r["n"]): r for r in rows}
    keys = ("math_peak_bytes", "book_peak_bytes")
    print("peak memory beyond the inputs [MiB]; naive: SDPA's math backend")
    print(f"{'':8s}{'forward':>30s}{'forward + backward':>30s}")
    print(f"{'N':>8s}" + f"{'naive':>20s}{'flash':>10s}" * 2)
    for n in sorted({r["n"] for r in rows}):
        cells = [_mib(peak, m, n, key) for m in ("fwd", "fwd+bwd") for key in keys]
        print(f"{n:8,d}{cells[0]:>20s}{cells[1]:>10s}{cells[2]:>20s}{cells[3]:>10s}")
    both = [r for r in rows if r["mode"] == "fwd" and all(r.get(k) for k in keys)]
    at = max(both, key=lambda r: r["n"])
    longest = max((r for r in rows if r["mode"] == "fwd"), key=lambda r: r["n"])
    return {
        "c3_mem_gpu": record["provenance"]["gpu"],
        "c3_mem_n": at["n"],
        "c3_mem_naive": at["math_peak_bytes"] / 2**20,
        "c3_mem_flash": at["book_peak_bytes"] / 2**20,
        "c3_mem_ratio": at["math_peak_bytes"] / at["book_peak_bytes"],
        "c3_mem_n_max": longest["n"],
        "c3_mem_flash_max": longest["book_peak_bytes"] / 2**20,
    }


def show_stored_speed() -> dict:
    """Plot and print ``results/perf_speed.json`` (:func:`chapter3_speed_rows`,
    :func:`plot_stored_speed`, its provenance, :func:`print_speed_table`); returns chapter 3's
    numbers (``c3_speed_*``) over the shapes longer than N = 1024."""
    record = results.load("perf_speed")
    rows = chapter3_speed_rows(record["data"]["rows"])
    plot_stored_speed(rows)
    _plt().show()
    print(results.describe(record, prefix=results.GPU_PREFIX))
    print_speed_table(rows)

    def tf(impl, row):
        call = {k: row[k] for k in ("n", "d", "mode", "batch")}
        return tflops_at(rows, label(impl), **call)

    long_rows = [r for r in rows if r["impl"] == label("triton") and r["n"] > 1024]
    vs_flash = [r["tflops"] / tf("sdpa-flash", r) for r in long_rows]
    vs_cudnn = [r["tflops"] / tf("sdpa-cudnn", r) for r in long_rows]
    rule_cost = [1 - tf("triton/cross", r) / r["tflops"] for r in long_rows]
    return {
        "c3_speed_gpu": record["provenance"]["gpu"],
        "c3_speed_n": min(r["n"] for r in long_rows),
        "c3_speed_flash_lo": min(vs_flash),
        "c3_speed_flash_hi": max(vs_flash),
        "c3_speed_cudnn_lo": min(vs_cudnn),
        "c3_speed_cudnn_hi": max(vs_cudnn),
        "c3_speed_rule_lo": min(rule_cost),
        "c3_speed_rule_hi": max(rule_cost),
    }
