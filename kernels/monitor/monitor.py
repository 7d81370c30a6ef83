"""The attention monitor: hooks that read a transformer's attention on chosen steps.

    monitor = AttentionMonitor.attach(model, every=100, path="runs/monitor.csv")
    for step in range(steps):
        monitor.step(step)            # arms the hooks on steps divisible by `every`
        loss = ...; loss.backward(); optimizer.step()
    monitor.close()

What it finds. Every module with a ``c_attn`` child (the projection to q, k, v), a
``c_proj`` child (the output projection) and a head count (``n_head``, ``num_heads`` or
the ``n_head=`` argument) is an attention layer, numbered from 0 in module order. How
q, k and v sit in the output of ``c_attn`` (its *layout*, :data:`LAYOUTS`) is known for
nanoGPT's and the book's ``CausalSelfAttention`` (``c_attn`` an ``nn.Linear`` with a
(3C, C) weight: [Q; K; V]), Hugging Face's ``GPT2Attention`` (a ``Conv1D`` with the
transposed (C, 3C) weight, [Q; K; V]) and ``GPTBigCodeAttention`` (per head
[q; k; v], or one key/value head with ``multi_query=True``). Any other class is refused
with a message naming it, unless ``layout=`` says how its output is laid out. The layer
must be causal self-attention with 1/√d scaling (or a ``scaling`` attribute, as Hugging
Face's has); optional ``q_norm``/``k_norm`` modules (the book's qk-norm) are applied as
the layer applies them. Rotary position embeddings are not. An attention mask that hides
more than the causal mask (padding) is read as if every position were visible: the
monitor warns once when it sees one.

How it reads. On a reading step it hooks each layer's ``c_attn`` (its output holds q,
k, v) and ``c_proj`` (its input is the output O the layer really produced, heads side
by side). From q and k it forms S; with ``delta=True`` it also computes O_hp =
softmax(S)V in fp32 and hooks the gradient dO of O. Its own arithmetic runs with
autocast switched off. Only the first training forward pass of an armed step (gradients
on) is read; the hooks are removed as soon as it has been read, so between reading
steps the model carries no hook at all. The monitor only reads: outputs and gradients
are bit-identical with and without it (tests/monitor). It never raises into the user's
step: a reading it cannot make (NaN or inf weights or activations, a meta tensor) is a NaN
row with an alert ("non-finite W_Q in layer L"), and any other error inside its hooks is
said once and training goes on as it would without the monitor.

What it writes: one row per step, layer, head and metric (:data:`METRICS`), to a file,
TensorBoard or any callable (:mod:`.sinks`), and checks each layer's readings against
the alert rules of :mod:`.alerts` (a warning once per crossing, and ``on_alert``). An
alert is said (warned, passed to ``on_alert``) at the next ``step()`` or ``detach()``
call, once the step's rows are written and outside every forward and backward pass: an
exception raised by ``on_alert`` (to stop training) reaches that call and loses nothing.
``step(s)`` called again with the same ``s`` (once per micro-batch) does nothing more.
``detach()`` (or ``close()``) writes what is left, removes every hook and closes the
files; the monitor then refuses further steps. Under DistributedDataParallel only rank 0
reads and writes. Under ``torch.compile`` the hooks are never called, or called while
compiled code is traced: the monitor warns once and switches itself off, whether the
model was compiled before or after the monitor was attached, and whatever compiled it (a
wrapper, ``model.compile()``, a compiled training step): a model compiled before is
noticed at the first reading step, whose attention layers were trained without calling
the hooks, and the warning says so.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from .alerts import make_alerts
from .hooks import HookReader
from .layers import (
    LAYOUTS,
    _compiled,
    _compiled_before,
    _Layer,
    _training_marks,
    _writes,
    find_attention,
    query_weight,
)
from .safety import as_step, layer_value, warn_user
from .sinks import make_sink, resume_row

log = logging.getLogger("kernels.monitor")

# Rows kept in memory (.rows) by default: the latest 100,000, about 12 MB (a GPT-2 small
# reading step writes 12 layers x 12 heads x 4 to 6 metrics = 576 to 864 rows). The sinks
# (a file, TensorBoard, a function) are the record of a run; keep_rows=None keeps all.
ROWS_KEPT = 100_000
_DEFAULT = object()

METRICS = {
    "ties_bf16": "share of rows (0-1) whose bf16 S holds >= 2 entries equal to the row max",
    "p1_fa2": "share of rows (0-1) with >= 2 entries whose exp(S - rowmax) rounds to "
    "1.0 in bf16 (S in fp32: the FA2 rule)",
    "wq_norm": "spectral norm of the head's query weights ||W_Q||_2",
    "max_logit": "largest |S| of the head (fp32 S = q k^T * scale)",
    "delta_err": "sum over tokens of (delta_lp - delta_hp), mean over sequences (delta=True)",
    "delta_abs": "sum over tokens of |delta_lp - delta_hp|, mean over sequences (delta=True)",
}


class AttentionMonitor(HookReader):
    """Reads a model's attention on every ``every``-th step (see the module docstring).

    Rows ``(step, layer, head, metric, value)`` go to ``path`` (.csv or .jsonl, or a
    SummaryWriter, or a function of the rows), to TensorBoard (``tensorboard=``: a log
    directory or a SummaryWriter), to ``sink`` (a function of the rows), and to
    :attr:`rows` in memory (the latest :data:`ROWS_KEPT`). Each layer's readings go
    through the alert rules (:mod:`.alerts`; ``alerts=False`` switches them off, a dict
    overrides thresholds).
    """

    def __init__(
        self,
        model,
        every=100,
        path=None,
        delta=False,
        tensorboard=None,
        layers=None,
        n_head=None,
        sequences=None,
        append=None,
        layout=None,
        sink=None,
        alerts=True,
        on_alert=None,
        warmup_steps=None,
        keep_rows=_DEFAULT,
    ):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive whole number of steps, got {every!r}")
        if sequences is not None and (not isinstance(sequences, int) or sequences < 1):
            raise ValueError(f"sequences must be a positive number or None, got {sequences!r}")
        self.every, self.delta, self.sequences = every, bool(delta), sequences
        self.enabled, self.detached = True, False
        self._kept = deque(maxlen=ROWS_KEPT if keep_rows is _DEFAULT else keep_rows)
        self._dropping_said = False
        self._pending, self._handles, self._counter, self._unsent = None, [], 0, []
        self._last = None  # (step, what step() returned)
        self._latest = None  # the step written last (the files' own, then this run's)
        self._compile_seen, self._padding_warned, self._failure_said = False, False, False
        self._model = model
        self.alerts = make_alerts(alerts, on_alert, warmup_steps)
        if self.alerts is not None and _writes():
            log.info(self.alerts.describe())
        self._sinks = []
        if _compiled(model):
            self._disable("the model is compiled with torch.compile")
            self.layers = []
            return
        found = find_attention(model)
        if not found:
            raise ValueError(
                f"found no attention layer in {type(model).__name__}: the monitor "
                "looks for modules with a c_attn child (the [Q; K; V] projection) and "
                "a c_proj child (nanoGPT's CausalSelfAttention, Hugging Face's "
                "GPT2Attention)"
            )
        picked = range(len(found)) if layers is None else list(layers)
        for i in picked:
            if not isinstance(i, int) or not 0 <= i < len(found):
                names = ", ".join(name for name, _ in found)
                raise ValueError(
                    f"layer index {i!r} does not exist: the model has "
                    f"{len(found)} attention layers, 0 to "
                    f"{len(found) - 1} ({names})"
                )
        self.layers = [_Layer(i, *found[i], n_head, layout) for i in picked]
        if self.delta:
            self._warn_about_dropout()
        for target, option in ((path, "path"), (tensorboard, "tensorboard"), (sink, "sink")):
            if target is not None:
                self._sinks.append(make_sink(target, option, append=append))
        self._latest = self._latest_step_written()

    def _latest_step_written(self):
        """The last step the files already hold (each file's plan for them logged), or
        None."""
        plans = [sink.plan() for sink in self._sinks if hasattr(sink, "plan")]
        for plan in plans:
            if plan is not None and _writes():
                log.info(plan)
        held = [getattr(sink, "last_step", None) for sink in self._sinks]
        return max((step for step in held if step is not None), default=None)

    @classmethod
    def attach(cls, model, every=100, path=None, delta=False, tensorboard=None, **options):
        """Attach a monitor to ``model``: every ``every`` steps, rows to ``path``
        (.csv/.jsonl, a SummaryWriter or a function) and/or ``tensorboard`` (a log
        directory or a SummaryWriter), Σ(δ_lp − δ_hp) when ``delta``. Options:
        ``layers`` (indices of the attention layers to read, default all), ``n_head``
        (if the layers do not say), ``layout`` (how c_attn's output holds q, k, v, for a
        class the monitor does not know: see :data:`LAYOUTS`), ``sequences`` (read only
        the first few sequences of a batch: less memory), ``append`` (None, the default:
        continue a file that already holds rows, as a resumed run should, with one logged
        line saying so; False: start it over; a step written again is preceded by a
        resume row, :mod:`.sinks`), ``sink`` (a function of each step's rows),
        ``alerts`` (True: the book's thresholds; False: none; a dict: your thresholds),
        ``on_alert`` (a function of each :class:`~kernels.monitor.alerts.Alert`),
        ``warmup_steps`` (default 1,000), ``keep_rows`` (rows kept in memory, in
        :attr:`rows`: the latest :data:`ROWS_KEPT` = 100,000 by default, None all, 0
        none; the sinks are the record).

        What the alerts watch when: from step 0 the ceilings, the largest |S|
        (``max_logit``) and the share of tied rows (``ties_bf16``), and any NaN or
        infinite reading; the rules relative to the run's own history, the growth of
        ‖W_Q‖ over the layer's own level (``wq_growth``) and the lean of δ
        (``delta_lean``), only after ``warmup_steps``, once that level (the median ‖W_Q‖
        over the second half of the warmup) exists. Attaching logs this as one line
        (logger ``kernels.monitor``, level INFO: :meth:`Alerts.describe`)."""
        return cls(model, every=every, path=path, delta=delta, tensorboard=tensorboard, **options)

    @property
    def rows(self) -> list:
        """The latest rows read, (step, layer, head, metric, value): at most ``keep_rows``
        (default :data:`ROWS_KEPT`); the sinks hold them all."""
        return list(self._kept)

    def _keep(self, rows):
        kept = self._kept
        if kept.maxlen is not None and len(kept) + len(rows) > kept.maxlen:
            self._say_rows_dropped()
        kept.extend(rows)

    def _say_rows_dropped(self):
        if self._dropping_said or self._sinks or self._kept.maxlen == 0:
            return
        self._dropping_said = True
        warn_user(
            f"monitor: .rows keeps the latest {self._kept.maxlen:,} rows and this monitor "
            "writes to no file or sink, so older rows are dropped: pass path= (or sink=) "
            "to keep a record, or keep_rows=None to keep every row in memory",
            RuntimeWarning,
        )

    @property
    def layer_names(self) -> list[str]:
        return [layer.name for layer in self.layers]

    # ------------------------------------------------------ the training loop's side
    def step(self, step=None) -> bool:
        """Call once per training step, before its forward pass. Arms the hooks when
        ``step`` (a whole number: an int, a NumPy integer or a 0-d integer tensor; without
        it, the count of calls so far) is a multiple of ``every``; returns whether this
        step is read. First writes what the previous armed step left unwritten and says
        its alerts. Called again with the same ``step`` (once per micro-batch, as
        Lightning's ``on_train_batch_start`` does), it does nothing more and returns what
        it returned the first time."""
        if self.detached:
            raise RuntimeError(
                "this monitor was detached (detach() or close()): its hooks are gone and "
                "its files closed, so it reads no more steps. Its rows are still in "
                ".rows; to go on reading, attach a new monitor (on the same path it "
                "continues the file)"
            )
        step = self._counter if step is None else as_step(step)
        if self._last is not None and step == self._last[0]:
            self._send_alerts()
            return self._last[1]
        self._finish()
        self._send_alerts()
        self._counter = step + 1
        read = self._arm(step)
        self._last = (step, read)
        return read

    def _send_alerts(self):
        """Say the alerts of the steps written so far (warnings, ``on_alert``): here, in
        ``step()`` or ``detach()``, outside every hook and after the rows are written. An
        exception from ``on_alert`` reaches the caller; the alerts not yet said wait for
        the next call."""
        while self._unsent:
            self.alerts.notify([self._unsent.pop(0)])

    def _arm(self, step) -> bool:
        if self._compile_seen and self.enabled:
            self._disable(
                "torch.compile traced the model while the monitor's hooks were on (the model "
                "was compiled after the monitor was attached, or its compiled code was made "
                "again)"
            )
        if not self.enabled or step % self.every or not _writes():
            return False
        if _compiled(self._model):
            self._disable(
                "the model was compiled with torch.compile after the monitor was attached"
            )
            return False
        self._pending = {
            "step": step,
            "marks": _training_marks(self.layers),
            "qkv": {},
            "forward": {},
            "expect": set(),
            "delta": {},
            "seen": False,
        }
        self._install_hooks()
        return True

    def detach(self):
        """Write what is left, remove every hook, close the files: the model is as it
        was before :meth:`attach`. The rows stay in :attr:`rows`; later ``step`` calls
        are refused."""
        if self.detached:
            return
        self._finish()
        self._remove_hooks()
        for sink in self._sinks:
            sink.close()
        self.detached, self.enabled = True, False
        self._send_alerts()

    close = detach

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()

    def frame(self):
        """The rows read so far as a pandas table (step, layer, head, metric, value)."""
        import pandas as pd

        from .sinks import COLUMNS

        return pd.DataFrame(self.rows, columns=list(COLUMNS))

    # ------------------------------------------------------------ writing
    def _finish(self):
        """Write the pending step's rows (whatever was read) and remove every hook."""
        self._remove_hooks()
        p, self._pending = self._pending, None
        if p is None:
            return
        if not p["seen"]:
            if self._compile_seen:
                return  # step() switches the monitor off, with one warning
            if _training_marks(self.layers) != p["marks"]:
                self._disable(_compiled_before(self._model, p["step"]))
                return
            warn_user(
                f"monitor: step {p['step']} was armed but no training forward pass "
                "reached the attention layers (was the model run without gradients?); "
                "nothing was read",
                RuntimeWarning,
            )
            return
        rows, checked = [], []
        for layer in self.layers:
            stats = dict(p["forward"].get(layer.index, {}))
            stats.update(p["delta"].get(layer.index, {}))
            for metric in METRICS:
                for head, value in enumerate(stats.get(metric, ())):
                    rows.append((p["step"], layer.index, head, metric, float(value)))
            if self.alerts is not None and stats:
                checked.append((layer.index, _combined(stats)))
        if self._latest is not None and p["step"] <= self._latest:
            rows.insert(0, resume_row(p["step"], self._latest))  # a resumed run went back
        self._latest = p["step"]
        self._keep(rows)
        for sink in self._sinks:
            try:
                sink.write(rows)
            except Exception as err:  # the monitor never breaks a training step
                self._hook_failed(err, f"writing step {p['step']} to {type(sink).__name__}")
        for index, readings in checked:  # said at the next step() or detach()
            self._unsent += self.alerts.check(p["step"], index, readings)

    # ------------------------------------------------------------ checks
    def _disable(self, why: str):
        warn_user(
            f"AttentionMonitor disables itself: {why}, and compiled code "
            "never calls the hooks it reads through. To read the attention, "
            "train the uncompiled model (attach the monitor to it and do not "
            "compile it).",
            UserWarning,
        )
        self.enabled = False
        self._remove_hooks()
        self._pending = None

    def _warn_about_dropout(self):
        for layer in self.layers:
            drop = getattr(layer.module, "attn_dropout", None)
            p = drop.p if isinstance(drop, torch.nn.Dropout) else 0.0
            rate = getattr(layer.module, "dropout", 0.0)  # nanoGPT: sdpa's dropout_p
            if isinstance(rate, (int, float)):
                p = max(p, float(rate))
            if p > 0:
                warn_user(
                    f"layer {layer.name!r} applies attention dropout (p = {p:g}); O_hp "
                    "has none, so delta_err would measure the dropout as well as the "
                    "rounding: set the attention dropout to 0 while reading delta",
                    UserWarning,
                )


def _combined(stats: dict) -> dict:
    """One layer's per-head readings combined as the stored runs hold them
    (:data:`kernels.monitor.readings.LAYER_RULES`); NaN where any head's reading is."""
    from .readings import LAYER_RULES

    return {
        metric: layer_value(stats[metric], rule)
        for metric, rule in LAYER_RULES.items()
        if stats.get(metric)
    }


__all__ = ["AttentionMonitor", "METRICS", "ROWS_KEPT", "LAYOUTS", "find_attention", "query_weight"]
