"""Checkpoints of a training run: everything the next step depends on, saved and restored.

A checkpoint holds the model, the optimizer, the step (the data position: batches are read from
the recorded order by step), the explosion detector's state, the probes' previous rank-1
matrices, and every random generator (Python, NumPy, torch CPU and CUDA). A resumed run
continues bit-identically to an uninterrupted one (``tests/gpt2/test_resume.py``). Under DDP
each rank saves and restores its own generators. :class:`Checkpointing` is the part of
:class:`kernels.gpt2.train.Trainer` that does this.
"""

from __future__ import annotations

import dataclasses
import os
import random
from pathlib import Path

import numpy as np
import torch


class Checkpointing:
    def checkpoint_path(self) -> Path:
        return self.out_dir / f"{self.cfg.name}.ckpt.pt"

    # options that may change between the calls of one resumable run; every other option must
    # match the checkpoint
    RESUMABLE_OPTIONS = (
        "resume",
        "max_minutes",
        "stop_at",
        "progress",
        "out_dir",
        "checkpoint_every",
        "device",
        "batch_order",
    )

    def _rng_state(self) -> dict:
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def _set_rng_state(state: dict):
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        # generator states are CPU ByteTensors; map_location may have moved them to the GPU
        torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])

    def _rank_rng_path(self) -> Path:
        return self.out_dir / f"{self.cfg.name}.rng{self.rank}.pt"

    def save_checkpoint(self):
        """Everything the next step depends on, written atomically (a kill leaves the old one)."""
        if self.world > 1:  # each rank's own generators
            torch.save(self._rng_state(), self._rank_rng_path())
        if self.rank != 0:
            return
        state = {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "step": self.step,
            "history": self.history,
            "monitor": self.monitor,
            "evals": self.evals,
            "delta_running": self.delta_running,
            "wall_offset": self.wall_offset,
            "detector": (self.ema, self.ema_min, self.exploded_for),
            "probes": [b.attn.probe.prev_rank1 for b in self.model.blocks],
            "rng": self._rng_state(),
            "order": self.order.fingerprint(),
            "config": dataclasses.asdict(self.cfg),
        }
        path = self.checkpoint_path()
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load_checkpoint(self):
        path = self.checkpoint_path()
        if not path.exists():
            raise FileNotFoundError(f"--resume given but there is no checkpoint {path}")
        state = torch.load(path, map_location=self.device, weights_only=False)
        mine, saved = dataclasses.asdict(self.cfg), state["config"]
        changed = [k for k in mine if k not in self.RESUMABLE_OPTIONS and saved.get(k) != mine[k]]
        if changed:
            raise ValueError(
                f"checkpoint {path} was made with other options: "
                + ", ".join(f"{k}={saved.get(k)!r} (now {mine[k]!r})" for k in changed)
            )
        if state["order"] != self.order.fingerprint():
            raise ValueError(f"checkpoint {path} was made with another batch order")
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.history, self.monitor = state["step"], state["history"], state["monitor"]
        self.evals, self.delta_running = state["evals"], state["delta_running"]
        self.wall_offset = state["wall_offset"]
        self.ema, self.ema_min, self.exploded_for = state["detector"]
        for block, prev in zip(self.model.blocks, state["probes"]):
            block.attn.probe.prev_rank1 = None if prev is None else prev.to(self.device)
        rng = state["rng"]
        if self.world > 1 and self._rank_rng_path().exists():
            rng = torch.load(self._rank_rng_path(), weights_only=False)
        self._set_rng_state(rng)
        if self.rank == 0:
            self._write_csv()
