"""What keeps the monitor from breaking a training step: a reading that cannot be made is NaN,
and an error inside one of its hooks is caught and said once; and what makes its warnings
point at the user's line, not at the library's.

* :func:`shielded`       wraps a hook: an exception inside it becomes one warning, never an
                         exception in the user's forward or backward pass
* :func:`nan_readings`   the readings of a layer that could not be read: NaN for every head
* :func:`layer_value`    one number per layer from its heads' readings; NaN if any head's is
* :func:`warn_user`      ``warnings.warn`` naming the first frame outside the monitor and
                         the libraries that call it (the user's ``monitor.step`` line, the
                         line that calls a Trainer's ``train()``)
* :func:`as_step`        a training step as a whole number (an int, a 0-d integer tensor, a
                         NumPy integer), or a clear error
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
import warnings

import torch

# Frames of these packages are skipped when a warning looks for the user's line: the
# monitor's own, and the libraries that call it (torch's hooks, the Trainers' callbacks).
LIBRARIES = (
    "kernels.monitor",
    "torch",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
)


def _in_library(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return any(name == lib or name.startswith(lib + ".") for lib in LIBRARIES)


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller of this function
    name the first frame outside :data:`LIBRARIES` (1 names the caller itself)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _in_library(frame):
        frame, level = frame.f_back, level + 1
    return level


def warn_user(message: str, category=UserWarning) -> None:
    """``warnings.warn(message, category)`` naming the user's line."""
    warnings.warn(message, category, stacklevel=user_stacklevel())


def shielded(on_error):
    """Decorate a hook so that an exception inside it calls ``on_error(err)`` (which says so)
    and the hook returns None (a hook that changes nothing) instead of raising into the
    user's forward or backward pass."""

    def wrap(hook):
        @functools.wraps(hook)
        def safe(*args, **kwargs):
            try:
                return hook(*args, **kwargs)
            except Exception as err:  # the monitor never breaks a training step
                on_error(err)
                return None

        return safe

    return wrap


def nan_readings(n_head: int, metrics) -> dict:
    """Readings of a layer that could not be read: NaN for each metric and head."""
    return {metric: [math.nan] * n_head for metric in metrics}


COMBINE = {"mean": lambda v: sum(v) / len(v), "max": max, "sum": sum}


def layer_value(values, rule: str) -> float:
    """The heads' ``values`` combined by ``rule`` (mean, max or sum); NaN when any head's
    value is NaN or infinite (a NaN head is no healthy one: it is never skipped)."""
    values = [float(v) for v in values]
    if not all(math.isfinite(v) for v in values):
        return math.nan
    return float(COMBINE[rule](values))


def as_step(step) -> int:
    """``step`` as an int: an int, a NumPy integer or a 0-d integer tensor (read with
    ``.item()``, which waits for a GPU tensor); anything else is refused."""
    what = f"{type(step).__name__} {step!r}"
    if isinstance(step, torch.Tensor):
        integer = not (step.dtype.is_floating_point or step.dtype.is_complex)
        if step.dim() == 0 and integer and step.dtype != torch.bool:
            step = step.item()
        else:
            what = f"a {tuple(step.shape)} tensor of {step.dtype}"
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(
            "step must be a whole number (an int, a NumPy integer or a 0-d integer "
            f"tensor such as torch.tensor(5)), got {what}"
        )
    if step < 0:
        raise ValueError(f"step must be >= 0, got {int(step)}")
    return int(step)


__all__ = [
    "LIBRARIES",
    "as_step",
    "layer_value",
    "nan_readings",
    "shielded",
    "user_stacklevel",
    "warn_user",
]
