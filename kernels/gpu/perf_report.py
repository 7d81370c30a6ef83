"""Tables, figures and models of chapter 10 ("What makes attention fast").

The measurements come from ``results/perf_*.json`` (written by ``python -m kernels.gpu.perf``
on a GPU); until those exist, the chapter falls back on ``results/flash_bench.json`` (an earlier
version of the book's kernel, fewer shapes). :func:`load` returns what there is and never
treats a CPU record (provenance without a GPU, e.g. from ``--small``) as a GPU measurement.

Also here: the roofline model (:func:`intensity`, :func:`plot_roofline`), the measurement of
what an ``exp2`` rewrite would change in P̄ (:func:`exp2_changes`), the targets of issue 15
(:func:`targets`) and the chapter's exercise checks.
"""
from __future__ import annotations

import math

import numpy as np

from .. import results

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
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.9), sharey=True, layout="constrained")
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
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.6), sharey=True, layout="constrained")
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
    axes[1].legend(loc="upper left", fontsize=9)
    return fig


def plot_memory(rows):
    """Peak allocated memory against N: the book's kernel and the math backend, log-log."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.8, 3.6), layout="constrained")
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
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.2), sharey=True, layout="constrained")
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        chosen = [r for r in rows if r["mode"] == mode]
        labels = [_host_label(r) for r in chosen]
        y = np.arange(len(chosen))
        ax.barh(y - 0.2, [r["host_us"] for r in chosen], 0.4, label="host (CPU) per call",
                color="tab:orange")
        ax.barh(y + 0.2, [r["kernel_us"] or 0 for r in chosen], 0.4,
                label="GPU kernels per call", color="tab:blue")
        ax.set_yticks(y, labels)
        ax.invert_yaxis()
        ax.set(xlabel="µs per call", title="forward" if mode == "fwd" else
               "forward + backward")
    axes[1].legend(loc="lower right", fontsize=9)
    return fig


def _host_label(row):
    if row["direct_launch"] is None:
        return row["impl"]
    return "book, direct launch" if row["direct_launch"] else "book, as before"


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


def plot_roofline(points, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S):
    """The roofline with ``points`` = [(label, FLOP/byte, TFLOP/s or None)] placed on it."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.8, 3.8), layout="constrained")
    xs = np.logspace(0, 4.3, 200)
    ax.plot(xs, [attainable_tflops(x, peak, bandwidth_tb_s) for x in xs], color="black", lw=1.5,
            label=f"roof: min({peak:.0f} TFLOP/s, {bandwidth_tb_s:.2f} TB/s × intensity)")
    ridge = peak / bandwidth_tb_s
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak * 0.05), fontsize=9, color="gray",
                xytext=(4, 0), textcoords="offset points")
    for i, (label, x, measured) in enumerate(points):
        y = attainable_tflops(x, peak, bandwidth_tb_s) if measured is None else measured
        ax.plot([x], [y], marker="o" if measured is None else "*", ms=8 if measured is None
                else 12, ls="none", color=f"C{i}", label=label)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity [FLOP per byte of HBM]",
           ylabel="TFLOP/s", ylim=(1, peak * 1.6))
    ax.legend(fontsize=9, loc="lower right")
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


# --- exercises ------------------------------------------------------------------------
def check_intensity(value):
    """Exercise: the fused model's FLOP per byte at N = 4,096, D = 128 (bf16, no mask)."""
    assert value is not None, "set intensity_4k to a number first"
    assert isinstance(value, (int, float)) and value > 0, "an intensity is a positive number"
    want = intensity(4096, 128)
    if abs(value - want) / want > 0.01:
        hint = ("count FLOPs as 4·N²·D per head, and bytes as four N×D bf16 tensors "
                "(Q, K and V read, O written)")
        if value > want * 1.5:
            raise AssertionError("too large: did you count each bf16 value as one byte? " + hint)
        raise AssertionError("not the fused model's intensity: " + hint)
    print("correct")


def check_ridge_n(value, peak=PEAK_TFLOPS, bandwidth_tb_s=HBM_TB_S):
    """Exercise: the sequence length above which the fused kernel is compute-bound."""
    assert value is not None, "set n_ridge to a number first"
    assert isinstance(value, (int, float)) and value > 0, "a sequence length is positive"
    ridge = peak / bandwidth_tb_s
    want = 2 * ridge            # intensity N/2 crosses the ridge at N = 2·ridge
    if abs(value - want) / want > 0.02:
        raise AssertionError("not where the fused model's intensity meets the ridge point: "
                             "write the intensity as a function of N and set it equal to "
                             "peak / bandwidth (mind TFLOP against TB)")
    print("correct")
