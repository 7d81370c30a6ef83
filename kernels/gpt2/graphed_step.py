"""One training step as a CUDA graph: the same kernels, launched by one call instead of ~800.

The chapter's GPT-2 is small: on an H200 a step of the emulated bf16 attention keeps the GPU
busy for about 12 ms, but Python and kernel launches take twice that. A CUDA graph records the
step's kernels once (forward, backward, gradient clipping, AdamW) and replays them with one
launch. Replaying runs the very kernels eager mode runs, on the same data, so the numbers are
the same; ``python -m kernels.gpt2.fast_step_check`` trains the same steps both ways on the GPU and
compares every weight bit for bit.

What a graph needs, and how the trainer provides it:

* fixed input addresses: each step's batch is copied into ``static_x`` / ``static_y``;
* a learning rate that can change without re-recording: AdamW gets ``lr`` as a GPU tensor
  (``capturable=True``), filled before each replay;
* no host work inside the step: monitoring steps (every ``monitor_every``) run eagerly, with
  their probes, between replays;
* warm-up before recording: the first ``WARMUP`` graph-eligible steps run eagerly on a side
  stream (they are real training steps, not extra ones).
"""

from __future__ import annotations

import torch

WARMUP = 3


class GraphedStep:
    """Forward, backward, clipping and the optimizer step of one trainer, as a CUDA graph."""

    def __init__(self, trainer):
        if trainer.device.type != "cuda" or trainer.world > 1:
            raise ValueError("cuda_graph needs one CUDA GPU (no DDP, no CPU)")
        self.trainer = trainer
        self.graph = None
        self.warm = 0
        self.side = torch.cuda.Stream(trainer.device)

    def __call__(self, x, y):
        """Train one step on (x, y); returns (loss, grad_norm) tensors."""
        if self.warm < WARMUP:  # a real step, eagerly, on the side stream
            self.warm += 1
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                out = self.trainer.eager_step(x, y)
            torch.cuda.current_stream().wait_stream(self.side)
            return out
        if self.graph is None:
            self._record(x, y)
        self.static_x.copy_(x)
        self.static_y.copy_(y)
        self.graph.replay()
        return self.loss, self.grad_norm

    def _record(self, x, y):
        tr = self.trainer
        self.static_x, self.static_y = x.clone(), y.clone()
        tr.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            with torch.autocast(
                "cuda", dtype=torch.bfloat16, enabled=tr.cfg.autocast == "bf16", cache_enabled=False
            ):
                _, loss = tr.model(self.static_x, self.static_y)
            loss.backward()
            self.grad_norm = torch.nn.utils.clip_grad_norm_(tr.model.parameters(), tr.cfg.grad_clip)
            tr.opt.step()
        self.loss = loss.detach()
