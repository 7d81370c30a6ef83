"""Where one training step of the chapter's GPT-2 spends its time, and how many runs share a GPU.

    python -m kernels.gpt2.profile --out $OUT      # on a CUDA GPU: writes gpt2_step_profile.json

Three measurements, on the real-bf16 configuration of plan ``bf16_real`` (seed 0):

* **steps/s of each variant alone** (the failing path, its fp32-O control, δ from dP∘P), with the
  monitoring pass every 100 steps as in the plan's runs, synchronised before the clock stops;
* **one step under the torch profiler**: GPU kernel time per step against wall time per step (a
  step whose kernels take less time than the step is *host-bound*: Python and kernel launches),
  kernel launches per step and the kernels that take the most GPU time;
* **runs sharing one GPU**: k processes training at once, each its own run, and the steps/s
  that each of them and all of them together reach (k = 1, 2, 3, 4, 6).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .plans import plan

PLAN = "bf16_real"
STORED_LOG = "gpt2_step_profile_log.txt"  # results/: what the first run printed, header first


def stored_profile(directory=None) -> tuple[str, dict]:
    """The stored profile of one op-by-op step (``results/gpt2_step_profile_log.txt``): the
    GPU, versions and date from its header line, and the profiler's numbers (wall and GPU
    kernel milliseconds per step, kernel launches per step)."""
    from ..results import RESULTS_DIR

    lines = (Path(directory or RESULTS_DIR) / STORED_LOG).read_text().splitlines()
    where = lines[0].split(" on ", 1)[1].rstrip(".")
    numbers = next(json.loads(line) for line in lines if line.startswith("{"))
    return where, numbers


def trainer_for(
    variant: str = "U",
    seed: int = 0,
    monitor_every: int = 100,
    steps: int | None = None,
    cuda_graph: bool = False,
):
    """A Trainer of plan ``bf16_real``'s run of this variant and seed, writing to a temporary
    folder; ``cuda_graph`` replays its steps as a CUDA graph."""
    from .train import TrainConfig, Trainer

    name, opts = next((n, o) for n, o in plan(PLAN) if n == f"bf16-{variant}-s{seed}")
    opts = {
        **opts,
        "monitor_every": monitor_every,
        "checkpoint_every": 0,
        "progress": False,
        "out_dir": tempfile.mkdtemp(prefix="gpt2_profile_"),
        "name": name,
        "cuda_graph": cuda_graph,
    }
    if steps is not None:
        opts["steps"] = steps
    return Trainer(TrainConfig(**opts))


def _sync(trainer):
    import torch

    if trainer.device.type == "cuda":
        torch.cuda.synchronize(trainer.device)


def steps_per_s(trainer, steps: int, warmup: int = 20) -> float:
    """Train ``warmup`` steps, then time ``steps`` more (synchronised); steps per second."""
    for _ in range(warmup):
        trainer.train_step()
    _sync(trainer)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.train_step()
    _sync(trainer)
    return steps / (time.perf_counter() - start)


def profile_steps(trainer, steps: int = 5, top: int = 12) -> dict:
    """GPU kernel time, wall time and launches per step, and the costliest kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        trainer.train_step()
    _sync(trainer)
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.train_step()
        _sync(trainer)
    wall = (time.perf_counter() - start) / steps
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels) / steps
    by_name = {}
    for e in kernels:
        total, count = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (total + e.device_time, count + 1)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "wall_ms_per_step": 1e3 * wall,
        "gpu_kernel_ms_per_step": gpu_us / 1e3,
        "launches_per_step": len(kernels) / steps,
        "profiled_wall_is_inflated_by_profiler": True,
        "top_kernels": [
            {"name": n[:120], "ms_per_step": t / 1e3 / steps, "calls_per_step": c / steps}
            for n, (t, c) in ranked
        ],
    }


def worker(variant: str, seed: int, steps: int, fast: bool = False) -> None:
    """One process of the sharing test: prints its steps/s as JSON."""
    trainer = trainer_for(variant, seed, cuda_graph=fast)
    print(json.dumps({"steps_per_s": steps_per_s(trainer, steps)}))


def sharing(k: int, steps: int, fast: bool = False) -> dict:
    """k processes at once on this GPU (variants U, F, P and seeds 0, 1 in turn); ``fast``:
    each replays its steps as a CUDA graph."""
    runs = [("UFP"[i % 3], i // 3 % 2) for i in range(k)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernels.gpt2.profile",
                "--worker",
                v,
                str(s),
                str(steps),
                *(["--fast"] * fast),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for v, s in runs
    ]
    each = [json.loads(p.communicate()[0].strip().splitlines()[-1])["steps_per_s"] for p in procs]
    return {"processes": k, "steps_per_s_each": each, "steps_per_s_total": sum(each)}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="results")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--share", default="1,2,3,4,6", help="numbers of processes sharing the GPU")
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "SEED", "STEPS"))
    parser.add_argument("--fast", action="store_true", help="(worker) CUDA graph steps")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.fast)
    from ..results import provenance

    alone = {}
    for variant in "UFP":
        trainer = trainer_for(variant)
        alone[variant] = steps_per_s(trainer, args.steps)
        print(f"{variant} alone: {alone[variant]:.1f} steps/s", flush=True)
    prof = profile_steps(trainer_for("U"))
    print(json.dumps({k: v for k, v in prof.items() if k != "top_kernels"}), flush=True)
    for row in prof["top_kernels"]:
        print(f"  {row['ms_per_step']:7.3f} ms  x{row['calls_per_step']:5.1f}  {row['name'][:90]}")
    shared = []
    for k in (int(x) for x in args.share.split(",") if x):
        shared.append(sharing(k, args.steps))
        print(
            f"{k} processes: {shared[-1]['steps_per_s_total']:.1f} steps/s in all, "
            f"{min(shared[-1]['steps_per_s_each']):.1f} the slowest",
            flush=True,
        )
    command = f"python -m kernels.gpt2.profile --steps {args.steps} --share {args.share}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "provenance": provenance(command),
        "data": {"plan": PLAN, "alone_steps_per_s": alone, "profile_U": prof, "sharing": shared},
    }
    (out / "gpt2_step_profile.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
