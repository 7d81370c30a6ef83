"""Compile every kernel variant of a measurement before anything is timed, in parallel worker
processes that fill Triton's on-disk cache: ``python -m kernels.gpu.precompile JOB`` runs one
group (a JSON dict of :func:`compile_jobs`), :func:`precompile` runs them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from kernels.attention import current_speedups, flash_attention, speedups
from kernels.attention.options import STABLE_OFF_ON
from kernels.env import REPO_ROOT
from kernels.timing import inputs, on_gpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
NO_GPU = "no CUDA GPU (Triton interpreter on the CPU)"


def grads(q, k, v, grad, **options):
    """O, dQ, dK, dV of the book's kernel (fresh leaves made from q, k, v)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, **options)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


def compile_jobs(ablation_steps):
    """Groups of kernel variants; each worker compiles (and tunes at a tiny size) one group.
    The tiny inputs have the same specialisation as the real ones (every size and stride a
    multiple of 16, the head count is not specialised), so the on-disk cache serves them.
    ``ablation_steps``: :data:`kernels.gpu.perf.ABLATION_STEPS`."""
    jobs = []
    for dtype_name in DTYPES:
        for causal in (True, False):
            for d in (64, 128):
                jobs.append(
                    dict(
                        dtype=dtype_name,
                        causal=causal,
                        d=d,
                        stable=list(STABLE_OFF_ON),
                        switches={},
                    )
                )
    jobs.append(
        dict(dtype="bf16", causal=None, d=64, stable=["off"], switches={}, checks=True)
    )  # checks() at N = 1000, 64×32 tiles
    # the ablation's other variants: each step that compiles other kernels than the defaults
    # (direct_launch only changes how a compiled kernel is started)

    def variant(switches):
        merged = {**current_speedups().as_dict(), **switches}
        return frozenset((k, v) for k, v in merged.items() if k != "direct_launch")

    compiled = {variant({})}  # the defaults, compiled above
    for _, switches in ablation_steps:
        if variant(switches) in compiled:
            continue
        compiled.add(variant(switches))
        for d in (64, 128):
            jobs.append(dict(dtype="bf16", causal=True, d=d, stable=["off"], switches=switches))
    return jobs


def run_job(job):
    """Compile (and tune at a tiny size) one group of variants (a dict of
    :func:`compile_jobs`)."""
    if job.get("checks"):
        for causal in (True, False):
            q, k, v, grad = inputs((2, 3, 1000, 64), torch.bfloat16, "cuda")
            for split in (True, False):
                with speedups(causal_split=split):
                    grads(q, k, v, grad, causal=causal, block_m=64, block_n=32)
        torch.cuda.synchronize()
        return
    q, k, v, grad = inputs((1, 2, 128, job["d"]), DTYPES[job["dtype"]], "cuda")
    with speedups(**job["switches"]):
        for stable in job["stable"]:
            grads(q, k, v, grad, causal=job["causal"], stable=stable)
    torch.cuda.synchronize()


def precompile(jobs, workers, budget, log=print):
    """Compile the kernel variants of ``jobs`` in ``workers`` parallel processes (Triton's
    on-disk cache is shared; ``budget.left()`` says how many seconds the run has left); returns
    a summary. Failures only cost time: the main run compiles on demand."""
    if not on_gpu():
        return dict(skipped=f"{NO_GPU}: nothing to compile")
    if workers < 1:
        return dict(skipped="--workers 0")
    start = time.time()
    pending = list(enumerate(jobs))
    running, outcome = [], {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    while pending or running:
        while pending and len(running) < workers:
            index, job = pending.pop(0)
            proc = subprocess.Popen(
                [sys.executable, "-m", "kernels.gpu.precompile", json.dumps(job)],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            running.append((index, proc))
        time.sleep(0.5)
        for index, proc in list(running):
            if proc.poll() is not None:
                text = proc.stdout.read()
                outcome[index] = dict(returncode=proc.returncode, tail=text[-400:])
                running.remove((index, proc))
        if budget.left() < 300 and running:  # never let compilation eat the run
            for index, proc in running:
                proc.kill()
                outcome[index] = dict(returncode=None, tail="killed: budget")
            running = []
            pending = []
    failed = [jobs[i] for i, o in outcome.items() if o["returncode"] != 0]
    log(
        f"precompiled {len(jobs)} variant groups in {time.time() - start:.0f} s with "
        f"{workers} workers; {len(failed)} failed"
    )
    for o in outcome.values():
        if o["returncode"] != 0:
            print(o["tail"], flush=True)
    return dict(groups=len(jobs), workers=workers, seconds=time.time() - start, failed=failed)


def main(argv=None):
    run_job(json.loads((sys.argv[1:] if argv is None else argv)[0]))


if __name__ == "__main__":
    main()
