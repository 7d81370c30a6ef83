"""Chapter 10's figures from the rows of :mod:`kernels.gpu.records`: speed against N, the
ablation, memory, host against GPU time (eager and as a CUDA graph), the first call at a new
length, the forward's loads against cuDNN, the speed targets. At most
:data:`kernels.tools.style.WIDTH_IN` wide, the site's text column."""

from __future__ import annotations

import numpy as np

from ..attention.registry import short
from ..tools.style import WIDTH_IN
from .records import (
    FLOOR_ROWS,
    PEAK_TFLOPS,
    SETTINGS,
    STYLE,
    first_call_times,
    host_label,
    impls_in,
    select,
    setting,
    tma_ratios,
)
from .speed_targets import TARGET_TEXT


def log2_axis(ax, ns):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [f"{n // 1024}k" for n in ns])
    ax.minorticks_off()


def plot_speed(rows, dtype="bf16", causal=True, peak=PEAK_TFLOPS):
    """TFLOP/s against N for every implementation: forward (left), forward + backward (right);
    the right axis reads the same numbers as a share of the dense bf16 peak."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.9), sharey=True, layout="constrained")
    handles = {}
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        chosen = select(rows, dtype, causal, mode)
        ns = sorted({r["n"] for r in chosen})
        for impl in impls_in(chosen):
            pts = sorted((r["n"], r["tflops"]) for r in chosen if r["impl"] == impl)
            (line,) = ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                label=impl,
                lw=1.6,
                ms=5,
                **STYLE.get(impl, {}),
            )
            handles[impl] = line
        if ns:
            log2_axis(ax, ns)
        ax.set(
            xlabel="sequence length N", title="forward" if mode == "fwd" else "forward + backward"
        )
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("TFLOP/s")
    share = axes[1].secondary_yaxis("right", functions=(lambda x: x / peak, lambda f: f * peak))
    share.set_ylabel("share of dense bf16 peak")
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=3)
    return fig


def plot_ablation(rows):
    """TFLOP/s of the book's kernel (bf16, causal, rule off) after each speed-up, per shape."""
    import matplotlib.pyplot as plt

    steps = list(dict.fromkeys(r["step"] for r in rows))
    shapes = list(dict.fromkeys((r["batch"], r["heads"], r["n"], r["d"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6), sharey=True, layout="constrained")
    width = 0.8 / max(len(steps), 1)
    x = np.arange(len(shapes))
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        for i, step in enumerate(steps):
            values = []
            for shape in shapes:
                hit = [
                    r["tflops"]
                    for r in rows
                    if r["step"] == step
                    and r["mode"] == mode
                    and (r["batch"], r["heads"], r["n"], r["d"]) == shape
                ]
                values.append(hit[0] if hit and hit[0] else 0.0)
            ax.bar(x + (i - (len(steps) - 1) / 2) * width, values, width, label=step, color=f"C{i}")
        ax.set_xticks(x, [f"N={s[2] // 1024}k\nD={s[3]}" for s in shapes])
        ax.set(title="forward" if mode == "fwd" else "forward + backward")
    axes[0].set_ylabel("TFLOP/s")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(steps), 3))
    return fig


def plot_memory(rows):
    """Peak allocated memory against N: the book's kernel and the math backend, log-log."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6), layout="constrained")
    for mode, ls in (("fwd", "-"), ("fwd+bwd", "--")):
        for name, color in (("book", "tab:blue"), ("math", "tab:red")):
            pts = [(r["n"], r.get(f"{name}_peak_bytes")) for r in rows if r["mode"] == mode]
            pts = [(n, b / 2**20) for n, b in pts if b]
            if pts:
                label = ("book's kernel" if name == "book" else "SDPA math") + (
                    ", forward" if mode == "fwd" else ", fwd + bwd"
                )
                ax.plot(*zip(*pts), ls=ls, marker="o", ms=4, color=color, label=label)
    ns = sorted({r["n"] for r in rows})
    ax.set_yscale("log")
    if ns:
        log2_axis(ax, ns)
    ax.set(xlabel="sequence length N", ylabel="peak allocated memory [MiB]")
    ax.legend(fontsize=9)
    return fig


def plot_host(rows):
    """Host time to issue one call against the GPU time of its kernels, GPT-2 shape."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.4), sharey=True, layout="constrained")
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        chosen = [r for r in rows if r["mode"] == mode]
        labels = [host_label(r) for r in chosen]
        y = np.arange(len(chosen))
        ax.barh(
            y - 0.2,
            [r["host_us"] for r in chosen],
            0.4,
            label="host (CPU) per call",
            color="tab:orange",
        )
        ax.barh(
            y + 0.2,
            [r["kernel_us"] or 0 for r in chosen],
            0.4,
            label="GPU kernels per call",
            color="tab:blue",
        )
        ax.set_yticks(y, labels)
        ax.set(xlabel="µs per call", title="forward" if mode == "fwd" else "forward + backward")
    axes[0].invert_yaxis()  # once: the two panels share the axis
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2)
    return fig


def plot_targets(target_rows):
    """The three speed ratios with targets against N, one line per setting, with the target."""
    import matplotlib.pyplot as plt

    keys = ["fwd_vs_cudnn", "fb_vs_flash", "fb_vs_cudnn"]
    cudnn, flash = short("sdpa-cudnn"), short("sdpa-flash")
    titles = [f"fwd ÷ {cudnn}", f"fwd+bwd ÷ {flash}", f"fwd+bwd ÷ {cudnn}"]
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH_IN, 3.3), sharey=True, layout="constrained")
    for ax, key, title in zip(axes, keys, titles):
        ns = sorted({r["n"] for r in target_rows})
        for dtype, causal in SETTINGS:
            pts = sorted(
                (r["n"], r[key])
                for r in target_rows
                if r["dtype"] == dtype and r["causal"] == causal and r[key] is not None
            )
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                ms=3.5,
                lw=1.4,
                color="tab:blue" if dtype == "bf16" else "tab:red",
                ls="-" if causal else "--",
                label=setting(dtype, causal),
            )
        ax.axhline(TARGET_TEXT[key][1], color="black", lw=1.2, ls=":", label="target")
        log2_axis(ax, ns)
        ax.set(title=title, xlabel="sequence length N")
    axes[0].set_ylabel("book's kernel ÷ the other")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=5)
    return fig


def plot_first_call(first: dict, target_s: float = 3.0):
    """Wall time of each first forward + backward call of ``first`` (the ``first_call``
    section of ``call_cost.json``), one dot each on a log axis (the times span five decades, so
    no bars), red where it exceeds the target, drawn as a line."""
    import matplotlib.pyplot as plt

    times = first_call_times(first)
    floor = 1e-4  # a call that compiled nothing takes ~1 ms; the axis starts below it
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6), layout="constrained")
    y = np.arange(len(times))
    seconds = [max(s, floor) for _, s in times]
    colours = ["tab:red" if s > target_s else "tab:blue" for _, s in times]
    ax.hlines(y, floor, seconds, color="0.75", lw=1.0)
    ax.scatter(seconds, y, c=colours, s=40, zorder=3)
    for yi, (_, s) in zip(y, times):
        text = f"{s:.1f} s" if s >= 0.1 else f"{s * 1e3:.1f} ms"
        ax.text(
            max(s, floor) * 1.4,
            yi,
            text,
            va="center",
            fontsize=9,
            bbox=dict(facecolor="white", edgecolor="none", pad=0.5),
        )
    ax.axvline(target_s, color="black", ls=":", lw=1.2, label=f"target: {target_s:g} s")
    ax.set_yticks(y, [label for label, _ in times])
    ax.set_ylim(len(times) - 0.5, -0.5)  # the first call at the top
    ax.set_xscale("log")
    ax.set_xlim(floor, 200)
    ax.set_xlabel("first forward + backward call, wall time [s]")
    fig.legend(loc="outside lower center", fontsize=9)
    return fig


def plot_call_host(rows):
    """One forward + backward call issued eagerly and replayed as a CUDA graph (the ``host``
    rows of ``call_cost.json``): host µs to issue it against the GPU µs of its kernels, per
    implementation, with each bar's value written beside it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.2), layout="constrained")
    y = np.arange(len(rows))
    for offset, key, text, colour in (
        (-0.2, "host_us", "host (CPU) per call", "tab:orange"),
        (0.2, "kernel_us", "GPU kernels per call", "tab:blue"),
    ):
        values = [r[key] for r in rows]
        ax.barh(y + offset, values, 0.4, label=text, color=colour)
        for yi, value in zip(y + offset, values):
            ax.text(value + 5, yi, f"{value:.0f}", va="center", fontsize=9)
    ax.set_yticks(y, [f"{r['impl']}, {r['issued']}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15 * max(max(r["host_us"], r["kernel_us"]) for r in rows))
    ax.set_xlabel("µs per forward + backward call")
    fig.legend(loc="outside lower center", ncol=2, fontsize=9)
    return fig


def plot_tma(rows, target=0.8, compared=None):
    """The book's forward over cuDNN's at each shape of the ``tma`` rows of ``call_cost.json``,
    K and V read through pointers or through tensor descriptors (TMA): one dot per timing, so
    two timings of the same kernel show the run-to-run spread; the target as a dotted line.
    With ``compared`` (:func:`kernels.gpu.records.tma_against_speed`) also the speed matrix's
    forward (``perf_speed.json``, another run) as a cross per shape."""
    import matplotlib.pyplot as plt

    table = tma_ratios(rows)
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.4), layout="constrained")
    for shift, key, colour, marker in (
        (-0.12, "pointers", "tab:blue", "o"),
        (0.12, "descriptors", "tab:orange", "s"),
    ):
        xs = [i + shift for i, t in enumerate(table) for _ in t[key]]
        ys = [v for t in table for v in t[key]]
        ax.scatter(xs, ys, s=45, color=colour, marker=marker, label=f"{key} (each timing)")
    if compared:
        other = {(c["n"], c["d"]): c["speed_fwd"] for c in compared}
        ax.plot(
            range(len(table)),
            [other[t["n"], t["d"]] for t in table],
            ls="none",
            marker="x",
            ms=9,
            mew=2,
            color="black",
            label="speed matrix, another run",
        )
    ax.axhline(target, color="black", ls=":", lw=1.2, label=f"target: {target:g}")
    ax.set_xticks(range(len(table)), [f"N={t['n'] // 1024}k, d={t['d']}" for t in table])
    ax.set_xlim(-0.5, len(table) - 0.5)
    ax.set_ylabel("forward TFLOP/s ÷ cuDNN's")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", color="0.9")
    fig.legend(loc="outside lower center", ncol=2 if compared else 3, fontsize=9)
    return fig


def plot_host_floor(host_us: dict):
    """Host µs per eager forward + backward (``host_floor.json``'s ``host_us``): a bar at each
    row's median, a dot for each round, the floor rows (autograd alone) in grey."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.0), layout="constrained")
    names = list(host_us)
    for y, name in enumerate(names):
        floor = name in FLOOR_ROWS
        ax.barh(y, np.median(host_us[name]), 0.6, color="0.7" if floor else "tab:orange")
        ax.scatter(host_us[name], [y] * len(host_us[name]), s=14, color="black", zorder=3)
        ax.text(max(host_us[name]) + 6, y, f"{np.median(host_us[name]):.0f}", va="center",
                fontsize=9)  # fmt: skip
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15 * max(max(us) for us in host_us.values()))
    ax.set_xlabel(
        "host µs per eager forward + backward\n(bar: median of the rounds; dots: each round)"
    )
    return fig
