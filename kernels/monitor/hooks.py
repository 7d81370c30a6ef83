"""The hooks through which :class:`~kernels.monitor.AttentionMonitor` reads a step, as a
mixin of the monitor (whose state they fill: ``_pending``, ``_handles``, ``layers``).

On a reading step each layer's ``c_attn`` output (q, k, v) is kept, the input of its
``c_proj`` (the output O the layer produced) is read when it arrives, and with δ the gradient
of O is hooked. No hook raises into the user's pass: a reading that fails is NaN rows (one
warning says why) and an error anywhere else in a hook is said once and dropped.
"""

from __future__ import annotations

import torch

from .layers import _has_padding
from .metrics import delta_error, exact_output, head_readings
from .safety import nan_readings, shielded, warn_user

FORWARD = ("ties_bf16", "p1_fa2", "max_logit", "wq_norm")
DELTA = ("delta_err", "delta_abs")


class HookReader:
    """The hooks of one monitor (a mixin: :class:`AttentionMonitor` holds the state)."""

    def _install_hooks(self):
        for layer in self.layers:
            module = layer.module
            self._handles += [
                module.c_attn.register_forward_hook(self._qkv_hook(layer)),
                module.c_proj.register_forward_pre_hook(self._output_hook(layer)),
                module.register_forward_pre_hook(self._mask_hook(layer), with_kwargs=True),
            ]

    def _hook_failed(self, err, what="a hook"):
        """Say once that something failed inside a hook; the step goes on."""
        if self._failure_said:
            return
        self._failure_said = True
        warn_user(
            f"monitor: {what} failed inside the monitor ({type(err).__name__}: {err}); "
            "what it would have read is NaN (or missing) and training goes on. This is "
            "said once per monitor",
            RuntimeWarning,
        )

    def _qkv_hook(self, layer):
        @shielded(self._hook_failed)
        def hook(module, inputs, output):
            if torch.compiler.is_compiling():
                # traced by torch.compile: the compiled code replays this attribute write
                # each time it runs (no graph break, so fullgraph=True works too), and the
                # next step() switches the monitor off
                self._compile_seen = True
                return
            pending = self._pending
            if pending is None or layer.index in pending["qkv"] or not torch.is_grad_enabled():
                return
            pending["qkv"][layer.index] = output.detach()

        return hook

    def _mask_hook(self, layer):
        @shielded(self._hook_failed)
        def hook(module, args, kwargs):
            if torch.compiler.is_compiling() or self._padding_warned:
                return
            mask = kwargs.get("attention_mask", kwargs.get("attn_mask"))
            if _has_padding(mask):
                self._padding_warned = True
                warn_user(
                    f"monitor: layer {layer.name!r} was given an attention mask that "
                    "hides positions the causal mask shows (padding). The monitor reads "
                    "every position up to the diagonal as visible, so padded positions "
                    "enter its tie shares, logits and δ: read on batches without "
                    "padding (pack the sequences) or take these readings as approximate",
                    UserWarning,
                )

        return hook

    def _output_hook(self, layer):
        @shielded(self._hook_failed)
        def hook(module, inputs):
            if torch.compiler.is_compiling():
                self._compile_seen = True  # as in _qkv_hook
                return
            pending = self._pending
            if (
                pending is None
                or layer.index in pending["forward"]
                or not inputs
                or layer.index not in pending["qkv"]
                or not torch.is_grad_enabled()
            ):
                return
            pending["seen"] = True
            out = inputs[0]
            keep = self.sequences or out.shape[0]
            qkv = pending["qkv"].pop(layer.index)[:keep]
            stats, o_hp = self._forward_readings(layer, qkv, out.device.type)
            pending["forward"][layer.index] = stats
            if self.delta and out.requires_grad:
                pending["expect"].add(layer.index)
                o_lp = layer.heads(out.detach()[:keep])
                out.register_hook(self._grad_hook(layer, pending, o_lp, o_hp))
            self._done_with(layer)
            self._check_complete()

        return hook

    def _forward_readings(self, layer, qkv, device_type):
        """The head readings of one layer and, with δ, O_hp; NaN readings if they fail."""
        try:
            with torch.no_grad():
                q, k, v = layer.split(qkv)
                with torch.autocast(device_type, enabled=False):
                    stats = head_readings(q, k, scale=layer.scale)
                    stats["wq_norm"] = layer.wq_norms()
                    o_hp = exact_output(q, k, v, layer.scale) if self.delta else None
            return stats, o_hp
        except Exception as err:  # the monitor never breaks a training step
            self._hook_failed(err, f"reading layer {layer.name!r}")
            return nan_readings(layer.n_head, FORWARD), None

    def _grad_hook(self, layer, pending, o_lp, o_hp):
        @shielded(self._hook_failed)
        def hook(grad):
            if self._pending is not pending or layer.index in pending["delta"]:
                return
            pending["delta"][layer.index] = self._delta_readings(layer, grad, o_lp, o_hp)
            self._check_complete()

        return hook

    def _delta_readings(self, layer, grad, o_lp, o_hp):
        """Σ(δ_lp − δ_hp) and Σ|δ_lp − δ_hp| per head; NaN if they cannot be made."""
        if o_hp is None:
            return nan_readings(layer.n_head, DELTA)
        try:
            with torch.no_grad(), torch.autocast(grad.device.type, enabled=False):
                d_out = layer.heads(grad.detach()[: o_lp.shape[0]])
                err = delta_error(d_out, o_lp, o_hp)  # (B, H, N)
                return {
                    "delta_err": [float(t) for t in err.sum(-1).mean(0)],
                    "delta_abs": [float(t) for t in err.abs().sum(-1).mean(0)],
                }
        except Exception as err:  # the monitor never breaks a training step
            self._hook_failed(err, f"reading δ of layer {layer.name!r}")
            return nan_readings(layer.n_head, DELTA)

    def _done_with(self, layer):
        """Remove the module hooks of one layer once it has been read."""
        keep = []
        hooks_of = (
            layer.module.c_attn._forward_hooks,
            layer.module.c_proj._forward_pre_hooks,
            layer.module._forward_pre_hooks,
        )
        for handle in self._handles:
            if any(handle.id in d for d in hooks_of):
                handle.remove()
            else:
                keep.append(handle)
        self._handles = keep

    def _remove_hooks(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _check_complete(self):
        p = self._pending
        if (
            p is not None
            and len(p["forward"]) == len(self.layers)
            and p["expect"] <= set(p["delta"])
        ):
            self._finish()


__all__ = ["HookReader", "FORWARD", "DELTA"]
