"""The attention monitor: hooks that read a transformer's attention on chosen steps.

    monitor = AttentionMonitor.attach(model, every=100, path="runs/monitor.csv")
    for step in range(steps):
        monitor.step(step)            # arms the hooks on steps divisible by `every`
        loss = ...; loss.backward(); optimizer.step()
    monitor.close()

What it finds. Every module with a ``c_attn`` child (the projection to [Q; K; V]), a
``c_proj`` child (the output projection) and a head count (``n_head``, ``num_heads`` or
the ``n_head=`` argument) is an attention layer, numbered from 0 in module order:
nanoGPT's and the book's ``CausalSelfAttention`` (``c_attn`` an ``nn.Linear`` with a
(3C, C) weight) and Hugging Face's ``GPT2Attention`` (``c_attn`` a ``Conv1D`` with the
transposed (C, 3C) weight). The layer must be causal self-attention with 1/√d scaling
(or a ``scaling`` attribute, as Hugging Face's has) and no padding mask; optional
``q_norm``/``k_norm`` modules (the book's qk-norm) are applied as the layer applies
them. Rotary position embeddings are not.

How it reads. On a reading step it hooks each layer's ``c_attn`` (its output holds q,
k, v) and ``c_proj`` (its input is the output O the layer really produced, heads side
by side). From q and k it forms S; with ``delta=True`` it also computes O_hp =
softmax(S)V in fp32 and hooks the gradient dO of O. Its own arithmetic runs with
autocast switched off. Only the first training forward pass of an armed step (gradients
on) is read; the hooks are removed as soon as it has been read, so between reading
steps the model carries no hook at all. The monitor only reads: outputs and gradients
are bit-identical with and without it (tests/monitor).

What it writes: one row per step, layer, head and metric (:data:`METRICS`). Under
DistributedDataParallel only rank 0 reads and writes. Under ``torch.compile`` the hooks
are never called, so the monitor warns and switches itself off.
"""
from __future__ import annotations

import warnings

import torch

from .metrics import delta_error, exact_output, head_readings, wq_head_norms
from .sinks import FileSink, TensorBoardSink

METRICS = {
    "ties_bf16": "share of rows (0-1) whose bf16 S holds >= 2 entries equal to the row "
                 "max",
    "p1_fa2": "share of rows (0-1) with >= 2 entries whose exp(S - rowmax) rounds to "
              "1.0 in bf16 (S in fp32: the FA2 rule)",
    "wq_norm": "spectral norm of the head's query weights ||W_Q||_2",
    "max_logit": "largest |S| of the head (fp32 S = q k^T * scale)",
    "delta_err": "sum over tokens of (delta_lp - delta_hp), mean over sequences "
                 "(delta=True)",
    "delta_abs": "sum over tokens of |delta_lp - delta_hp|, mean over sequences "
                 "(delta=True)",
}
HEAD_COUNT_NAMES = ("n_head", "num_heads", "n_heads", "num_attention_heads")


def _compiled(module) -> bool:
    """True for a torch.compile wrapper or a module compiled in place
    (``module.compile()``)."""
    return hasattr(module, "_orig_mod") or any(
        getattr(m, "_compiled_call_impl", None) is not None for m in module.modules())


def _head_count(module, name: str, n_head) -> int:
    if n_head is not None:
        return int(n_head)
    for attr in HEAD_COUNT_NAMES:
        value = getattr(module, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"attention layer {name!r} has no head count (looked for "
                     f"{', '.join(HEAD_COUNT_NAMES)}): pass n_head= to attach")


def query_weight(c_attn: torch.nn.Module, width: int) -> torch.Tensor:
    """The (3C, C) weight making [Q; K; V]: nn.Linear's as is, Conv1D's transposed."""
    w = c_attn.weight
    if tuple(w.shape) == (3 * width, width):
        return w
    if tuple(w.shape) == (width, 3 * width):
        return w.T
    raise ValueError(f"c_attn weight of shape {tuple(w.shape)} is neither (3C, C) nor "
                     f"(C, 3C) for a width C = {width}")


def find_attention(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of each self-attention layer the monitor can read, in order."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        if "c_attn" in children and "c_proj" in children \
                and not getattr(module, "is_cross_attention", False):
            found.append((name, module))
    return found


def _writes() -> bool:
    """Rank 0 of a process group, or no process group: this process reads, writes."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class _Layer:
    """One attention layer: where to hook it and how to cut its tensors into heads."""

    def __init__(self, index, name, module, n_head):
        self.index, self.name, self.module = index, name, module
        self.n_head = _head_count(module, name, n_head)
        weight = module.c_attn.weight
        self.width = min(weight.shape)
        if self.width % self.n_head:
            raise ValueError(f"layer {name!r}: width {self.width} is not divisible by "
                             f"{self.n_head} heads")
        query_weight(module.c_attn, self.width)          # checks the shape once
        scale = getattr(module, "scaling", None)
        self.scale = float(scale) if isinstance(scale, (int, float)) else None

    def split(self, qkv: torch.Tensor):
        """(B, N, 3C) → q, k, v of shape (B, H, N, D), with the layer's q/k norms if it
        has them (applied under the autocast state of the layer's own forward pass)."""
        b, n, _ = qkv.shape
        q, k, v = (t.reshape(b, n, self.n_head, -1).transpose(1, 2)
                   for t in qkv.split(self.width, dim=-1))
        q_norm, k_norm = (getattr(self.module, a, None) for a in ("q_norm", "k_norm"))
        if isinstance(q_norm, torch.nn.Module) and isinstance(k_norm, torch.nn.Module):
            q, k = q_norm(q).to(v.dtype), k_norm(k).to(v.dtype)
        return q, k, v

    def heads(self, out: torch.Tensor) -> torch.Tensor:
        """(B, N, C) with heads side by side → (B, H, N, D)."""
        b, n, _ = out.shape
        return out.reshape(b, n, self.n_head, -1).transpose(1, 2)


class AttentionMonitor:
    """Reads a model's attention on every ``every``-th step (see the module docstring).

    Rows ``(step, layer, head, metric, value)`` go to ``path`` (.csv or .jsonl), to a
    TensorBoard log directory (``tensorboard=``), and to :attr:`rows` in memory.
    """

    def __init__(self, model, every=100, path=None, delta=False, tensorboard=None,
                 layers=None, n_head=None, sequences=None, append=False):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive whole number of steps, got "
                             f"{every!r}")
        if sequences is not None and (not isinstance(sequences, int) or sequences < 1):
            raise ValueError(f"sequences must be a positive number or None, got "
                             f"{sequences!r}")
        self.every, self.delta, self.sequences = every, bool(delta), sequences
        self.enabled, self.rows = True, []
        self._pending, self._handles, self._counter = None, [], 0
        self._model = model
        if _compiled(model):
            self._disable("the model is compiled with torch.compile")
            self.layers, self._sinks = [], []
            return
        found = find_attention(model)
        if not found:
            raise ValueError(
                f"found no attention layer in {type(model).__name__}: the monitor "
                "looks for modules with a c_attn child (the [Q; K; V] projection) and "
                "a c_proj child (nanoGPT's CausalSelfAttention, Hugging Face's "
                "GPT2Attention)")
        picked = range(len(found)) if layers is None else list(layers)
        for i in picked:
            if not isinstance(i, int) or not 0 <= i < len(found):
                names = ", ".join(name for name, _ in found)
                raise ValueError(f"layer index {i!r} does not exist: the model has "
                                 f"{len(found)} attention layers, 0 to "
                                 f"{len(found) - 1} ({names})")
        self.layers = [_Layer(i, *found[i], n_head) for i in picked]
        if self.delta:
            self._warn_about_dropout()
        self._sinks = []
        if path is not None:
            self._sinks.append(FileSink(path, append=append))
        if tensorboard is not None:
            self._sinks.append(TensorBoardSink(tensorboard))

    @classmethod
    def attach(cls, model, every=100, path=None, delta=False, tensorboard=None,
               **options):
        """Attach a monitor to ``model``: every ``every`` steps, rows to ``path``
        (.csv/.jsonl) and/or ``tensorboard`` (a log directory), Σ(δ_lp − δ_hp) when
        ``delta``. Options: ``layers`` (indices of the attention layers to read, default
        all), ``n_head`` (if the layers do not say), ``sequences`` (read only the first
        few sequences of a batch: less memory), ``append`` (add to an existing file)."""
        return cls(model, every=every, path=path, delta=delta, tensorboard=tensorboard,
                   **options)

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    # ------------------------------------------------------ the training loop's side
    def step(self, step=None) -> bool:
        """Call once per training step, before its forward pass. Arms the hooks when
        ``step`` (or, without it, the count of calls so far) is a multiple of ``every``;
        returns whether this step is read. First writes what the previous armed step
        left unwritten."""
        if step is None:
            step = self._counter
        self._counter = step + 1
        self._finish()
        if not self.enabled or step % self.every or not _writes():
            return False
        if _compiled(self._model):
            self._disable("the model was compiled with torch.compile after the monitor "
                          "was attached")
            return False
        self._pending = {"step": step, "qkv": {}, "forward": {}, "expect": set(),
                         "delta": {}, "seen": False}
        for layer in self.layers:
            self._handles.append(layer.module.c_attn.register_forward_hook(
                self._qkv_hook(layer)))
            self._handles.append(layer.module.c_proj.register_forward_pre_hook(
                self._output_hook(layer)))
        return True

    def close(self):
        """Write what is left and close the files."""
        self._finish()
        for sink in self._sinks:
            sink.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def frame(self):
        """The rows read so far as a pandas table (step, layer, head, metric, value)."""
        import pandas as pd
        from .sinks import COLUMNS
        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    # ------------------------------------------------------------ hooks
    def _qkv_hook(self, layer):
        def hook(module, inputs, output):
            pending = self._pending
            if (pending is None or layer.index in pending["qkv"]
                    or not torch.is_grad_enabled()):
                return
            pending["qkv"][layer.index] = output.detach()
        return hook

    def _output_hook(self, layer):
        def hook(module, inputs):
            pending = self._pending
            if (pending is None or layer.index in pending["forward"] or not inputs
                    or layer.index not in pending["qkv"]
                    or not torch.is_grad_enabled()):
                return
            pending["seen"] = True
            out = inputs[0]
            keep = self.sequences or out.shape[0]
            with torch.no_grad():
                q, k, v = layer.split(pending["qkv"].pop(layer.index)[:keep])
                with torch.autocast(out.device.type, enabled=False):
                    stats = head_readings(q, k, scale=layer.scale)
                    weight = query_weight(layer.module.c_attn, layer.width)
                    stats["wq_norm"] = wq_head_norms(weight, layer.n_head)
                    o_hp = exact_output(q, k, v, layer.scale) if self.delta else None
            pending["forward"][layer.index] = stats
            if self.delta and out.requires_grad:
                pending["expect"].add(layer.index)
                o_lp = layer.heads(out.detach()[:keep])
                out.register_hook(self._grad_hook(layer, pending, o_lp, o_hp))
            self._done_with(layer)
            self._check_complete()
        return hook

    def _grad_hook(self, layer, pending, o_lp, o_hp):
        def hook(grad):
            if self._pending is not pending or layer.index in pending["delta"]:
                return
            with torch.no_grad(), torch.autocast(grad.device.type, enabled=False):
                d_out = layer.heads(grad.detach()[:o_lp.shape[0]])
                err = delta_error(d_out, o_lp, o_hp)                    # (B, H, N)
                pending["delta"][layer.index] = {
                    "delta_err": [float(t) for t in err.sum(-1).mean(0)],
                    "delta_abs": [float(t) for t in err.abs().sum(-1).mean(0)]}
            self._check_complete()
        return hook

    def _done_with(self, layer):
        """Remove the module hooks of one layer once it has been read."""
        keep = []
        for handle in self._handles:
            hooks_of = (layer.module.c_attn._forward_hooks,
                        layer.module.c_proj._forward_pre_hooks)
            if any(handle.id in d for d in hooks_of):
                handle.remove()
            else:
                keep.append(handle)
        self._handles = keep

    def _check_complete(self):
        p = self._pending
        if p is not None and len(p["forward"]) == len(self.layers) \
                and p["expect"] <= set(p["delta"]):
            self._finish()

    def _finish(self):
        """Write the pending step's rows (whatever was read) and remove every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        p, self._pending = self._pending, None
        if p is None:
            return
        if not p["seen"]:
            warnings.warn(
                f"monitor: step {p['step']} was armed but no training forward pass "
                "reached the attention layers (was the model compiled after the "
                "monitor was attached, or run without gradients?); nothing was read",
                RuntimeWarning, stacklevel=3)
            return
        rows = []
        for layer in self.layers:
            stats = dict(p["forward"].get(layer.index, {}))
            stats.update(p["delta"].get(layer.index, {}))
            for metric in METRICS:
                for head, value in enumerate(stats.get(metric, ())):
                    rows.append((p["step"], layer.index, head, metric, float(value)))
        self.rows.extend(rows)
        for sink in self._sinks:
            sink.write(rows)

    # ------------------------------------------------------------ checks
    def _disable(self, why: str):
        warnings.warn(f"AttentionMonitor disables itself: {why}, and compiled code "
                      "never calls the hooks it reads through. To read the attention, "
                      "train the uncompiled model (attach the monitor to it and do not "
                      "compile it).", UserWarning, stacklevel=3)
        self.enabled = False
        for handle in self._handles:
            handle.remove()
        self._handles, self._pending = [], None

    def _warn_about_dropout(self):
        for layer in self.layers:
            drop = getattr(layer.module, "attn_dropout", None)
            p = drop.p if isinstance(drop, torch.nn.Dropout) else 0.0
            rate = getattr(layer.module, "dropout", 0.0)   # nanoGPT: sdpa's dropout_p
            if isinstance(rate, (int, float)):
                p = max(p, float(rate))
            if p > 0:
                warnings.warn(
                    f"layer {layer.name!r} applies attention dropout (p = {p:g}); O_hp "
                    "has none, so delta_err would measure the dropout as well as the "
                    "rounding: set the attention dropout to 0 while reading delta",
                    UserWarning, stacklevel=3)


__all__ = ["AttentionMonitor", "METRICS", "find_attention", "query_weight"]
