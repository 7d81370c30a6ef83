"""Tables, figures and models of chapter 10 ("What makes attention fast").

The measurements come from ``results/perf_*.json`` (written by ``python -m kernels.gpu.perf``
on a GPU). :func:`load` returns what there is and never treats a CPU record (provenance
without a GPU, e.g. from ``--small``) as a GPU measurement; :func:`earlier_speed_rows` reads
``results/flash_bench.json`` (an earlier version of the book's kernel, fewer shapes) in the
same row format.

Also here: the roofline model (:func:`intensity`, :func:`plot_roofline`), the measurement of
what an ``exp2`` rewrite would change in P̄ (:func:`exp2_changes`) and the targets of issue 15
(:func:`targets`, :func:`plot_targets`). The chapter's exercise checks are in
:mod:`kernels.gpu.exercises`.

Figures are at most :data:`kernels.tools.style.WIDTH_IN` wide, the site's text column.
"""
from __future__ import annotations

import math

import numpy as np

from .. import results
from ..tools.style import WIDTH_IN

PEAK_TFLOPS = 790.0          # dense bf16 matmul on an H100/H200: the ceiling of every speed
HBM_TB_S = 3.35              # H100 SXM5 80 GB HBM3 bandwidth, NVIDIA's datasheet (TB/s)
RECORDS = ("host", "speed", "memory", "ablation")
IMPL_ORDER = ["SDPA cuDNN", "SDPA flash", "SDPA efficient", "book, rule off",
              "book, cross-tile rule"]
STYLE = {"SDPA cuDNN": dict(color="tab:purple", marker="s"),
         "SDPA flash": dict(color="tab:orange", marker="o"),
         "SDPA efficient": dict(color="tab:gray", marker="v"),
         "book, rule off": dict(color="tab:blue", marker="D"),
         "book, cross-tile rule": dict(color="tab:green", marker="^")}
EARLIER = {"ours (stable off)": "book, rule off", "ours (stable cross)": "book, cross-tile rule",
           "SDPA flash": "SDPA flash", "SDPA cuDNN": "SDPA cuDNN"}


# --- records --------------------------------------------------------------------------
def is_gpu_record(record) -> bool:
    return bool(record) and bool(record.get("provenance", {}).get("gpu"))


def load(directory=None) -> dict:
    """{"host", "speed", "memory", "ablation"} -> the GPU record of ``perf_<name>.json`` in
    ``directory`` (default ``results/``), or None where there is none (or only a CPU one)."""
    found = {}
    for name in RECORDS:
        try:
            record = results.load(f"perf_{name}", directory=directory)
        except FileNotFoundError:
            record = None
        found[name] = record if is_gpu_record(record) else None
    return found


def earlier_speed_rows(directory=None) -> tuple[list, dict]:
    """``flash_bench.json`` (an earlier kernel version, bf16 causal, three shapes) in the
    rows format of ``perf_speed.json``; returns (rows, record)."""
    record = results.load("flash_bench", directory=directory)
    rows = []
    for r in record["data"]:
        if r.get("tflops") is None or r["impl"] not in EARLIER:
            continue
        rows.append(dict(r, impl=EARLIER[r["impl"]], dtype="bf16",
                         fraction_of_peak=r["tflops"] / PEAK_TFLOPS))
    return rows, record


def speed_rows(record) -> list:
    return [r for r in record["data"]["rows"] if r.get("tflops")]


def _select(rows, dtype, causal, mode):
    return [r for r in rows if r["dtype"] == dtype and bool(r["causal"]) == causal
            and r["mode"] == mode and r.get("tflops")]


def impls_in(rows) -> list:
    seen = {r["impl"] for r in rows}
    return [name for name in IMPL_ORDER if name in seen]


def speed_table(rows, n, dtype="bf16", causal=True) -> list[tuple]:
    """(impl, fwd TFLOP/s, f+b TFLOP/s) at sequence length ``n``; None where not measured."""
    table = []
    for impl in impls_in(rows):
        got = {r["mode"]: r["tflops"] for r in rows if r["impl"] == impl and r["n"] == n
               and r["dtype"] == dtype and bool(r["causal"]) == causal and r.get("tflops")}
        table.append((impl, got.get("fwd"), got.get("fwd+bwd")))
    return table


def print_speed_table(rows, n, dtype="bf16", causal=True, peak=PEAK_TFLOPS):
    fmt = lambda x: f"{x:7.1f} {x / peak:5.1%}" if x else f"{'—':>13s}"  # noqa: E731
    print(f"{'N = ' + format(n, ','):24s}{'forward':>15s}{'fwd + bwd':>15s}   [TFLOP/s, "
          "share of peak]")
    for impl, fwd, both in speed_table(rows, n, dtype, causal):
        print(f"  {impl:22s}{fmt(fwd):>15s}{fmt(both):>15s}")


# --- figures --------------------------------------------------------------------------
def _log2_axis(ax, ns):
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
        chosen = _select(rows, dtype, causal, mode)
        ns = sorted({r["n"] for r in chosen})
        for impl in impls_in(chosen):
            pts = sorted((r["n"], r["tflops"]) for r in chosen if r["impl"] == impl)
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], label=impl, lw=1.6,
                              ms=5, **STYLE.get(impl, {}))
            handles[impl] = line
        if ns:
            _log2_axis(ax, ns)
        ax.set(xlabel="sequence length N", title="forward" if mode == "fwd" else
               "forward + backward")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("TFLOP/s")
    share = axes[1].secondary_yaxis("right", functions=(lambda x: x / peak,
                                                       lambda f: f * peak))
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
                hit = [r["tflops"] for r in rows if r["step"] == step and r["mode"] == mode
                       and (r["batch"], r["heads"], r["n"], r["d"]) == shape]
                values.append(hit[0] if hit and hit[0] else 0.0)
            ax.bar(x + (i - (len(steps) - 1) / 2) * width, values, width, label=step,
                   color=f"C{i}")
        ax.set_xticks(x, [f"N={s[2] // 1024}k\nD={s[3]}" for s in shapes])
        ax.set(title="forward" if mode == "fwd" else "forward + backward")
    axes[0].set_ylabel("TFLOP/s")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(steps))
    return fig


def plot_memory(rows):
    """Peak allocated memory against N: the book's kernel and the math backend, log-log."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 3.6), layout="constrained")
    for mode, ls in (("fwd", "-"), ("fwd+bwd", "--")):
        for name, color in (("book", "tab:blue"), ("math", "tab:red")):
            pts = [(r["n"], r.get(f"{name}_peak_bytes")) for r in rows if r["mode"] == mode]
            pts = [(n, b / 2 ** 20) for n, b in pts if b]
            if pts:
                label = ("book's kernel" if name == "book" else "SDPA math") + \
                        (", forward" if mode == "fwd" else ", fwd + bwd")
                ax.plot(*zip(*pts), ls=ls, marker="o", ms=4, color=color, label=label)
    ns = sorted({r["n"] for r in rows})
    ax.set_yscale("log")
    if ns:
        _log2_axis(ax, ns)
    ax.set(xlabel="sequence length N", ylabel="peak allocated memory [MiB]")
    ax.legend(fontsize=9)
    return fig


def plot_host(rows):
    """Host time to issue one call against the GPU time of its kernels, GPT-2 shape."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.4), sharey=True, layout="constrained")
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        chosen = [r for r in rows if r["mode"] == mode]
        labels = [_host_label(r) for r in chosen]
        y = np.arange(len(chosen))
        ax.barh(y - 0.2, [r["host_us"] for r in chosen], 0.4, label="host (CPU) per call",
                color="tab:orange")
        ax.barh(y + 0.2, [r["kernel_us"] or 0 for r in chosen], 0.4,
                label="GPU kernels per call", color="tab:blue")
        ax.set_yticks(y, labels)
        ax.set(xlabel="µs per call", title="forward" if mode == "fwd" else
               "forward + backward")
    axes[0].invert_yaxis()                      # once: the two panels share the axis
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2)
    return fig


def _host_label(row):
    if row["direct_launch"] is None:
        return row["impl"]
    return "book, direct launch" if row["direct_launch"] else "book, as before"


# --- tables ---------------------------------------------------------------------------
SETTINGS = [("bf16", True), ("bf16", False), ("fp16", True), ("fp16", False)]


def _setting(dtype, causal) -> str:
    return f"{dtype}, {'causal' if causal else 'no mask'}"


def _mib(nbytes) -> str:
    return f"{nbytes / 2 ** 20:,.1f}" if nbytes else "—"


def print_memory(rows):
    """Peak allocated memory [MiB] against N: the book's kernel and SDPA math, forward and
    forward + backward; a dash where the math backend was not run."""
    by = {(r["n"], r["mode"]): r for r in rows}
    print(f"{'N':>7s}{'book fwd':>11s}{'math fwd':>11s}{'book f+b':>11s}{'math f+b':>11s}"
          "   [MiB]")
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


def bytes_per_score(rows, mode) -> float:
    """The math backend's peak bytes per score (B·H·N² of them) at its largest measured N."""
    row = max((r for r in rows if r["mode"] == mode and r.get("math_peak_bytes")),
              key=lambda r: r["n"])
    return row["math_peak_bytes"] / (row["batch"] * row["heads"] * row["n"] ** 2)


def ablation_value(rows, step, n, mode):
    """TFLOP/s of the ablation row (``step``, sequence length ``n``, ``mode``)."""
    return next(r["tflops"] for r in rows if r["step"] == step and r["n"] == n
                and r["mode"] == mode)


def print_ablation(rows):
    """TFLOP/s after each speed-up (rows) at each shape, forward and forward + backward."""
    steps = list(dict.fromkeys(r["step"] for r in rows))
    shapes = list(dict.fromkeys((r["batch"], r["heads"], r["n"], r["d"]) for r in rows))
    print(f"{'TFLOP/s':16s}" + "".join(f"{f'B{b} H{h} N{n} D{d}':>20s}"
                                       for b, h, n, d in shapes))
    print(f"{'':16s}" + f"{'fwd':>11s}{'f+b':>9s}" * len(shapes))
    for step in steps:
        cells = [ablation_value(rows, step, shape[2], mode) for shape in shapes
                 for mode in ("fwd", "fwd+bwd")]
        print(f"{step:16s}" + "".join(f"{c:{11 if i % 2 == 0 else 9}.1f}"
                                      for i, c in enumerate(cells)))


def print_host(rows):
    """Host µs to issue one call, wall µs per call in a stream, GPU µs of its kernels."""
    print(f"{'B8 H12 N1024 D64, one call':32s}{'host':>8s}{'wall':>8s}{'GPU':>8s}   [µs]")
    for r in rows:
        gpu = f"{r['kernel_us']:8.0f}" if r.get("kernel_us") else f"{'—':>8s}"
        name = _host_label(r) + (", fwd" if r["mode"] == "fwd" else ", fwd + bwd")
        print(f"  {name:30s}{r['host_us']:8.0f}{r['wall_us']:8.0f}{gpu}")


def print_shares(rows, n, mode="fwd+bwd", peak=PEAK_TFLOPS):
    """Share of the dense bf16 peak of every implementation at sequence length ``n``, in the
    four settings (bf16 / fp16, causal / no mask)."""
    print(f"N = {n:,}, {'forward' if mode == 'fwd' else 'forward + backward'}: "
          "share of the dense bf16 peak")
    print(f"{'':24s}" + "".join(f"{_setting(*s):>15s}" for s in SETTINGS))
    for impl in impls_in(rows):
        cells = []
        for dtype, causal in SETTINGS:
            hit = [r["tflops"] for r in _select(rows, dtype, causal, mode)
                   if r["impl"] == impl and r["n"] == n]
            cells.append(f"{hit[0] / peak:15.1%}" if hit else f"{'—':>15s}")
        print(f"  {impl:22s}" + "".join(cells))


def fp16_over_bf16(rows, min_n=0) -> dict:
    """{impl: (lowest, highest)} of fp16 TFLOP/s over bf16 TFLOP/s, same mask, N and mode,
    over the lengths from ``min_n`` on."""
    bf16 = {(r["impl"], bool(r["causal"]), r["n"], r["mode"]): r["tflops"] for r in rows
            if r["dtype"] == "bf16"}
    out = {}
    for impl in impls_in(rows):
        ratios = [r["tflops"] / bf16[key] for r in rows
                  if r["impl"] == impl and r["dtype"] == "fp16" and r["n"] >= min_n
                  and (key := (impl, bool(r["causal"]), r["n"], r["mode"])) in bf16]
        if ratios:
            out[impl] = (min(ratios), max(ratios))
    return out


def print_live(rows, peak=PEAK_TFLOPS):
    """The rows of :func:`live_benchmark`."""
    for r in rows:
        shown = (f"{r['tflops']:7.1f} TFLOP/s {r['tflops'] / peak:6.1%} of {peak:.0f}"
                 if r.get("tflops") else r.get("error", "not measured"))
        mode = "fwd" if r["mode"] == "fwd" else "fwd + bwd"
        print(f"  {r['impl']:22s}{mode:11s}{shown}")


# --- the roofline ---------------------------------------------------------------------
def intensity(n, d, impl="fused", bytes_per_value=2) -> float:
    """FLOPs per byte of HBM traffic of one attention head (forward, no mask) in a simple model.

    ``fused``: Q, K, V read once and O written once (the ideal a flash kernel approaches);
    ``math``: also S written, read by the softmax, P written and read by P V (N×N each)."""
    flops = 4.0 * n * n * d
    traffic = 4 * n * d * bytes_per_value
    if impl == "math":
        traffic += 4 * n * n * bytes_per_value
    elif impl != "fused":
        raise ValueError(f"impl must be 'fused' or 'math', got {impl!r}")
    return flops / traffic


def attainable_tflops(intensity_flop_per_byte, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S):
    """The roofline: min(peak, bandwidth × intensity)."""
    return min(peak, bandwidth_tb_s * intensity_flop_per_byte)


def plot_roofline(series, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S):
    """The roofline with ``series`` placed on it: ``[(label, intensities, TFLOP/s, style)]``
    (FLOP/byte and TFLOP/s may be numbers or lists; the style dict is optional). TFLOP/s None:
    the model's ceiling at those intensities, drawn as open markers on the roof."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 4.4), layout="constrained")
    xs = np.logspace(0.5, 4.3, 200)
    ax.plot(xs, [attainable_tflops(x, peak, bandwidth_tb_s) for x in xs], color="black",
            lw=1.5, label=f"roof: min({peak:.0f} TFLOP/s, {bandwidth_tb_s:.2f} TB/s × "
                          "intensity)")
    ridge = peak / bandwidth_tb_s
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, 14), fontsize=9, color="gray",
                xytext=(4, 0), textcoords="offset points")
    for i, entry in enumerate(series):
        label, x, y = entry[:3]
        style = dict(color=f"C{i}", marker="*", ms=11)
        style.update(entry[3] if len(entry) > 3 else {})
        x = np.atleast_1d(np.asarray(x, dtype=float))
        line = "-" if len(x) > 1 else "none"
        if y is None:
            y = [attainable_tflops(v, peak, bandwidth_tb_s) for v in x]
            style.update(mfc="none", mew=1.5)
            line = "none"
        ax.plot(x, np.atleast_1d(y), ls=line, lw=1, label=label, **style)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP per byte of HBM]",
           ylabel="TFLOP/s", ylim=(10, peak * 1.6))
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2)
    return fig


# --- exp2: what folding log2(e) into the scale would change ----------------------------
def exp2_changes(rows=256, keys=256, d=64, seed=0) -> dict:
    """P̄ = exp(S·scale − m) as the kernels compute it, against the exp2 rewrite
    P̄ = 2^(S·(scale·log2 e) − m₂) with the running maximum kept in log2 units: the share of
    fp32 P̄ values that change, and of their bf16 roundings (the P̄ that multiplies V)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d, generator=gen).bfloat16().float()
    k = torch.randn(keys, d, generator=gen).bfloat16().float()
    s = q @ k.T                                   # bf16 products, fp32 sums (as the MMA)
    scale = 1.0 / math.sqrt(d)
    scaled = s * scale
    p_exp = torch.exp(scaled - scaled.amax(-1, keepdim=True))
    s2 = s * (scale * math.log2(math.e))          # one multiply folds the scale and log2 e
    p_exp2 = torch.exp2(s2 - s2.amax(-1, keepdim=True))
    differ = (p_exp.view(torch.int32) != p_exp2.view(torch.int32)).double().mean().item()
    low_a, low_b = p_exp.bfloat16(), p_exp2.bfloat16()
    flips = (low_a.view(torch.int16) != low_b.view(torch.int16)).double().mean().item()
    rel = ((p_exp2.double() - p_exp.double()).abs() / p_exp.double()).max().item()
    return dict(values=rows * keys, fp32_changed=differ, bf16_changed=flips,
                max_relative_change=rel)


# --- issue 15's targets ---------------------------------------------------------------
def targets(rows) -> list[dict]:
    """Per (dtype, causal, N): the ratios issue 15 sets targets for (None where a number is
    missing): book fwd / cuDNN fwd (≥ 0.8), book f+b / SDPA flash f+b (≥ 1.0), book f+b /
    cuDNN f+b (≥ 0.7), and the cross-tile rule's cost, 1 − cross / off (≤ 3%), fwd and f+b."""
    def get(impl, dtype, causal, n, mode):
        hit = [r["tflops"] for r in rows if r["impl"] == impl and r["dtype"] == dtype
               and bool(r["causal"]) == causal and r["n"] == n and r["mode"] == mode
               and r.get("tflops")]
        return hit[0] if hit else None

    def ratio(a, b):
        return None if (a is None or b is None) else a / b

    out = []
    keys = sorted({(r["dtype"], bool(r["causal"]), r["n"]) for r in rows},
                  key=lambda k: (k[0], not k[1], k[2]))
    for dtype, causal, n in keys:
        off = {m: get("book, rule off", dtype, causal, n, m) for m in ("fwd", "fwd+bwd")}
        cross = {m: get("book, cross-tile rule", dtype, causal, n, m) for m in off}
        cudnn = {m: get("SDPA cuDNN", dtype, causal, n, m) for m in off}
        flash = {m: get("SDPA flash", dtype, causal, n, m) for m in off}
        row = dict(dtype=dtype, causal=causal, n=n,
                   fwd_vs_cudnn=ratio(off["fwd"], cudnn["fwd"]),
                   fb_vs_flash=ratio(off["fwd+bwd"], flash["fwd+bwd"]),
                   fb_vs_cudnn=ratio(off["fwd+bwd"], cudnn["fwd+bwd"]))
        for m, key in (("fwd", "rule_cost_fwd"), ("fwd+bwd", "rule_cost_fb")):
            r = ratio(cross[m], off[m])
            row[key] = None if r is None else 1 - r
        out.append(row)
    return out


TARGET_TESTS = {"fwd_vs_cudnn": lambda x: x >= 0.8, "fb_vs_flash": lambda x: x >= 1.0,
                "fb_vs_cudnn": lambda x: x >= 0.7, "rule_cost_fwd": lambda x: x <= 0.03,
                "rule_cost_fb": lambda x: x <= 0.03}


def targets_met(target_rows) -> dict:
    """{target: (met, measured)} over every row where the target could be evaluated."""
    summary = {}
    for key, test in TARGET_TESTS.items():
        values = [r[key] for r in target_rows if r[key] is not None]
        summary[key] = (sum(bool(test(v)) for v in values), len(values))
    return summary


def print_targets(target_rows, dtype="bf16", causal=True):
    fmt = lambda x: "   —  " if x is None else f"{x:6.2f}"  # noqa: E731
    pct = lambda x: "   —  " if x is None else f"{x:6.1%}"  # noqa: E731
    print(f"{dtype}, {'causal' if causal else 'no mask'}: book rule off against")
    print(f"{'N':>8s}{'fwd/cuDNN':>11s}{'f+b/flash':>11s}{'f+b/cuDNN':>11s}"
          f"{'rule fwd':>10s}{'rule f+b':>10s}")
    for r in target_rows:
        if r["dtype"] == dtype and r["causal"] == causal:
            print(f"{r['n']:8d}{fmt(r['fwd_vs_cudnn']):>11s}{fmt(r['fb_vs_flash']):>11s}"
                  f"{fmt(r['fb_vs_cudnn']):>11s}{pct(r['rule_cost_fwd']):>10s}"
                  f"{pct(r['rule_cost_fb']):>10s}")


TARGET_TEXT = {"fwd_vs_cudnn": ("forward ≥ 0.8 × cuDNN", 0.8),
               "fb_vs_flash": ("fwd + bwd ≥ SDPA flash", 1.0),
               "fb_vs_cudnn": ("fwd + bwd ≥ 0.7 × cuDNN", 0.7),
               "rule_cost_fwd": ("cross-tile rule costs ≤ 3%, fwd", 0.03),
               "rule_cost_fb": ("cross-tile rule costs ≤ 3%, f+b", 0.03)}


def print_targets_met(target_rows):
    """In how many settings (dtype, mask, N) each target is met, and at which N it is not."""
    for key, (met, total) in targets_met(target_rows).items():
        missed = sorted({r["n"] for r in target_rows
                         if r[key] is not None and not TARGET_TESTS[key](r[key])})
        where = ("missed at N = " + ", ".join(f"{n // 1024}k" for n in missed)) if missed \
            else "met everywhere"
        print(f"  {TARGET_TEXT[key][0]:33s}{met:3d} of {total}   {where}")


def plot_targets(target_rows):
    """The three speed ratios of issue 15 against N, one line per setting, with the target."""
    import matplotlib.pyplot as plt
    keys = ["fwd_vs_cudnn", "fb_vs_flash", "fb_vs_cudnn"]
    titles = ["fwd ÷ cuDNN", "fwd+bwd ÷ SDPA flash", "fwd+bwd ÷ cuDNN"]
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH_IN, 3.3), sharey=True, layout="constrained")
    for ax, key, title in zip(axes, keys, titles):
        ns = sorted({r["n"] for r in target_rows})
        for dtype, causal in SETTINGS:
            pts = sorted((r["n"], r[key]) for r in target_rows if r["dtype"] == dtype
                         and r["causal"] == causal and r[key] is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3.5, lw=1.4,
                    color="tab:blue" if dtype == "bf16" else "tab:red",
                    ls="-" if causal else "--", label=_setting(dtype, causal))
        ax.axhline(TARGET_TEXT[key][1], color="black", lw=1.2, ls=":", label="target")
        _log2_axis(ax, ns)
        ax.set(title=title, xlabel="sequence length N")
    axes[0].set_ylabel("book's kernel ÷ the other")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=5)
    return fig


# --- a live benchmark (GPU only) -------------------------------------------------------
def live_benchmark(shape=(4, 16, 2048, 64), causal=True):
    """This machine's numbers: the book's kernel and SDPA flash, bf16, forward and forward +
    backward (do_bench medians). Returns rows, or None without a CUDA GPU."""
    import torch
    from ..env import interpreting
    if not torch.cuda.is_available() or interpreting():
        return None
    from . import perf
    tensors = perf.inputs(shape, torch.bfloat16, "cuda")
    rows = []
    for name in ("SDPA flash", "book, rule off", "book, cross-tile rule"):
        for mode in ("fwd", "fwd+bwd"):
            rows.append(perf.speed_row(name, perf.implementation(name, causal), tensors, shape,
                                       "bf16", causal, mode, small=False))
    return rows
