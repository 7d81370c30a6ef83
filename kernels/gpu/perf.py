"""Speed of the book's kernel against PyTorch's, in one run: ``python -m kernels.gpu.perf``.

What it measures (chapter 10 plots it), in this order, each section saved as soon as it ends:

1. ``perf_host.json``: one call at the GPT-2 shape (B8 H12 N1024 D64, bf16, causal), forward
   and forward + backward: the host (CPU) time to issue it, the wall time per call in a
   stream of calls, and the GPU time of its kernels (``torch.profiler``), for the book's kernel
   with and without direct launches and for SDPA flash; the peak speed of a dense bf16
   matmul and the memory bandwidth of a device copy (the roofline's two ceilings).
2. ``perf_memory.json``: peak allocated memory against N, the book's kernel against SDPA's
   math backend (which stores the N × N scores; measured only where it fits).
3. ``perf_speed.json``: TFLOP/s at the five shapes of the speed targets, bf16 and fp16, causal and
   not, forward and forward + backward, for SDPA flash, SDPA cuDNN, SDPA memory-efficient
   and the book's kernel with the offset rule off and with the cross-tile rule.
4. ``perf_ablation.json``: the book's kernel with its speed-ups switched on one at a time
   (``kernels.attention.speedups``).

FLOPs (:func:`kernels.timing.attention_flops`): the forward pass does 4·B·H·N²·D (two matmuls of
2·N²·D per head), half of that when causal; forward + backward counts 3.5 times the forward.
Every speed is also given as a fraction of :data:`PEAK_TFLOPS`, the H100 SXM datasheet's dense
bf16 peak (989 TFLOP/s; the run measures its own large matmul next to it, about 800). Records
written before that constant was corrected hold fractions of 790 TFLOP/s in ``peak_tflops``.

Timing (:mod:`kernels.timing`): ``triton.testing.do_bench`` (median, L2 flushed between runs)
with short warm-up and repetition times, so the whole run fits in about 8 minutes on one H100.
Before anything is timed, worker processes compile every kernel variant in parallel into
Triton's on-disk cache (``--workers``, :mod:`kernels.gpu.precompile`). ``--budget`` bounds the
wall time (:class:`kernels.timing.Budget`): a section or shape group that would not fit is
skipped, and the skip is recorded with its reason.

``--small``: tiny shapes, for a CPU test of this script's logic (Triton interpreter, wall-clock
timing; SDPA's CUDA backends, memory statistics and parallel compilation are skipped with a
recorded reason). Its files go to a fresh temporary folder unless ``--out`` is given, and
their provenance has no GPU: they are never GPU figures.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import traceback
from pathlib import Path

import torch

from kernels import results, timing
from kernels.attention import speedups, tune_every_bucket, tuned_entries
from kernels.attention.registry import get, group, label, runner
from kernels.gpu.precompile import DTYPES, NO_GPU, compile_jobs, grads, precompile
from kernels.gpu.records import PEAK_TFLOPS, SETTINGS  # PEAK: the datasheet dense bf16 peak
from kernels.timing import on_gpu

COMMAND = "python -m kernels.gpu.perf"
SHAPES = [
    (8, 12, 1024, 64),
    (16, 16, 2048, 64),
    (4, 16, 4096, 64),
    (2, 16, 8192, 128),
    (1, 32, 16384, 128),
]  # (B, H, N, D): the speed targets' shapes
SMALL_SHAPES = [(1, 2, 32, 16), (1, 1, 48, 32)]
GPT2 = (8, 12, 1024, 64)
# the rows' implementation label -> its name in kernels.attention.registry
IMPLS = {label(name): name for name in group("perf")}
BOOK = "triton"  # the book's kernel, offset rule off: the host, memory and ablation sections
TIMING = dict(warmup=10, rep=50, cpu=True)  # short do_bench runs; wall clock with --small
MEMORY_NS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
MEMORY_SHAPE = (1, 16, 64)  # (B, H, D)
# the ablation: speed-ups switched on one at a time, in this order (cumulative)
_BEFORE = dict(
    direct_launch=False,
    causal_split=False,
    wide_tuning=False,
    tma=False,
    exp2=False,
    max_first=False,
)
_STEPS = [
    ("as before", {}),
    ("+ direct launch", {"direct_launch": True}),
    ("+ causal split", {"causal_split": True}),
    ("+ wider tuning", {"wide_tuning": True}),
    ("+ TMA loads", {"tma": True}),
    ("+ exp2", {"exp2": True}),
    ("+ max first", {"max_first": True}),
]
ABLATION_STEPS = [
    (label, {**_BEFORE, **{k: v for _, on in _STEPS[: i + 1] for k, v in on.items()}})
    for i, (label, _) in enumerate(_STEPS)
]
ABLATION_SHAPES = [(8, 12, 1024, 64), (4, 16, 4096, 64), (2, 16, 8192, 128)]


START = time.time()


LOG_FILE: list = []  # the open perf_log.txt of a run, if any


def log(*parts):
    line = " ".join([f"[{time.time() - START:6.1f}s]", *map(str, parts)])
    print(line, flush=True)
    for f in LOG_FILE:
        f.write(line + "\n")
        f.flush()


def _show(row):
    shown = (
        f"{row['tflops']:6.1f} TFLOP/s {row['fraction_of_peak']:5.1%} ({row['ms']:.3f} ms)"
        if row.get("ms")
        else row.get("error", "skipped")
    )
    return (
        f"{row['dtype']} {'causal' if row['causal'] else 'full  '} "
        f"B{row['batch']} H{row['heads']} N{row['n']} D{row['d']} {row['mode']:7s} "
        f"{row['impl']:22s} {shown}"
    )


# --- 1. host time against kernel time -------------------------------------------------
def host_profile(small):
    shape = SMALL_SHAPES[0] if small else GPT2
    device = "cuda" if on_gpu() else "cpu"
    tensors = timing.inputs(shape, torch.bfloat16, device)
    calls = 3 if small else 50
    rows = []
    cases = [(BOOK, True), (BOOK, False)]
    if on_gpu():
        cases.append(("sdpa-flash", None))
    for impl, direct in cases:
        name = label(impl)
        for mode in ("fwd", "fwd+bwd"):
            switches = {} if direct is None else dict(direct_launch=direct)
            with speedups(**switches):
                call = timing.step(runner(impl, causal=True), *tensors, mode)
                for _ in range(3):
                    call()  # compile, autotune, plans
                host_us, wall_us = timing.host_and_wall_us(call, calls)
                host_us2, wall_us2 = timing.host_and_wall_us(call, calls)
                kernels_us, cpu_ops, kernel_us = timing.profile_kernels(call, 2 if small else 10)
            row = dict(
                impl=name,
                direct_launch=direct,
                mode=mode,
                shape=list(shape),
                host_us=min(host_us, host_us2),
                wall_us=min(wall_us, wall_us2),
                kernel_us=kernel_us if on_gpu() else None,
                kernels=kernels_us,
                cpu_ops_profiled=cpu_ops,
            )
            rows.append(row)
            shown = f"{kernel_us:7.1f} µs" if on_gpu() else "(no GPU)"
            log(
                f"host {name:16s} direct={direct!s:5s} {mode:7s} host {row['host_us']:8.1f} "
                f"µs  wall {row['wall_us']:8.1f} µs  kernels {shown}"
            )
    return rows


def ceilings(small):
    """Dense bf16 matmul TFLOP/s and device-copy bandwidth (GB/s), measured now."""
    if not on_gpu():
        return dict(skipped=f"{NO_GPU}: no GPU ceilings to measure")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timing.time_ms(lambda: a @ b, **TIMING)
    matmul = 2 * 8192**3 / ms * 1e-9
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = timing.time_ms(lambda: dst.copy_(src), **TIMING)
    bandwidth = 2 * src.numel() / ms * 1e-6  # read + write, GB/s
    log(f"ceilings: bf16 matmul 8192³ {matmul:.0f} TFLOP/s, device copy {bandwidth:.0f} GB/s")
    return dict(matmul_tflops=matmul, copy_gb_per_s=bandwidth, matmul_size=8192, copy_bytes=2**30)


# --- 0. the fast paths compute the same numbers -----------------------------------------
def checks(small):
    """Bit-for-bit: direct launches against Triton's usual path, the causal split against
    every tile masked, strided against contiguous inputs; and the error against fp64.
    Autotuned tiles (N = 1024) and fixed 64×32 tiles with ragged ends (N = 1000)."""
    from kernels.attention.reference import attention_fp64, relative_error

    device = "cuda" if on_gpu() else "cpu"
    cases = (
        [((1, 2, 40, 16), {}), ((1, 2, 40, 16), dict(block_m=16, block_n=32))]
        if small
        else [((2, 3, 1024, 64), {}), ((2, 3, 1000, 64), dict(block_m=64, block_n=32))]
    )
    rows = []
    for shape, tiles in cases:
        for causal in (True, False):
            q, k, v, grad = timing.inputs(shape, torch.bfloat16, device)
            opts = dict(causal=causal, **tiles)
            base = grads(q, k, v, grad, **opts)
            with speedups(direct_launch=False):
                usual = grads(q, k, v, grad, **opts)
            with speedups(causal_split=False):
                masked = grads(q, k, v, grad, **opts)
            strided_q = q.transpose(1, 2).contiguous().transpose(1, 2)
            strided = grads(strided_q, k, v, grad, **opts)
            same = lambda xs: all(torch.equal(a, b) for a, b in zip(base, xs))  # noqa
            ref = [t.double().requires_grad_() for t in (q, k, v)]
            out64 = attention_fp64(*ref, causal)
            grads64 = torch.autograd.grad(out64, ref, grad.double())
            errors = [relative_error(a, b) for a, b in zip(base, [out64, *grads64])]
            row = dict(
                shape=list(shape),
                causal=causal,
                tiles=tiles or "autotuned",
                direct_equals_usual=same(usual),
                split_equals_masked=same(masked),
                strided_equals_contiguous=same(strided),
                rel_err_out_dq_dk_dv=errors,
            )
            row["ok"] = (
                row["direct_equals_usual"]
                and row["split_equals_masked"]
                and row["strided_equals_contiguous"]
                and max(errors) < 2e-2
            )
            rows.append(row)
            log(
                f"check {shape} causal={causal} tiles={row['tiles']}: direct=usual "
                f"{row['direct_equals_usual']}, split=masked {row['split_equals_masked']}, "
                f"strided=contiguous {row['strided_equals_contiguous']}, errors "
                + " ".join(f"{e:.1e}" for e in errors)
            )
    return rows


# --- 2. memory ------------------------------------------------------------------------
def memory(small, budget, ns=MEMORY_NS):
    """Peak memory of the book's kernel and SDPA's math backend at each N of ``ns``."""
    if not on_gpu():
        return dict(rows=[], skipped=f"{NO_GPU}: peak memory needs CUDA's allocator statistics")
    batch, heads, d = MEMORY_SHAPE
    free = torch.cuda.mem_get_info()[0]
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        for n in ns:
            if not budget.allows(f"memory {mode} N={n}", 5):
                break
            tensors = timing.inputs((batch, heads, n, d), torch.bfloat16, "cuda")
            row = dict(n=n, batch=batch, heads=heads, d=d, mode=mode, causal=True)
            row["inputs_bytes"] = 3 * tensors[0].nbytes
            # the math backend holds several N×N fp32/bf16 tensors (scores, mask, softmax,
            # and in the backward their gradients): try it only where ~6 of them fit
            math_fits = 6 * batch * heads * n * n * 4 < 0.8 * free
            for name, attn in (
                ("book", runner(BOOK, causal=True)),
                ("math", runner("sdpa-math", causal=True)),
            ):
                if name == "math" and not math_fits:
                    row["math_peak_bytes"] = None
                    row["math_skipped"] = "the N×N tensors would not fit in GPU memory"
                    continue
                call = timing.step(attn, *tensors, mode)
                try:
                    call()
                    row[f"{name}_peak_bytes"] = timing.peak_memory_cuda(call)
                except torch.cuda.OutOfMemoryError:
                    row[f"{name}_peak_bytes"] = None
                    row[f"{name}_skipped"] = "out of GPU memory"
                torch.cuda.empty_cache()
            rows.append(row)
            fmt = lambda b: "—" if b is None else f"{b / 2**20:9.1f} MiB"  # noqa: E731
            peaks = ", ".join(f"{k} {fmt(row.get(f'{k}_peak_bytes'))}" for k in ("book", "math"))
            log(f"memory {mode:7s} N={n:6d}: {peaks}")
            del tensors
            torch.cuda.empty_cache()
    return dict(rows=rows)


# --- 3. speed -------------------------------------------------------------------------
def speed(small, budget, rows, skipped, reserve=0, shapes=None, settings=SETTINGS):
    """Every implementation at every shape (default :data:`SHAPES`) in every (dtype, causal)
    of ``settings``; ``rows`` grows as it goes and the caller saves after each setting.
    ``reserve``: seconds kept back for the ablation."""
    device = "cuda" if on_gpu() else "cpu"
    shapes = shapes or (SMALL_SHAPES if small else SHAPES)
    for dtype_name, causal in settings:
        for shape in shapes:
            group = f"speed {dtype_name} {'causal' if causal else 'full'} {shape}"
            if not budget.allows(group, (2 if small else 12) + reserve):
                skipped.append(group)
                continue
            tensors = timing.inputs(shape, DTYPES[dtype_name], device)
            for mode in ("fwd", "fwd+bwd"):
                for name, impl in IMPLS.items():
                    rows.append(_speed_row(name, impl, tensors, shape, dtype_name, causal, mode))
                    log(_show(rows[-1]))
            del tensors
            if on_gpu():
                torch.cuda.empty_cache()
        yield  # let the caller save after each (dtype, causal) block


def _speed_row(name, impl, tensors, shape, dtype_name, causal, mode) -> dict:
    if get(impl).kind == "sdpa" and not on_gpu():
        row = timing.row_of(name, shape, dtype_name, causal, mode)
        row.update(ms=None, tflops=None, fraction_of_peak=None)
        row["error"] = f"{NO_GPU}: SDPA's CUDA backends cannot run"
        return row
    attn = runner(impl, causal=causal)
    return timing.speed_row(
        name, attn, tensors, shape, dtype_name, causal, mode, peak=PEAK_TFLOPS, **TIMING
    )


# --- 4. ablation ----------------------------------------------------------------------
def ablation(small, budget):
    device = "cuda" if on_gpu() else "cpu"
    shapes = SMALL_SHAPES[:1] if small else ABLATION_SHAPES
    rows = []
    for shape in shapes:
        if not budget.allows(f"ablation {shape}", 2 if small else 15):
            break
        tensors = timing.inputs(shape, torch.bfloat16, device)
        for step_label, switches in ABLATION_STEPS:
            with speedups(**switches):
                for mode in ("fwd", "fwd+bwd"):
                    row = timing.speed_row(
                        label(BOOK),
                        runner(BOOK, causal=True),
                        tensors,
                        shape,
                        "bf16",
                        True,
                        mode,
                        peak=PEAK_TFLOPS,
                        **TIMING,
                    )
                    row.update(step=step_label, switches=switches)
                    rows.append(row)
                    log(f"ablation {step_label:16s} " + _show(row))
        del tensors
    return rows


# --- main -----------------------------------------------------------------------------
@tune_every_bucket()  # each timed shape runs the configuration tuned for it
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        default=None,
        help="folder for perf_*.json (default: results/, or a fresh temporary folder with --small)",
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU test)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds of wall time")
    parser.add_argument(
        "--workers",
        type=int,
        default=max(1, min(12, (os.cpu_count() or 2) - 2)),
        help="parallel compile processes (0: compile on demand)",
    )
    args = parser.parse_args(argv)
    if not args.small and not on_gpu():
        raise SystemExit(
            "kernels.gpu.perf needs a CUDA GPU (or --small for a CPU test of its logic)"
        )
    if args.out:
        out_dir = Path(args.out)
    elif args.small:
        out_dir = Path(tempfile.mkdtemp(prefix="perf_small_"))
    else:
        out_dir = results.RESULTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    LOG_FILE[:] = [open(out_dir / "perf_log.txt", "w")]  # what it prints, kept beside the data
    command = COMMAND + (" --small" if args.small else "")
    budget = timing.Budget(args.budget, log)
    where = (
        f"GPU {torch.cuda.get_device_name(0)}"
        if on_gpu()
        else "CPU, Triton interpreter (timings are NOT GPU figures)"
    )
    log(f"{where}, torch {torch.__version__}; writing to {out_dir}")
    meta = dict(
        peak_tflops=PEAK_TFLOPS,
        flops="forward 4·B·H·N²·D (two matmuls of 2·N²·D "
        "per head), half when causal; forward+backward 3.5 × forward",
        timing="triton.testing.do_bench median (warmup 10 ms, rep 50 ms), L2 flushed"
        if on_gpu()
        else "wall clock, median of 2 calls (CPU)",
        small=args.small,
    )

    def save(name, data):
        results.save(
            name,
            {**meta, **data, "budget_skipped": list(budget.skipped), "elapsed_s": budget.elapsed()},
            command,
            directory=out_dir,
        )

    sections = {}
    try:
        sections["compile"] = precompile(
            compile_jobs(ABLATION_STEPS), 0 if args.small else args.workers, budget, log
        )
        host = dict(compile=sections["compile"])
        host["checks"] = checks(args.small)
        host["all_checks_pass"] = all(row["ok"] for row in host["checks"])
        save("perf_host", host)
        host["ceilings"] = ceilings(args.small)
        host["rows"] = host_profile(args.small)
        save("perf_host", host)
        if budget.allows("memory", 30 if not args.small else 1):
            save("perf_memory", memory(args.small, budget))
        rows, skipped = [], []
        for _ in speed(args.small, budget, rows, skipped, reserve=0 if args.small else 45):
            save("perf_speed", dict(rows=rows, skipped_groups=skipped))
        save("perf_speed", dict(rows=rows, skipped_groups=skipped))
        # what the autotuner chose for every bucket it tuned: the stored picks a later
        # process on the same GPU model starts from (the "stored_tuning" speed-up)
        save("perf_tuning", dict(entries=tuned_entries()))
        save(
            "perf_ablation",
            dict(steps=[label for label, _ in ABLATION_STEPS], rows=ablation(args.small, budget)),
        )
        log(f"done in {budget.elapsed():.0f} s; files in {out_dir}")
    except Exception:
        log("FAILED:\n" + traceback.format_exc())
        save("perf_failure", dict(traceback=traceback.format_exc()[-4000:]))
        raise
    finally:
        LOG_FILE.pop().close()
    return out_dir


if __name__ == "__main__":
    main()
