"""The whole GPU check of the flash-attention kernels, in one run: ``python -m kernels.gpu.check``.

1. the unit tests, natively on the GPU (four pytest processes in the background);
2. the explicit bf16 rounding helper against the hardware cast and torch, on millions of values;
3. the explicit-rounding path against the native bf16 path on the same GPU, whole kernels,
   forward and backward (fraction of bit-identical elements, largest ulp difference), both
   against the fp64 golden output and next to torch SDPA;
4. relative errors against fp64 for every dtype and head dim (ours, SDPA, standard attention);
5. speed at three of chapter 10's shapes (GPT-2 size, long, wide heads), bf16, causal, every
   implementation of :mod:`kernels.gpu.perf` (its functions and its rows' format), forward and
   forward + backward, TFLOP/s;
6. peak memory against sequence length, the book's kernel (O(N)) against SDPA's math backend
   (O(N²)), by :func:`kernels.gpu.perf.memory`;
7. the first forward + backward at new sequence lengths of one tuned bucket, with autotuning by
   bucket on and off (:mod:`kernels.gpu.first_call`): ``gpu_check.json["first_call"]``.

Results go to ``<out>/gpu_check.json`` (with provenance, via :mod:`kernels.results`); its speed
and memory rows have the format of chapter 10's ``perf_speed.json`` and ``perf_memory.json``. A
summary table is printed last. ``--budget``
bounds the wall time: sections that would not fit are skipped and say so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from kernels import results, timing
from kernels.attention import flash_attention, tune_every_bucket
from kernels.attention.flash_fwd import flash_forward
from kernels.attention.options import DELTA_SOURCES
from kernels.attention.reference import attention_fp64, relative_error, standard_attention
from kernels.attention.registry import runner
from kernels.env import REPO_ROOT
from kernels.gpu import first_call, perf
from kernels.numerics.rounding import ulp_distance
from kernels.numerics.triton_rounding import round_tensor

TEST_FILES = [
    "tests/numerics/test_triton_rounding.py",
    "tests/attention/test_flash_fwd.py",
    "tests/attention/test_flash_bwd.py",
    "tests/attention/test_autograd.py",
    "tests/attention/test_custom_op.py",  # torch.compile: no graph break, same bits
    "tests/attention/test_call_path.py",  # q reaches the direct launch through four files
    "tests/attention/test_fixes.py",
    "tests/gpt2/test_gpt2.py",
]
COMMAND = "python -m kernels.gpu.check"
SPEED_SHAPES = [perf.SHAPES[0], perf.SHAPES[2], perf.SHAPES[3]]  # GPT-2's, long, wide heads
SPEED_SETTINGS = [("bf16", True)]
MEMORY_NS = (1024, 2048, 4096, 8192, 16384)
START = time.time()


def log(*parts):
    print(f"[{time.time() - START:6.1f}s]", *parts, flush=True)


# ---------------------------------------------------------------------------------------
def start_tests(out_dir: Path):
    """Launch one pytest process per test file; they run while the GPU sections below do."""
    procs = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for path in TEST_FILES:
        log_path = out_dir / f"pytest_{Path(path).stem}.txt"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            path,
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=",
            "--durations=5",
        ]
        handle = open(log_path, "w")
        procs.append(
            (
                path,
                subprocess.Popen(
                    cmd, cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env
                ),
                handle,
                log_path,
            )
        )
    return procs


def finish_tests(procs, timeout):
    summary = {}
    for path, proc, handle, log_path in procs:
        try:
            proc.wait(timeout=max(1, timeout - (time.time() - START)))
        except subprocess.TimeoutExpired:
            proc.kill()
        handle.close()
        text = log_path.read_text()
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["(no output)"]
        summary[path] = dict(returncode=proc.returncode, last_line=last[0])
        log(f"pytest {path}: rc={proc.returncode} {last[0]}")
        if proc.returncode != 0:
            print(text[-6000:], flush=True)
    return summary


# ---------------------------------------------------------------------------------------
def check_rounding_helper(n=16_000_000):
    """Explicit and native Triton rounding against torch's .to(torch.bfloat16) on the GPU."""
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device="cuda")
    normal = torch.randn(n, device="cuda") * torch.exp(torch.randn(n, device="cuda") * 8)
    halfway = (normal.to(torch.bfloat16).float().view(torch.int32) + 0x8000).view(torch.float32)
    out = {}
    for name, x in (
        ("random bit patterns", bits.view(torch.float32)),
        ("wide-range normals", normal),
        ("exact ties", halfway),
    ):
        want = x.to(torch.bfloat16).float()
        for explicit in (True, False):
            got = round_tensor(x, explicit=explicit)
            same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())
            key = f"{name} / {'explicit' if explicit else 'native cast'}"
            out[key] = dict(values=n, mismatches=int((~same).sum().item()))
            log(f"rounding {key}: {out[key]['mismatches']} mismatches of {n}")
    return out


def bit_agreement(a, b):
    """Fraction of bit-identical entries, max ulp distance (huge when a tiny value changes
    sign), and the largest |a − b| relative to its row's largest |b|: a flipped rounding of an
    intermediate (P̄, dS, the paper's accumulator) moves an output by about one ulp of the row's
    largest value, 2^-7 ≈ 0.0078 for bf16."""
    ulps = ulp_distance(a, b)
    scale = b.float().abs().amax(-1, keepdim=True)
    # rows that are exactly zero (dQ of the first causal row) compare by equality alone
    rel = torch.where(
        scale > 0, (a.float() - b.float()).abs() / scale, (a.float() != b.float()).float()
    )
    return dict(
        identical=float((ulps == 0).float().mean()),
        max_ulp=int(ulps.max()),
        frac_over_1ulp=float((ulps > 1).float().mean()),
        max_diff_rel_to_row=float(rel.max()),
        over_one_row_ulp=int(((ulps > 1) & (rel > 2.0**-7)).sum()),
    )


def explicit_vs_native(n=1024, batch=2, heads=4):
    """Whole kernels on one GPU: the explicit-rounding path against the native bf16 path."""
    from kernels.attention import emulator

    rows = []
    blocks = dict(block_m=64, block_n=32)
    for d in (64, 128):
        for causal in (False, True):
            for stable, numerics in (
                ("off", "fa2"),
                ("cross", "fa2"),
                ("tile", "fa2"),
                ("off", "paper"),
            ):
                if not causal and stable == "tile":
                    continue
                q, k, v = (
                    torch.randn(batch, heads, n, d, device="cuda").bfloat16() for _ in range(3)
                )
                ref = attention_fp64(q, k, v, causal)
                got = {}
                for explicit in (False, True):
                    got[explicit], _, _ = flash_forward(
                        q,
                        k,
                        v,
                        causal=causal,
                        stable=stable,
                        numerics=numerics,
                        explicit=explicit,
                        **blocks,
                    )
                emu = emulator.flash_forward(
                    q, k, v, causal=causal, stable=stable, numerics=numerics, block_n=32
                ).out
                row = dict(
                    pass_="fwd",
                    d=d,
                    causal=causal,
                    stable=stable,
                    numerics=numerics,
                    native_vs_explicit=bit_agreement(got[False], got[True]),
                    native_vs_emulator=bit_agreement(got[False], emu),
                    rel_err_native=relative_error(got[False], ref),
                    rel_err_explicit=relative_error(got[True], ref),
                    rel_err_sdpa_flash=relative_error(
                        runner("sdpa-flash", causal=causal)(q, k, v), ref
                    ),
                )
                rows.append(row)
                log(
                    f"fwd d={d} causal={causal} {stable}/{numerics}: native=explicit on "
                    f"{row['native_vs_explicit']['identical']:.5f} (max "
                    f"{row['native_vs_explicit']['max_ulp']} ulp, max |diff|/row max "
                    f"{row['native_vs_explicit']['max_diff_rel_to_row']:.2e}), native=emulator on "
                    f"{row['native_vs_emulator']['identical']:.5f}; rel err native "
                    f"{row['rel_err_native']:.3e} explicit {row['rel_err_explicit']:.3e} "
                    f"sdpa {row['rel_err_sdpa_flash']:.3e}"
                )
        # backward, causal: gradients from both paths, and against fp64 autograd
        q, k, v, grad_out = (
            torch.randn(batch, heads, n, d, device="cuda").bfloat16() for _ in range(4)
        )
        ref_in = [t.double().requires_grad_() for t in (q, k, v)]
        torch.autograd.backward(attention_fp64(*ref_in, True), grad_out.double())
        ref_grads = [t.grad for t in ref_in]
        sdpa_in = [t.clone().requires_grad_() for t in (q, k, v)]
        sdpa_grads = torch.autograd.grad(
            runner("sdpa-flash", causal=True)(*sdpa_in), sdpa_in, grad_out
        )
        for source in DELTA_SOURCES:
            grads = {}
            for explicit in (False, True):
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                out = flash_attention(
                    *leaves, causal=True, delta_source=source, explicit=explicit, **blocks
                )
                grads[explicit] = torch.autograd.grad(out, leaves, grad_out)
            row = dict(pass_="bwd", d=d, causal=True, delta_source=source)
            for i, name in enumerate(("dq", "dk", "dv")):
                row[name] = dict(
                    native_vs_explicit=bit_agreement(grads[False][i], grads[True][i]),
                    rel_err_native=relative_error(grads[False][i], ref_grads[i]),
                    rel_err_explicit=relative_error(grads[True][i], ref_grads[i]),
                    rel_err_sdpa_flash=relative_error(sdpa_grads[i], ref_grads[i]),
                )
            rows.append(row)
            log(
                f"bwd d={d} delta={source}: "
                + "; ".join(
                    f"{g} ident {row[g]['native_vs_explicit']['identical']:.4f} max |diff|/row "
                    f"{row[g]['native_vs_explicit']['max_diff_rel_to_row']:.1e}, err "
                    f"{row[g]['rel_err_native']:.2e}"
                    f" (sdpa {row[g]['rel_err_sdpa_flash']:.2e})"
                    for g in ("dq", "dk", "dv")
                )
            )
    return rows


def errors_per_dtype(n=512, batch=1, heads=4):
    """Relative errors against fp64, causal, every dtype × head dim."""
    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        for d in (16, 32, 64, 128):
            row = dict(dtype=str(dtype).replace("torch.", ""), d=d, n=n)
            try:
                q, k, v, grad_out = (
                    torch.randn(batch, heads, n, d, device="cuda").to(dtype) for _ in range(4)
                )
                ref_in = [t.double().requires_grad_() for t in (q, k, v)]
                ref = attention_fp64(*ref_in, True)
                ref_grads = torch.autograd.grad(ref, ref_in, grad_out.double())
                leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                # fixed tiles for bf16/fp16 (no autotuning per case); fp32/fp64 take their
                # default fixed tiles
                blocks = dict(block_m=64, block_n=32) if dtype.itemsize == 2 else {}
                out = flash_attention(*leaves, causal=True, **blocks)
                grads = torch.autograd.grad(out, leaves, grad_out)
                row.update(
                    ours=relative_error(out, ref),
                    standard=relative_error(standard_attention(q, k, v, True), ref),
                    sdpa=relative_error(runner("sdpa", causal=True)(q, k, v), ref),
                    ours_grads=[relative_error(g, r) for g, r in zip(grads, ref_grads)],
                )
                log(
                    f"errors {row['dtype']} d={d}: ours {row['ours']:.3e} standard "
                    f"{row['standard']:.3e} sdpa {row['sdpa']:.3e} grads "
                    + " ".join(f"{e:.2e}" for e in row["ours_grads"])
                )
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log(f"errors {row['dtype']} d={d}: FAILED {row['error']}")
            rows.append(row)
    return rows


def speed(budget):
    """:func:`kernels.gpu.perf.speed` at three of its shapes (GPT-2's, long, wide heads), bf16,
    causal: rows of ``perf_speed.json``'s table, in the check's report."""
    rows, skipped = [], []
    for _ in perf.speed(False, budget, rows, skipped, shapes=SPEED_SHAPES, settings=SPEED_SETTINGS):
        pass
    return dict(rows=rows, skipped_groups=skipped)


def memory(budget):
    """:func:`kernels.gpu.perf.memory` up to N = 16,384: rows of ``perf_memory.json``'s table."""
    return perf.memory(False, budget, ns=MEMORY_NS)


# ---------------------------------------------------------------------------------------
def summary_table(report, bench_rows, memory_rows):
    print("\n=== summary ===")
    for path, t in (report.get("pytest") or {}).items():
        print(f"  {path:28s} rc={t['returncode']}  {t['last_line']}")
    for key, r in (report.get("rounding") or {}).items():
        print(f"  rounding {key:45s} mismatches {r['mismatches']} / {r['values']}")
    for r in report.get("explicit_vs_native") or []:
        if r["pass_"] == "fwd":
            a = r["native_vs_explicit"]
            print(
                f"  fwd D{r['d']:3d} causal={r['causal']!s:5s} {r['stable']:5s} {r['numerics']:5s} "
                f"identical {a['identical']:.5f} max|diff|/row {a['max_diff_rel_to_row']:.1e} | "
                f"err ours "
                f"{r['rel_err_native']:.2e} sdpa {r['rel_err_sdpa_flash']:.2e}"
            )
    first = report.get("first_call") or {}
    for switch in ("on", "off"):
        shown = ", ".join(f"N{r['n']} {r['seconds']:.2f} s" for r in first.get(switch, []))
        if shown:
            print(f"  first fwd+bwd at a new N, tune_by_bucket {switch:3s}: {shown}")
    for r in bench_rows:
        if r.get("ms"):
            print(
                f"  speed N{r['n']:5d} D{r['d']:3d} {r['mode']:8s} {r['impl']:22s} "
                f"{r['tflops']:6.1f} TFLOP/s"
            )
    for r in memory_rows:
        book, math = r.get("book_peak_bytes"), r.get("math_peak_bytes")
        print(
            f"  memory {r['mode']:8s} N{r['n']:6d} book "
            f"{book / 2**20 if book else float('nan'):9.1f} MiB"
            f"  SDPA math {math / 2**20 if math else float('nan'):9.1f} MiB"
        )


@tune_every_bucket()  # each timed shape runs the configuration tuned for it
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(REPO_ROOT / "results")))
    parser.add_argument("--budget", type=float, default=520.0, help="seconds of wall time")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument(
        "--tests-only",
        action="store_true",
        help="only the unit tests; saved as gpu_check_tests.json",
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("kernels.gpu.check needs a CUDA GPU")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dirs = {out_dir, results.RESULTS_DIR}
    log(
        f"GPU {torch.cuda.get_device_name(0)} "
        f"sm_{''.join(map(str, torch.cuda.get_device_capability(0)))}"
        f", torch {torch.__version__}"
    )
    report = {}

    def save_all():
        for directory in dirs:
            results.save("gpu_check", report, COMMAND, directory=directory)

    budget = timing.Budget(args.budget, log, start=START)

    def section(name, fn, need, key):
        """Run one section and store its value as ``report[key]`` before the file is saved."""
        value = None
        if not budget.allows(name, need):
            report.setdefault("skipped", []).append(budget.skipped[-1])
        else:
            log(f"--- {name}")
            try:
                value = fn()
            except Exception:
                report.setdefault("failures", {})[name] = traceback.format_exc()[-3000:]
                log(f"FAILED {name}:\n{traceback.format_exc()}")
        report[key] = value
        save_all()

    if args.tests_only:
        outcome = finish_tests(start_tests(out_dir), args.budget)
        for directory in dirs:
            results.save("gpu_check_tests", outcome, COMMAND + " --tests-only", directory=directory)
        log("done")
        return
    procs = [] if args.skip_tests else start_tests(out_dir)
    section("rounding helper", check_rounding_helper, 20, "rounding")
    section("explicit vs native", explicit_vs_native, 60, "explicit_vs_native")
    section("errors per dtype", errors_per_dtype, 60, "errors_per_dtype")
    if procs:
        log("--- waiting for the unit tests")
        report["pytest"] = finish_tests(procs, args.budget - 200)
        save_all()
    section("first call", lambda: first_call.first_calls(log=log), 90, "first_call")
    section("speed", lambda: speed(budget), 90, "speed")
    section("memory", lambda: memory(budget), 20, "memory")
    summary_table(
        report, (report["speed"] or {}).get("rows", []), (report["memory"] or {}).get("rows", [])
    )
    log("done")


if __name__ == "__main__":
    main()
