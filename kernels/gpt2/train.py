"""Train the small GPT-2 and log what the chapter plots. One GPU, CPU, or several GPUs via torchrun.

    python -m kernels.gpt2.train --attn paper --lr 1e-3 --steps 3000 --out-dir runs/a
    torchrun --nproc_per_node=2 -m kernels.gpt2.train --attn sdpa --steps 200 --out-dir runs/ddp

The paper's recipe (§3.1): AdamW(0.9, 0.95), weight decay 0, linear warmup then cosine decay to
``min_lr``, global gradient clipping at 1.0, bf16 autocast, and a *recorded batch order* that every
run replays (``--batch-order`` file, written on first use). Logs: ``<name>.csv`` (one row per
logged step) and ``<name>.json`` (config, history, diagnostics, summary).

``--config run.json`` reads every option from one file that :meth:`TrainConfig.write_json` wrote
(how :mod:`.search` hands a run to its process).

Resumable runs. ``--checkpoint-every N`` writes ``<name>.ckpt.pt`` every N steps and whenever a
call stops early (``--max-minutes``, the time limit of *this* call, or ``--stop-at``, a step);
``--resume`` continues from it, bit-identically (:mod:`.checkpoint` says what a checkpoint holds).
``--cuda-graph`` replays each step as a CUDA graph on one GPU (:mod:`.graphed_step`): the same
kernels, one launch.

``--autocast bf16`` works on CUDA GPUs of sm_80 and newer and on the CPU (PyTorch's CPU autocast
supports bf16); on older GPUs (T4) pass ``--autocast off``: the model then runs in fp32 around the
"paper" attention, which rounds to bf16 by itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch

from .checkpoint import Checkpointing
from .config import TrainConfig
from .data import BatchOrder, eval_batches, load_corpus
from .diagnostics import find_explosion
from .model import GPT


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``min_lr`` at step ``decay_steps`` (the last
    step when it is 0), then ``min_lr``: a run can go on past a stored run's schedule unchanged."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    end = cfg.decay_steps or cfg.steps
    frac = min(1.0, (step - cfg.warmup) / max(1, end - cfg.warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def _distributed():
    """(rank, world, local_rank); initialises the process group when launched by torchrun."""
    if "RANK" not in os.environ:
        return 0, 1, 0
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))


def _device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device != "auto":
        return torch.device(cfg.device)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class Trainer(Checkpointing):
    """Holds the model, optimiser, data and logs of one run. ``run()`` trains to the end."""

    def __init__(self, cfg: TrainConfig, corpus=None):
        self.cfg = cfg
        self.rank, self.world, local_rank = _distributed()
        if cfg.batch_size % self.world:
            raise ValueError(f"batch_size {cfg.batch_size} is not divisible by {self.world} GPUs")
        self.device = _device(cfg, local_rank)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 in the emulated paths
        torch.backends.cudnn.allow_tf32 = False
        self.corpus = corpus or load_corpus(cfg.data, max_bytes=cfg.max_bytes or None)
        self.order = self._batch_order()
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model_config(self.corpus.vocab_size)).to(self.device)
        self.ddp = None
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        fused = self.device.type == "cuda"
        # a CUDA graph needs the learning rate as a tensor it can read at replay
        lr = torch.tensor(cfg.lr, device=self.device) if cfg.cuda_graph else cfg.lr
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=lr,
            betas=(0.9, 0.95),
            weight_decay=cfg.weight_decay,
            fused=fused,
            capturable=cfg.cuda_graph,
        )
        self.step = 0
        self.history = {k: [] for k in ("step", "loss", "lr", "grad_norm", "wall_s")}
        self.monitor = []
        self.evals = []
        self.delta_running = [0.0] * cfg.n_layer
        self.wall_offset = 0.0
        self.status = "running"
        self.ema, self.ema_min, self.exploded_for = None, math.inf, 0  # explosion detector
        self.out_dir = Path(cfg.out_dir)
        if self.rank == 0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        if cfg.resume:
            self.load_checkpoint()
        self.graphed = None
        if cfg.cuda_graph:
            from .graphed_step import GraphedStep

            self.graphed = GraphedStep(self)

    # ---------------------------------------------------------------- data
    def _batch_order(self) -> BatchOrder:
        cfg = self.cfg
        path = Path(cfg.batch_order) if cfg.batch_order else None
        if path is not None and path.exists():
            order = BatchOrder.load(path)
            if order.offsets.shape[1] != cfg.batch_size or order.steps < cfg.steps:
                raise ValueError(
                    f"recorded batch order {path} is {order.offsets.shape}, need "
                    f"≥ {cfg.steps} steps of {cfg.batch_size} sequences"
                )
            return order
        order = BatchOrder.draw(
            len(self.corpus.train), cfg.steps, cfg.batch_size, cfg.block_size, cfg.data_seed
        )
        if path is not None and self.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            order.save(path)
        return order

    def batch(self, step: int):
        return self.order.batch(
            self.corpus.train, step, self.cfg.block_size, self.rank, self.world, self.device
        )

    def autocast(self):
        return torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.cfg.autocast == "bf16"
        )

    # ---------------------------------------------------------------- one step
    def train_step(self) -> tuple[float, float]:
        cfg, step = self.cfg, self.step
        monitoring = cfg.monitor_every > 0 and step % cfg.monitor_every == 0
        self.model.set_monitoring(monitoring)
        for group in self.opt.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr_at(step, cfg))
            else:
                group["lr"] = lr_at(step, cfg)
        x, y = self.batch(step)
        if self.graphed is not None and not monitoring:  # monitoring steps run eagerly
            loss, grad_norm = self.graphed(x, y)
        else:
            loss, grad_norm = self.eager_step(x, y)
        if monitoring:
            self._record_monitor(step)
            self.model.set_monitoring(False)
        self.step += 1
        return loss.detach(), grad_norm.detach()

    def eager_step(self, x, y):
        """Forward, backward, clipping and AdamW, op by op; returns (loss, grad_norm)."""
        net = self.ddp or self.model
        with self.autocast():
            _, loss = net(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.opt.step()
        return loss, grad_norm

    def _record_monitor(self, step):
        layers = self.model.layer_stats()
        for i, st in enumerate(layers):
            self.delta_running[i] += st.get("delta_err", 0.0)
            st["delta_err_running"] = self.delta_running[i]
        self.monitor.append({"step": step, "wq_norms": self.model.wq_norms(), "layers": layers})

    @torch.no_grad()
    def evaluate(self, n_batches: int = 4) -> float:
        self.model.eval()
        losses = []
        for x, y in eval_batches(
            self.corpus.val,
            n_batches,
            max(1, self.cfg.batch_size // self.world),
            self.cfg.block_size,
            self.device,
        ):
            with self.autocast():
                losses.append(float(self.model(x, y)[1]))
        self.model.train()
        return float(np.mean(losses))

    # ---------------------------------------------------------------- loop
    def run(self) -> dict:
        cfg = self.cfg
        from tqdm.std import tqdm

        call_start = time.time()
        start = call_start - self.wall_offset  # wall time counts across resumed calls
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            desc=cfg.name,
            mininterval=5,
            disable=not (cfg.progress and self.rank == 0),
        )
        self.status = "running"
        while self.step < cfg.steps:
            step = self.step
            loss, grad_norm = self.train_step()
            bar.update(1)
            if step % cfg.log_every == 0 or self.step == cfg.steps:
                loss_v = self._mean_over_ranks(loss)
                self._log(step, loss_v, float(grad_norm), time.time() - start)
                bar.set_postfix(loss=f"{loss_v:.3f}")
                if not math.isfinite(loss_v):
                    self.status = f"non-finite loss at step {step}"
                    break
                if self._exploded(loss_v):
                    self.status = f"stopped: loss exploded and stayed up {self.exploded_for} steps"
                    break
            if cfg.eval_every and step % cfg.eval_every == 0:
                self.evals.append({"step": step, "val_loss": self.evaluate()})
            if cfg.monitor_every and step % (5 * cfg.monitor_every) == 0 and self.rank == 0:
                self.write_json(time.time() - start)  # a killed run still leaves its log
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                self.wall_offset = time.time() - start
                self.save_checkpoint()
            stop = None
            if cfg.max_minutes and time.time() - call_start > 60 * cfg.max_minutes:
                stop = f"stopped: time limit of {cfg.max_minutes} min at step {self.step}"
            elif cfg.stop_at and self.step >= cfg.stop_at and self.step < cfg.steps:
                stop = f"stopped: paused at step {self.step}"
            if stop:
                self.status = stop
                if cfg.checkpoint_every:  # resumable: leave the exact state
                    self.wall_offset = time.time() - start
                    self.save_checkpoint()
                break
        else:
            self.status = "finished"
        bar.close()
        summary = self.write_json(time.time() - start) if self.rank == 0 else None
        return summary

    def _exploded(self, loss: float) -> bool:
        """Smoothed loss a full nat above its running minimum for ``stop_after_explosion`` steps."""
        cfg = self.cfg
        self.ema = loss if self.ema is None else 0.9 * self.ema + 0.1 * loss
        self.ema_min = min(self.ema_min, self.ema)
        self.exploded_for = (
            self.exploded_for + cfg.log_every if self.ema > self.ema_min + 1.0 else 0
        )
        return bool(cfg.stop_after_explosion and self.exploded_for >= cfg.stop_after_explosion)

    def _mean_over_ranks(self, loss) -> float:
        if self.world > 1:
            import torch.distributed as dist

            loss = loss.clone()
            dist.all_reduce(loss)
            loss /= self.world
        return float(loss)

    def _log(self, step, loss, grad_norm, wall):
        h = self.history
        for key, val in zip(
            ("step", "loss", "lr", "grad_norm", "wall_s"),
            (step, loss, lr_at(step, self.cfg), grad_norm, wall),
        ):
            h[key].append(val)
        if self.rank == 0:
            path = self.out_dir / f"{self.cfg.name}.csv"
            if not path.exists() or step == 0:
                self._write_csv()
            else:
                with open(path, "a") as f:
                    f.write(self._csv_row(-1))

    def _csv_row(self, i: int) -> str:
        h = self.history
        return (
            f"{h['step'][i]},{h['loss'][i]:.6g},{h['lr'][i]:.6g},{h['grad_norm'][i]:.6g},"
            f"{h['wall_s'][i]:.3f}\n"
        )

    def _write_csv(self):
        """The whole log so far (on resume: drops rows a killed call wrote after its checkpoint)."""
        with open(self.out_dir / f"{self.cfg.name}.csv", "w") as f:
            f.write("step,loss,lr,grad_norm,wall_s\n")
            f.writelines(self._csv_row(i) for i in range(len(self.history["step"])))

    def summary(self, wall) -> dict:
        h = self.history
        boom = find_explosion(h["step"], h["loss"])
        boom_wall = None if boom is None else h["wall_s"][h["step"].index(boom)]
        finite = [v for v in h["loss"] if math.isfinite(v)]
        return {
            "status": self.status,
            "steps_done": self.step,
            "wall_s": wall,
            "steps_per_s": self.step / wall if wall > 0 else None,
            "explosion_step": boom,
            "explosion_wall_s": boom_wall,
            "min_loss": min(finite) if finite else None,
            "final_loss": h["loss"][-1] if h["loss"] else None,
        }

    def write_json(self, wall) -> dict:
        record = {
            "config": dataclasses.asdict(self.cfg),
            "world_size": self.world,
            "device": str(self.device),
            "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            "torch": torch.__version__,
            "corpus": self.corpus.describe(),
            "batch_order_sha": self.order.fingerprint(),
            "params": self.model.num_params(),
            "summary": self.summary(wall),
            "history": self.history,
            "monitor": self.monitor,
            "evals": self.evals,
        }
        with open(self.out_dir / f"{self.cfg.name}.json", "w") as f:
            json.dump(record, f)
        return record["summary"]


def run_training(cfg: TrainConfig, corpus=None) -> dict:
    """Train one run; returns its summary (rank 0) or None (other ranks)."""
    return Trainer(cfg, corpus).run()


def parse_args(argv=None) -> TrainConfig:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            kind = {"int": int, "float": float, "str": str}[
                f.type if isinstance(f.type, str) else f.type.__name__
            ]
            parser.add_argument(flag, type=kind, default=f.default)
    parser.add_argument(
        "--config", default="", help="a run's options as JSON (the other flags unused)"
    )
    args = vars(parser.parse_args(argv))
    path = args.pop("config")
    return TrainConfig.read_json(path) if path else TrainConfig(**args)


def main(argv=None):
    cfg = parse_args(argv)
    summary = run_training(cfg)
    if summary is not None:
        print(json.dumps({"name": cfg.name, **summary}))
    if "RANK" in os.environ:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
