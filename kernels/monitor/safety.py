"""What keeps the monitor from breaking a training step: a reading that cannot be made is NaN,
and an error inside one of its hooks is caught and said once.

* :func:`shielded`       wraps a hook: an exception inside it becomes one warning, never an
                         exception in the user's forward or backward pass
* :func:`nan_readings`   the readings of a layer that could not be read: NaN for every head
* :func:`layer_value`    one number per layer from its heads' readings; NaN if any head's is
"""

from __future__ import annotations

import functools
import math


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


__all__ = ["layer_value", "nan_readings", "shielded"]
