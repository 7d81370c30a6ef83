"""Run many small GPT-2 trainings at once and pack their logs into one JSON file.

Small models do not fill an H100, so a search runs each configuration as its own process, all at
the same time, every one replaying the same recorded batch order. A *plan* is a named list of runs
(:mod:`.plans`), so the command that made a result file is short and exact:

    python -m kernels.gpt2.search --plan probe --minutes 8 --out results_dir

Each run is handed to its process as one file, ``<work>/<name>.config.json``: its
:class:`kernels.gpt2.config.TrainConfig`, checked before any process starts (``python -m
kernels.gpt2.train --config``). With several GPUs visible the runs are dealt out round-robin, one
process per run
(``CUDA_VISIBLE_DEVICES`` set per process), or to the GPU a run names (``gpu_slot``).

Resumable plans (runs with ``checkpoint_every``) are split into calls: every call trains each run
for ``--minutes``, leaves a checkpoint in ``--work`` and writes ``gpt2_<plan>.json`` (every log
so far) to ``--out``; the *same command again* resumes each unfinished run where it stopped,
bit-identically, and skips runs that finished, exploded or went NaN. ``--work`` must survive
between calls: one device machine keeps its disk while it is held (the checkpoints, about 40 MB per
run
of this model, are too large to carry between machines). With ``--minutes 8`` a call ends within
8 min 40 s, inside a 10-minute device-call limit. ``--only`` picks runs by name.

The GPU plans of the GPT-2 chapter, one command each (repeat the command until every run has
ended; each line says how many calls that takes at the speeds measured on H200s):

    # real bf16 on one GPU, the fast step (fused kernels + CUDA graphs, checked first by
    # python -m kernels.gpt2.fast_step_check, which writes fast.env): one H100 trains ~82 steps/s
    # in all, alone or shared, so a 30-minute lease (checkpoints stay on its disk, not
    # beyond it) takes ~130,000 steps. Done: U, F, P and Z in seed 0 to 80,000 steps (one
    # lease each, two calls: 8.0 then 8.6 minutes), U in seed 1 (exploded at step 53,110),
    # F, P and Z in seed 1 past 53,110. Each seed-0 run was, for example:
    python -m kernels.gpt2.search --plan bf16_real --only Z-s0 --fast --minutes 8.0 \
        --work /tmp/gpt2_real --out $OUT     # then the same with --minutes 8.6
    # real bf16, U and F, seeds 1 and 2, until U explodes or 120,000 steps (one GPU per run:
    # ~68 steps/s, so about 4 calls of 8 minutes on a 4-GPU machine)
    python -m kernels.gpt2.search --plan bf16_long --minutes 8 --work /tmp/gpt2_search --out $OUT
    # the same on a 2-GPU machine, one seed at a time
    python -m kernels.gpt2.search --plan bf16_long --only s1 --minutes 8 \\
        --work /tmp/gpt2_search --out $OUT
    # Ō with 5 and 6 mantissa bits, three seeds of U and F on seed 1 (20,000 steps; 8 runs,
    # two per GPU on 4 GPUs: about 2 calls)
    python -m kernels.gpt2.search --plan amp_bits --minutes 8 --work /tmp/gpt2_search --out $OUT
    # bias or size: U, F and the five δ controls at 4 bits, seeds 1-3 (21 runs; U fails in
    # ~6,000 steps; on 4 GPUs about 3 calls; --only s1 for one seed)
    python -m kernels.gpt2.search --plan controls --minutes 8 --work /tmp/gpt2_search --out $OUT
    # the bias chapters' fixes in training at 4 bits: β capped, ℓ clamped, both (9 runs)
    python -m kernels.gpt2.search --plan amp_fixes --minutes 8 --work /tmp/gpt2_search --out $OUT

    # the testbed search (20,000-step screens of U and F, the paper's schedule; 10 runs on two
    # GPUs, three calls of 8.0, 8.0 and 6.5 minutes) and its arms on the configuration whose
    # control stayed healthy (lr 5e-4): 80,000 steps, one run per GPU (~82 steps/s alone, so
    # two runs per 30-minute lease on a 2-GPU machine, in two calls resumed from checkpoints)
    python -m kernels.gpt2.search --plan screen --fast --minutes 8 --work /tmp/gpt2_search \
        --out $OUT
    python -m kernels.gpt2.search --plan testbed --only tb-U-s1,tb-F-s1 --fast --minutes 8 \
        --work /tmp/gpt2_search --out $OUT
    # W (the book's Triton kernel) and A (SDPA flash) are faster: two per GPU trained 90-102
    # and 97 steps/s each on 4 H100s (results/gpt2_testbed.json), so eight of them reach
    # 80,000 steps in two calls of 8 minutes on a 4-GPU machine
    python -m kernels.gpt2.search --plan testbed --only tb-W-s1,tb-A-s1,tb-W-s2,tb-A-s2 --fast \
        --minutes 8 --work /tmp/gpt2_search --out $OUT
    # U, F, P, Z and S (the paper's emulated attention) train ~93 steps/s alone on an H200
    # (results/gpt2_testbed_F.json) and about half that two to a GPU: one run per GPU, two calls
    # (8.4 minutes, then the rest). A machine idle for 30 s goes back with its disk, and the
    # second call then starts again from step 0 (it happened in five leases, even with the next
    # call issued at once), so the first call ends with `python -m kernels.gpt2.handoff pack`
    # and the second resumes on a fresh machine from the carried checkpoint
    # (kernels/gpt2/handoff.py says how). Done so far: W and U in seeds 1-4 (all exploded), A in
    # seeds 1-4 to 80,000 (two per GPU on 2 H200s, 105 steps/s each: 8.4 then 4.8 minutes), F in
    # seeds 1-4 to 80,000 (4×H200: 8.4 then 6.6 + 8.0 minutes), V in seeds 1-2 to 80,000, P in
    # seeds 1-2 to 80,000 (one H200: 8.4 then 7.0 minutes; seed 2 resumed on a fresh machine
    # from its carried checkpoint, and trained from step 0 five more times, 40,184-48,491 steps,
    # none exploded), Z in seed 1 to 80,000 (one H200: 8.4, 7.0, then 1.0 minutes at 85
    # steps/s), Z in seed 2 to 80,000 (one H200: 8.3 minutes, then 7.2 on a fresh machine from
    # the carried checkpoint, 87 steps/s), S in seeds 1-2 (both NaN), V in seed 3 to 54,147
    # (one H200, 5.0 minutes alone at 180 steps/s; its checkpoint was packed). Still to run: V
    # in seed 3 to 80,000 (one call, resumed from that checkpoint) and V in seed 4 (two calls).

Each call writes ``$OUT/gpt2_<plan>.json`` (well under 16 MB); copy it to ``results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .plans import PLANS, SMALL, plan, variant_options


def run_inline(
    base: dict,
    variants: str = "UFS",
    seed: int = 0,
    corpus=None,
    out_dir=None,
    progress: bool = True,
    obits: int = 7,
    prefix: str = "cpu",
) -> dict:
    """Train the variants of one configuration one after another in this process (same seed, same
    batch order) and return {name: log record} like a stored search. For small CPU demos.
    ``out_dir`` None: a fresh temporary folder (two notebooks running at once do not collide)."""
    import tempfile

    from .data import load_corpus
    from .train import TrainConfig, Trainer

    out_dir = out_dir or tempfile.mkdtemp(prefix="gpt2_inline_")
    corpus = corpus or load_corpus("stdlib", max_bytes=base.get("max_bytes") or None)
    records = {}
    for variant in variants:
        name = f"{prefix}-{variant}-s{seed}"
        cfg = TrainConfig(
            **{
                **base,
                **variant_options(variant, obits, seed),
                "name": name,
                "seed": seed,
                "data_seed": seed,
                "out_dir": str(out_dir),
                "progress": progress,
            }
        )
        Trainer(cfg, corpus).run()
        records[name] = json.loads((Path(out_dir) / f"{name}.json").read_text())
    return records


def run_config(name: str, opts: dict, work: Path, minutes: float, resume: bool):
    """The one options object of a plan run in ``work``: its plan options plus where it logs, its
    time limit, its batch order and whether it resumes (checked here, before any process
    starts)."""
    from .config import TrainConfig

    return TrainConfig(
        **{
            "name": name,
            "out_dir": str(work),
            "max_minutes": float(f"{minutes:.3f}"),
            "progress": False,
            "stop_after_explosion": 400,
            "batch_order": str(_order_path(work, opts)),
            "resume": resume,
            **opts,
        }
    )


def _order_path(work: Path, opts: dict) -> Path:
    return work / f"order-b{opts['batch_size']}-n{opts['block_size']}-d{opts['data_seed']}.npy"


def _record_orders(runs, work: Path) -> None:
    """Draw each batch order once, before any run starts, long enough for every run that uses it."""
    from .data import BatchOrder, load_corpus

    need = {}
    for _, opts in runs:
        key = (opts.get("max_bytes", 0), opts["batch_size"], opts["block_size"], opts["data_seed"])
        need[key] = max(need.get(key, 0), opts["steps"])
    for (max_bytes, batch, block, seed), steps in need.items():
        corpus = load_corpus("stdlib", max_bytes=max_bytes or None)
        order = BatchOrder.draw(len(corpus.train), steps, batch, block, seed)
        order.save(_order_path(work, {"batch_size": batch, "block_size": block, "data_seed": seed}))


def _visible_gpus() -> list[str]:
    """CUDA device ids to deal runs out to ([] on a machine without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in listed.split(",") if d.strip()] if listed else []
    return ids or [str(i) for i in range(torch.cuda.device_count())]


def assign_gpus(runs, gpus: list[str]) -> list[tuple[str, dict, str | None]]:
    """(name, options, GPU id) per run: round-robin over ``gpus``, or the run's own ``gpu_slot``
    (an index into ``gpus``, removed from the options). GPU id is None when there is no GPU."""
    out = []
    for i, (name, opts) in enumerate(runs):
        opts = dict(opts)
        slot = opts.pop("gpu_slot", i)
        out.append((name, opts, gpus[slot % len(gpus)] if gpus else None))
    return out


FINAL = ("finished", "non-finite", "stopped: loss exploded")


def _previous(work: Path, name: str):
    """(record, final?) of a run an earlier call left in ``work``; (None, False) if none."""
    path = work / f"{name}.json"
    if not path.exists():
        return None, False
    rec = json.loads(path.read_text())
    return rec, rec["summary"]["status"].startswith(FINAL)


def launch(runs, minutes: float, work: Path, extra_env=None) -> dict:
    """Start every run as its own process, wait up to ``minutes``, return {name: log record}.
    A resumable run (``checkpoint_every``) continues from its checkpoint in ``work``; one that
    already ended there is not started again."""
    work.mkdir(parents=True, exist_ok=True)
    _record_orders(runs, work)
    procs, records = {}, {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    for name, opts, gpu in assign_gpus(runs, _visible_gpus()):
        resumable = bool(opts.get("checkpoint_every"))
        if resumable:
            rec, final = _previous(work, name)
            if final:
                records[name] = {
                    **rec,
                    "returncode": None,
                    "stdout_tail": "ended in an earlier call",
                }
                continue
        resume = resumable and (work / f"{name}.ckpt.pt").exists()
        config = work / f"{name}.config.json"
        run_config(name, opts, work, minutes, resume).write_json(config)
        argv = [sys.executable, "-m", "kernels.gpt2.train", "--config", str(config)]
        log = open(work / f"{name}.stdout", "a" if resume else "w")
        run_env = env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu}
        procs[name] = (
            subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=run_env),
            log,
        )
    deadline = time.time() + 60 * minutes + 90
    while time.time() < deadline and any(p.poll() is None for p, _ in procs.values()):
        time.sleep(5)
    for name, (proc, log) in procs.items():
        if proc.poll() is None:
            proc.kill()
        log.close()
        path = work / f"{name}.json"
        rec = json.loads(path.read_text()) if path.exists() else {"summary": {"status": "no log"}}
        rec["returncode"] = proc.returncode
        rec["stdout_tail"] = (work / f"{name}.stdout").read_text()[-1500:]
        records[name] = rec
    return {name: records[name] for name, _ in runs if name in records}


def select(runs, only: str = ""):
    """The runs whose names contain any of the comma-separated parts of ``only`` (all if empty)."""
    parts = [p for p in only.split(",") if p]
    picked = [(n, o) for n, o in runs if not parts or any(p in n for p in parts)]
    if not picked:
        raise ValueError(f"--only {only!r} matches no run of the plan")
    return picked


def ddp_check(out: Path, work: Path, steps: int = 300) -> None:
    """Train the same run with torchrun on 2 GPUs and in one process on one GPU (same global
    batches),
    then the SDPA baseline alone: checks DDP and measures single-process speed. Writes
    ``gpt2_ddp_log.txt`` (everything printed) and ``gpt2_ddp.json`` (the three logs, with
    provenance)."""
    from ..results import provenance
    from .config import TrainConfig

    common = dict(SMALL, lr=1e-3, warmup=50, steps=steps, monitor_every=100, log_every=10)
    common.update(progress=False, out_dir=str(work))
    launchers = {
        "ddp2-paper": ["torchrun", "--nproc_per_node=2"],
        "single-paper": [sys.executable],
        "single-sdpa": [sys.executable],
    }
    work.mkdir(parents=True, exist_ok=True)
    commands = {}
    for name, launcher in launchers.items():
        config = work / f"{name}.config.json"
        TrainConfig(name=name, attn=name.split("-")[1], **common).write_json(config)
        commands[name] = [*launcher, "-m", "kernels.gpt2.train", "--config", str(config)]
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    with open(out / "gpt2_ddp_log.txt", "w") as log:
        log.write(json.dumps(provenance("python -m kernels.gpt2.search --plan ddp")) + "\n")
        for name, cmd in commands.items():
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            log.write(f"[exit code {done.returncode}]\n")
            path = work / f"{name}.json"
            runs[name] = (
                json.loads(path.read_text()) if path.exists() else {"summary": {"status": "no log"}}
            )
    record = {
        "provenance": provenance("python -m kernels.gpt2.search --plan ddp"),
        "data": {"runs": runs},
    }
    with open(out / "gpt2_ddp.json", "w") as f:
        json.dump(record, f, separators=(",", ":"))
    a, b = runs["ddp2-paper"].get("history", {}), runs["single-paper"].get("history", {})
    if a and b:
        diff = max(abs(x - y) for x, y in zip(a["loss"], b["loss"]))
        print(f"DDP (2 GPUs) vs one GPU, same global batches: max |loss difference| = {diff:.4f}")
    for name, rec in runs.items():
        print(name, rec["summary"])


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--plan", required=True, choices=(*PLANS, "ddp"))
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--out", default="results")
    parser.add_argument("--work", default="/tmp/gpt2_search")
    parser.add_argument("--only", default="", help="comma-separated parts of run names to run")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="replay each step as a CUDA graph (kernels.gpt2.graphed_step; same numbers)",
    )
    args = parser.parse_args(argv)
    from ..results import provenance

    if args.plan == "ddp":
        return ddp_check(Path(args.out), Path(args.work) / "ddp")
    runs = select(plan(args.plan), args.only)
    if args.fast:
        runs = [(name, {**opts, "cuda_graph": True}) for name, opts in runs]
    started = time.time()
    records = launch(runs, args.minutes, Path(args.work) / args.plan)
    only = (f" --only {args.only}" if args.only else "") + (" --fast" if args.fast else "")
    command = f"python -m kernels.gpt2.search --plan {args.plan}{only} --minutes {args.minutes}"
    packed = {
        "provenance": provenance(command),
        "data": {
            "plan": args.plan,
            "wall_s": time.time() - started,
            "concurrent_processes": len(runs),
            "gpus": max(1, len(_visible_gpus())),
            "runs": records,
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_" + args.only.replace(",", "_") if args.only else ""
    with open(out / f"gpt2_{args.plan}{suffix}.json", "w") as f:
        json.dump(packed, f, separators=(",", ":"))
    for name, rec in records.items():
        s = rec["summary"]
        print(
            f"{name:28s} {s.get('status', '')[:40]:40s} steps {s.get('steps_done')} "
            f"min {s.get('min_loss')} final {s.get('final_loss')} boom {s.get('explosion_step')}"
        )


if __name__ == "__main__":
    main()
