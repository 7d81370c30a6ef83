"""The monitor where practitioners train: a Hugging Face ``TrainerCallback`` and a
Lightning ``Callback``. Neither package is imported until its callback is asked for, so
``kernels.monitor`` works without them::

    from kernels.monitor.callbacks import MonitorTrainerCallback       # Hugging Face
    trainer = Trainer(model, args, train_dataset=data,
                      callbacks=[MonitorTrainerCallback(every=100, path="monitor.csv")])

    from kernels.monitor.callbacks import MonitorLightningCallback     # Lightning
    trainer = L.Trainer(callbacks=[MonitorLightningCallback(every=100, path="m.csv")])

Both attach an :class:`~kernels.monitor.AttentionMonitor` to the model when training
starts (any option of ``attach`` passes through), call ``monitor.step`` with the
optimizer-step count before each step (once per micro-batch under gradient
accumulation: the monitor reads the first micro-batch of each reading step once) and
detach it when training ends or fails. Lightning says when training fails
(``on_exception``); Hugging Face's Trainer does not, so its callback lets go of the model
in three ways: at ``on_train_end``; around ``train()`` as a context manager
(``with callback: trainer.train()``, a try/finally that detaches whatever happens); and
when the callback is collected or the interpreter exits (a finalizer, safe where
``__del__`` is not), so a failed run leaves no hook on the model and no file open. The
monitor is the callback's ``monitor`` attribute (its ``rows``, ``alerts``).
``MonitorLightningCallback`` subclasses ``lightning.pytorch.Callback`` if the
``lightning`` package is installed, otherwise ``pytorch_lightning.Callback``;
:func:`lightning_callback_class` picks one explicitly.
"""

from __future__ import annotations

import importlib
import warnings
import weakref

from .monitor import AttentionMonitor

_BUILT: dict = {}


def _let_go(monitor):
    """Detach a monitor left attached by a run that failed (from a finalizer: quietly)."""
    if monitor.detached:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            monitor.detach()
        except Exception:  # an on_alert that raises: nothing to raise into here
            pass


class _Hooks:
    """What both callbacks do, in terms of attach / step / detach."""

    def __init__(self, every=100, **options):
        self.every, self.options, self.monitor = every, options, None
        self._finalizer = None

    def _attach(self, model):
        self._detach()
        self.monitor = AttentionMonitor.attach(model, every=self.every, **self.options)
        self._finalizer = weakref.finalize(self, _let_go, self.monitor)

    def _step(self, step):
        if self.monitor is not None and not self.monitor.detached:
            self.monitor.step(int(step))

    def _detach(self):
        if self._finalizer is not None:
            self._finalizer.detach()  # the monitor is let go of here, not again later
            self._finalizer = None
        if self.monitor is not None:
            self.monitor.detach()

    def close(self):
        """Detach the monitor (its hooks removed, its files closed)."""
        self._detach()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._detach()


def _trainer_callback_class():
    try:
        from transformers import TrainerCallback
    except ImportError as err:
        raise ImportError(
            f"MonitorTrainerCallback needs the 'transformers' package "
            f"(pip install transformers): {err}"
        ) from None

    class MonitorTrainerCallback(_Hooks, TrainerCallback):
        """Attaches the monitor at ``on_train_begin``, steps it at ``on_step_begin``
        (``state.global_step``), detaches it at ``on_train_end``, or when training fails:
        around ``train()`` as a context manager (``with callback: trainer.train()``), or
        once the callback is collected."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is None:
                raise ValueError("MonitorTrainerCallback got no model at on_train_begin")
            self._attach(model)

        def on_step_begin(self, args, state, control, **kwargs):
            self._step(state.global_step)

        def on_train_end(self, args, state, control, **kwargs):
            self._detach()

    return MonitorTrainerCallback


def lightning_callback_class(package=None):
    """The Lightning callback class, built on ``package`` ("lightning.pytorch" or
    "pytorch_lightning"; None: the first of the two that is installed)."""
    names = ("lightning.pytorch", "pytorch_lightning") if package is None else (package,)
    if package is not None and package not in ("lightning.pytorch", "pytorch_lightning"):
        raise ValueError(
            f"package must be 'lightning.pytorch' or 'pytorch_lightning', got {package!r}"
        )
    for name in names:
        if name in _BUILT:
            return _BUILT[name]
        try:
            base = importlib.import_module(name).Callback
        except ImportError:
            continue

        class MonitorLightningCallback(_Hooks, base):
            """Attaches the monitor at ``on_fit_start``, steps it at
            ``on_train_batch_start`` (``trainer.global_step``), detaches it at
            ``on_fit_end`` or on an exception."""

            def on_fit_start(self, trainer, pl_module):
                self._attach(pl_module)

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self._step(trainer.global_step)

            def on_fit_end(self, trainer, pl_module):
                self._detach()

            def on_exception(self, trainer, pl_module, exception):
                self._detach()

        _BUILT[name] = MonitorLightningCallback
        return MonitorLightningCallback
    raise ImportError(
        f"MonitorLightningCallback needs Lightning: none of {', '.join(names)} "
        "is installed (pip install lightning)"
    )


def __getattr__(name):
    if name == "MonitorTrainerCallback":
        if name not in _BUILT:
            _BUILT[name] = _trainer_callback_class()
        return _BUILT[name]
    if name == "MonitorLightningCallback":
        return lightning_callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The two callback classes are made on first access (the module's __getattr__ above), so
# that neither transformers nor Lightning is imported before it is needed. They are not in
# __all__ (a star import would build both, importing both packages); import them by name:
# ``from kernels.monitor.callbacks import MonitorLightningCallback``.
_LAZY = ("MonitorLightningCallback", "MonitorTrainerCallback")

__all__ = ["lightning_callback_class"]


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
