"""Run many small GPT-2 trainings at once on one GPU and pack their logs into one JSON file.

Small models do not fill an H100, so a search runs each configuration as its own process, all at
the same time, every one replaying the same recorded batch order. A *plan* is a named list of runs
(below), so the command that made a result file is short and exact:

    python -m kernels.gpt2.search --plan probe --minutes 8 --out results_dir

Each run is ``(name, {train option: value})``; the variants of one configuration differ only in
the attention spec: ``U`` = the paper's bf16 flash attention (δ from the bf16 O, the failing path),
``F`` = the same with δ from O recomputed in fp32 (the paper's stable control), ``S`` = the
stabilised forward of Algorithm 3 (β = 2, ties detected across the whole row), ``P`` = δ from
rowsum(dP ∘ P), ``A`` = torch SDPA everywhere, ``R`` = ``U`` with Ō rounded stochastically
(only with ``obits`` < 7), ``T`` = ``U`` in key tiles of 64 instead of untiled, ``L`` = ``U`` in
layer 0 only, ``F`` elsewhere (the paper's "only layer 2 matters": in our runs ‖W_Q‖ grows
first in layer 0, measured in the ``amplify`` plan).

``obits`` (the amplifier) holds Ō in a float with bf16's exponent and fewer mantissa bits than
bf16's 7, in every paper-path variant of a run, controls included: the rounding of Ō is magnified
2^(7 − obits) times and nothing else changes.

With several GPUs visible the runs are dealt out round-robin, one process per run
(``CUDA_VISIBLE_DEVICES`` set per process).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "U": "paper:delta=o",
    "F": "paper:delta=o_fp32",
    "S": "paper:delta=o,stable=cross,beta=2",
    "P": "paper:delta=dp",
    "A": "sdpa",
    "R": "paper:delta=o,oround=sr",
    "T": "paper:delta=o,block=64",
    "L": "paper:delta=o_fp32",       # + layer 1 switched to U, see _variant_opts
}
LADDER_LAYER = 0                     # the layer ``L`` leaves on the failing path (0-based)

SMALL = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=64, warmup=200)
# the amplifier search: the paper's peak lr 1e-3, cosine to 1e-4 over 20k steps
AMP = dict(SMALL, lr=1e-3, min_lr=1e-4, steps=20000)


def _with_obits(spec: str, obits: int) -> str:
    return spec if obits == 7 or not spec.startswith("paper") else f"{spec},obits={obits}"


def _variant_opts(variant: str, obits: int = 7) -> dict:
    """The training options that make one variant: its attention spec (and layer override)."""
    if variant == "R" and obits == 7:
        raise ValueError("variant R (stochastic rounding of Ō) needs obits < 7")
    opts = {"attn": _with_obits(VARIANTS[variant], obits)}
    if variant == "L":
        opts["layer_attn"] = f"{LADDER_LAYER}={_with_obits(VARIANTS['U'], obits)}"
    return opts


def _runs(prefix, base, variants, seeds, obits=7, gpu_slot=None, **extra):
    """One run per seed and variant; ``gpu_slot`` pins them all to one GPU (see :func:`assign_gpus`)."""
    pin = {} if gpu_slot is None else {"gpu_slot": gpu_slot}
    out = []
    for seed in seeds:
        for v in variants:
            opts = {**base, **extra, **_variant_opts(v, obits), "seed": seed, "data_seed": seed, **pin}
            out.append((f"{prefix}-{v}-s{seed}", opts))
    return out


def plan(name: str) -> list[tuple[str, dict]]:
    """The named lists of runs used for the chapter's results."""
    if name == "tiny":     # CPU smoke test of the runner itself
        base = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=8, warmup=5, steps=20,
                    monitor_every=10, max_bytes=1_000_000, autocast="off")
        return _runs("tiny", base, "UF", [0])
    if name == "probe":    # first search: lr, batch, width and qk-norm, one seed, U vs F (vs S)
        runs = _runs("a-lr1e-3", SMALL, "UFSA", [0], lr=1e-3, steps=6000)
        runs += _runs("b-lr2e-3", SMALL, "UF", [0], lr=2e-3, steps=6000)
        runs += _runs("c-w512h8-lr6e-4", {**SMALL, "n_layer": 6, "n_head": 8, "n_embd": 512}, "UF", [0],
                      lr=6e-4, steps=3000)
        runs += _runs("d-b256-lr1e-3", {**SMALL, "batch_size": 256}, "UF", [0], lr=1e-3, steps=3000)
        runs += _runs("e-qknorm-lr2e-3", {**SMALL, "qk_norm": True}, "UF", [0], lr=2e-3, steps=6000)
        return runs
    if name == "probe2":   # second search: constant (undecayed) high lr, with and without qk-norm
        const = lambda lr: dict(lr=lr, min_lr=lr, steps=6000)  # noqa: E731  (min_lr = lr: no decay)
        runs = _runs("f-const3e-3", SMALL, "UFS", [0], **const(3e-3))
        runs += _runs("g-qknorm-const3e-3", {**SMALL, "qk_norm": True}, "UF", [0], **const(3e-3))
        runs += _runs("h-qknorm-const6e-3", {**SMALL, "qk_norm": True}, "UF", [0], **const(6e-3))
        runs += _runs("i-n128b128-const2e-3", {**SMALL, "block_size": 128, "batch_size": 128}, "UF", [0],
                      **const(2e-3))
        runs += _runs("j-const1e-3", SMALL, "UF", [1], **const(1e-3))
        return runs
    if name == "seeds":    # three seeds (model init and batch order) of the most aggressive setting, U / F / S
        return _runs("f-const3e-3", SMALL, "UFS", [1, 2, 3], lr=3e-3, min_lr=3e-3, steps=6000)
    if name == "amplify":  # the amplifier: Ō with 3, 4, 5 mantissa bits, and bf16 itself, on 4 GPUs
        runs = _runs("k3", AMP, "UF", [0], obits=3)
        runs += _runs("k4", AMP, "U", [0], obits=4) + _runs("k3", AMP, "S", [0], obits=3)
        runs += _runs("k5", AMP, "U", [0], obits=5) + _runs("k3", AMP, "R", [0], obits=3)
        runs += _runs("k7", AMP, "UF", [0])
        return runs
    if name == "amp_seeds":  # Ō with 4 mantissa bits: three seeds of U / F / S, and the ladder on seed 1
        runs = _runs("k4", AMP, "UFS", [1, 2, 3], obits=4)
        runs += _runs("k4", AMP, "TLPR", [1], obits=4)
        return runs
    if name == "amp_final":  # bf16 itself for longer, one GPU each; 5 bits: F, R, S; 6 bits: U
        long = dict(AMP, steps=60000)
        runs = _runs("k7long", long, "U", [0], gpu_slot=0) + _runs("k7long", long, "F", [0], gpu_slot=1)
        runs += _runs("k5", AMP, "RF", [0], obits=5, gpu_slot=2)
        runs += _runs("k5", AMP, "S", [0], obits=5, gpu_slot=3) + _runs("k6", AMP, "U", [0], obits=6, gpu_slot=3)
        return runs
    raise ValueError(f"unknown plan {name!r}")


def run_inline(base: dict, variants: str = "UFS", seed: int = 0, corpus=None, out_dir="/tmp/gpt2_inline",
               progress: bool = True, obits: int = 7, prefix: str = "cpu") -> dict:
    """Train the variants of one configuration one after another in this process (same seed, same
    batch order) and return {name: log record} like a stored search. For small CPU demos."""
    from .data import load_corpus
    from .train import TrainConfig, Trainer
    corpus = corpus or load_corpus("stdlib", max_bytes=base.get("max_bytes") or None)
    records = {}
    for variant in variants:
        name = f"{prefix}-{variant}-s{seed}"
        cfg = TrainConfig(**{**base, **_variant_opts(variant, obits), "name": name, "seed": seed,
                             "data_seed": seed, "out_dir": str(out_dir), "progress": progress})
        Trainer(cfg, corpus).run()
        records[name] = json.loads((Path(out_dir) / f"{name}.json").read_text())
    return records


def _argv(opts: dict) -> list[str]:
    argv = []
    for key, val in opts.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(val, bool):
            argv.append(flag if val else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(val)]
    return argv


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


def launch(runs, minutes: float, work: Path, extra_env=None) -> dict:
    """Start every run as its own process, wait up to ``minutes``, return {name: log record}."""
    work.mkdir(parents=True, exist_ok=True)
    _record_orders(runs, work)
    procs = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    for name, opts, gpu in assign_gpus(runs, _visible_gpus()):
        order = _order_path(work, opts)
        argv = [sys.executable, "-m", "kernels.gpt2.train", "--name", name, "--out-dir", str(work),
                "--max-minutes", f"{minutes:.3f}", "--no-progress", "--stop-after-explosion", "400",
                "--batch-order", str(order), *_argv(opts)]
        log = open(work / f"{name}.stdout", "w")
        run_env = env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu}
        procs[name] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=run_env), log)
    deadline = time.time() + 60 * minutes + 90
    while time.time() < deadline and any(p.poll() is None for p, _ in procs.values()):
        time.sleep(5)
    records = {}
    for name, (proc, log) in procs.items():
        if proc.poll() is None:
            proc.kill()
        log.close()
        path = work / f"{name}.json"
        rec = json.loads(path.read_text()) if path.exists() else {"summary": {"status": "no log"}}
        rec["returncode"] = proc.returncode
        rec["stdout_tail"] = (work / f"{name}.stdout").read_text()[-1500:]
        records[name] = rec
    return records


def ddp_check(out: Path, work: Path, steps: int = 300) -> None:
    """Train the same run with torchrun on 2 GPUs and in one process on one GPU (same global batches),
    then the SDPA baseline alone: checks DDP and measures single-process speed. Writes
    ``gpt2_ddp_log.txt`` (everything printed) and ``gpt2_ddp.json`` (the three logs, with provenance)."""
    from ..results import provenance
    common = ["--n-layer", "4", "--n-head", "4", "--n-embd", "256", "--block-size", "256", "--batch-size", "64",
              "--lr", "1e-3", "--warmup", "50", "--steps", str(steps), "--monitor-every", "100",
              "--log-every", "10", "--no-progress", "--out-dir", str(work)]
    commands = {
        "ddp2-paper": ["torchrun", "--nproc_per_node=2", "-m", "kernels.gpt2.train", "--name", "ddp2-paper",
                       "--attn", "paper", *common],
        "single-paper": [sys.executable, "-m", "kernels.gpt2.train", "--name", "single-paper", "--attn", "paper", *common],
        "single-sdpa": [sys.executable, "-m", "kernels.gpt2.train", "--name", "single-sdpa", "--attn", "sdpa", *common],
    }
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    with open(out / "gpt2_ddp_log.txt", "w") as log:
        log.write(json.dumps(provenance("python -m kernels.gpt2.search --plan ddp")) + "\n")
        for name, cmd in commands.items():
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            log.write(f"[exit code {done.returncode}]\n")
            path = work / f"{name}.json"
            runs[name] = json.loads(path.read_text()) if path.exists() else {"summary": {"status": "no log"}}
    record = {"provenance": provenance("python -m kernels.gpt2.search --plan ddp"), "data": {"runs": runs}}
    with open(out / "gpt2_ddp.json", "w") as f:
        json.dump(record, f, separators=(",", ":"))
    a, b = runs["ddp2-paper"].get("history", {}), runs["single-paper"].get("history", {})
    if a and b:
        diff = max(abs(x - y) for x, y in zip(a["loss"], b["loss"]))
        print(f"DDP (2 GPUs) vs one GPU, same global batches: max |loss difference| = {diff:.4f}")
    for name, rec in runs.items():
        print(name, rec["summary"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--out", default="results")
    parser.add_argument("--work", default="/tmp/gpt2_search")
    args = parser.parse_args(argv)
    from ..results import provenance
    if args.plan == "ddp":
        return ddp_check(Path(args.out), Path(args.work) / "ddp")
    runs = plan(args.plan)
    started = time.time()
    records = launch(runs, args.minutes, Path(args.work) / args.plan)
    packed = {"provenance": provenance(f"python -m kernels.gpt2.search --plan {args.plan} --minutes {args.minutes}"),
              "data": {"plan": args.plan, "wall_s": time.time() - started, "concurrent_processes": len(runs),
                       "gpus": max(1, len(_visible_gpus())),
                       "runs": records}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"gpt2_{args.plan}.json", "w") as f:
        json.dump(packed, f, separators=(",", ":"))
    for name, rec in records.items():
        s = rec["summary"]
        print(f"{name:28s} {s.get('status', '')[:40]:40s} steps {s.get('steps_done')} "
              f"min {s.get('min_loss')} final {s.get('final_loss')} boom {s.get('explosion_step')}")


if __name__ == "__main__":
    main()
