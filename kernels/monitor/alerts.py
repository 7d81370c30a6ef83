"""Alerts: a reading that crosses a threshold drawn from the book's stored GPT-2 runs.

Four rules, each on one number per attention layer (heads combined as
:data:`kernels.monitor.readings.LAYER_RULES` says). Two are ceilings, watched from step 0:

* ``ties_bf16``   the share of the layer's rows whose bf16 S holds tied maxima
* ``max_logit``   the layer's largest |S|

and two are relative to the run's own history, watched once that history exists (after
``warmup_steps``, default 1,000):

* ``wq_growth``   the layer's largest ‖W_Q‖₂ divided by its own median over the second half
                  of the warmup (``early``, default steps 500 to 1,000): the form that
                  carries over to another model. Where the learning rate warms up for
                  longer, give ``warmup_steps`` at least twice that warmup, so that the level
                  is not taken while the rate still climbs (the replay of the stored runs,
                  :func:`kernels.monitor.stored_alerts.replay_warmup`, does)
* ``delta_lean``  Σ(δ_lp − δ_hp) / Σ|δ_lp − δ_hp| over the layer's last ``window`` readings
                  (needs ``delta=True``). A lean alone is no warning (healthy bf16 runs
                  lean as much, chapter 9 §6; in exact attention it is noise), so this rule
                  fires only while the layer's ``wq_growth`` is above its threshold too

:data:`THRESHOLDS` are the largest values any healthy stored run reached (the runs of the
first search without qk-norm and the fp32-O controls, chapter 9 §6), over all their steps:
the early transient every run shows (while the logits are tiny, many BF16 scores tie) is
below the tie ceiling, so the ceilings can watch from step 0.
:func:`thresholds_from_runs` draws them again from stored runs, and the tests check that
the two agree. They were not revised for the runs stored later:
:func:`kernels.monitor.stored_alerts.alert_table` replays every stored run, and where the long
real-BF16 controls pass them, their largest |S| runs away far beyond its own early level
(chapter 9, section 6), so no threshold relative to the run's own history would stay quiet.
An alert fires once when a reading goes above its threshold (a
``warnings.warn`` line of category :class:`AttentionAlert`, and ``on_alert(alert)`` if
given); it fires again only after the reading has come back below.
:meth:`Alerts.describe` says what is watched when. :func:`replay` runs the rules over a
stored run.

A reading that is NaN or infinite is no value under a threshold: it fires its own alert,
from step 0 on, once per layer until the reading is finite again (:data:`NON_FINITE`:
"non-finite W_Q in layer L", non-finite activations, non-finite δ).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass

import numpy as np

from .safety import user_stacklevel

RULES = {
    "ties_bf16": "share of the layer's rows with tied maxima in a bf16 S",
    "wq_growth": "the layer's largest ||W_Q||_2 over its median in the early window",
    "max_logit": "the layer's largest |S|",
    "delta_lean": "sum(delta_lp - delta_hp) / sum|delta_lp - delta_hp| over the last readings",
}
# The largest value each rule's number reached in any healthy stored run, all layers and
# steps (thresholds_from_runs on results/gpt2_{probe,probe2,seeds,amplify,amp_seeds,
# amp_final}.json; tests/monitor/test_alerts.py checks these against the files).
THRESHOLDS = {
    "ties_bf16": 0.080322265625,
    "wq_growth": 3.181695859853613,
    "max_logit": 68.0,
    "delta_lean": 0.058083944097999364,
}
# What a NaN or infinite reading says: (what is not finite, the readings it shows in, why).
NON_FINITE = {
    "non_finite_wq": (
        "W_Q",
        ("wq_norm",),
        "its ||W_Q||_2 reads NaN: the query weights hold NaN or inf, or could not be read",
    ),
    "non_finite_activations": (
        "activations",
        ("ties_bf16", "max_logit"),
        "its scores q k^T hold NaN or inf, so its tie shares and largest logit read NaN",
    ),
    "non_finite_delta": (
        "delta",
        ("delta_err", "delta_abs"),
        "sum(delta_lp - delta_hp) reads NaN or inf: the layer's output or its gradient "
        "holds NaN or inf",
    ),
}
CEILINGS = ("ties_bf16", "max_logit")  # watched from step 0
RELATIVE = ("wq_growth", "delta_lean")  # watched once the layer's own level exists
WARMUP_STEPS = 1000  # steps before the relative rules start
EARLY = (WARMUP_STEPS // 2, WARMUP_STEPS)  # steps whose median ‖W_Q‖ is a run's own level
WINDOW = 10  # readings in the δ lean

log = logging.getLogger("kernels.monitor")


class AttentionAlert(UserWarning):
    """The category of the monitor's alert warnings (filter them with ``warnings``)."""


@dataclass(frozen=True)
class Alert:
    step: int
    layer: int
    rule: str
    value: float
    threshold: float

    @property
    def message(self) -> str:
        if self.rule in NON_FINITE:
            what, _, why = NON_FINITE[self.rule]
            return (
                f"monitor alert at step {self.step}: non-finite {what} in layer "
                f"{self.layer} ({why})"
            )
        whose = (
            ", the most any healthy run of the book reached"
            if self.threshold == THRESHOLDS[self.rule]
            else " (your threshold)"
        )
        return (
            f"monitor alert at step {self.step}, layer {self.layer}: {self.rule} = "
            f"{self.value:.4g} passed {self.threshold:.4g}{whose} ({RULES[self.rule]})"
        )


def _check_thresholds(thresholds) -> dict:
    merged = dict(THRESHOLDS)
    for key, value in dict(thresholds or {}).items():
        if key not in RULES:
            raise ValueError(f"unknown alert rule {key!r}: the rules are {', '.join(RULES)}")
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(
                f"threshold of {key!r} must be a finite number or None (rule off), got {value!r}"
            )
        merged[key] = value
    return merged


def _early_window(early, warmup_steps) -> tuple:
    """The (first, last) step whose median ‖W_Q‖ is a layer's own level."""
    if warmup_steps is None:
        early = EARLY if early is None else early
    elif early is not None:
        raise ValueError("give Alerts early= or warmup_steps=, not both")
    elif not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a whole number >= 0, got {warmup_steps!r}")
    else:
        early = (warmup_steps // 2, warmup_steps)
    if len(early) != 2 or not early[0] <= early[1]:
        raise ValueError(f"early must be (first step, last step), got {early!r}")
    return tuple(early)


class Alerts:
    """The four rules, fed one layer's combined readings at a time (:meth:`update`).

    ``thresholds``: a dict overriding :data:`THRESHOLDS` (None switches a rule off);
    ``warmup_steps``: steps before the relative rules (``wq_growth``, ``delta_lean``)
    start, default 1,000; the layer's own ‖W_Q‖ level is its median over the readings of
    the second half of them (or give that window as ``early``, (first step, last step);
    without a reading there, the first reading after it); ``window``: readings in the δ
    lean; ``on_alert``: called with each :class:`Alert`; ``warn``: also ``warnings.warn``
    each alert. The ceilings (``ties_bf16``, ``max_logit``) and non-finite readings are
    watched from step 0 (:meth:`describe`)."""

    def __init__(
        self,
        thresholds=None,
        early=None,
        window=WINDOW,
        on_alert=None,
        warn=True,
        warmup_steps=None,
    ):
        early = _early_window(early, warmup_steps)
        self.thresholds = _check_thresholds(thresholds)
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive number of readings, got {window!r}")
        if on_alert is not None and not callable(on_alert):
            raise TypeError(
                f"on_alert must be a function of one Alert, got {type(on_alert).__name__}"
            )
        self.early, self.window, self.on_alert, self.warn = (
            tuple(early),
            window,
            on_alert,
            bool(warn),
        )
        self.fired: list[Alert] = []
        self._above: dict = {}
        self._wq: dict = {}  # layer -> early readings
        self._level: dict = {}  # layer -> early level
        self._lean: dict = {}  # layer -> [(err, abs), ...]

    def values(self, step: int, layer: int, readings: dict) -> dict:
        """The rules' numbers for one reading (a rule without its inputs is left out)."""
        out = {}
        for key in ("ties_bf16", "max_logit"):
            if readings.get(key) is not None:
                out[key] = float(readings[key])
        wq = readings.get("wq_norm")
        if wq is not None and math.isfinite(wq):  # a NaN is its own alert, not a level
            if self.early[0] <= step <= self.early[1]:
                self._wq.setdefault(layer, []).append(float(wq))
            elif step > self.early[1] and layer not in self._level:
                early = self._wq.get(layer) or [float(wq)]
                self._level[layer] = float(np.median(early))
            if layer in self._level and self._level[layer] > 0:
                out["wq_growth"] = float(wq) / self._level[layer]
        err, size = readings.get("delta_err"), readings.get("delta_abs")
        if err is not None and size is not None and math.isfinite(err) and math.isfinite(size):
            recent = self._lean.setdefault(layer, [])
            recent.append((float(err), float(size)))
            del recent[: -self.window]
            total = sum(a for _, a in recent)
            if total > 0:
                out["delta_lean"] = sum(e for e, _ in recent) / total
        return out

    def describe(self) -> str:
        """What is watched before the run's own baseline exists, and what after."""
        on = {rule: t for rule, t in self.thresholds.items() if t is not None}
        ceilings = [f"{rule} > {on[rule]:.4g}" for rule in CEILINGS if rule in on]
        relative = [f"{rule} > {on[rule]:.4g}" for rule in RELATIVE if rule in on]
        first, last = self.early
        text = "monitor alerts: from step 0, "
        if ceilings:
            text += f"the ceilings ({', '.join(ceilings)}) and "
        text += "any non-finite reading (W_Q, activations, delta)"
        if relative:
            text += (
                f"; after step {last:,}, once each layer's own level of ||W_Q|| (its median "
                f"over steps {first:,} to {last:,}) exists, " + " and ".join(relative)
            )
            if "delta_lean" in on:
                text += " (the lean only while wq_growth is over its threshold)"
            text += f"; up to step {last:,} nothing relative to the run's own history is watched"
        return text

    def _non_finite(self, step: int, layer: int, readings: dict) -> list[Alert]:
        """The non-finite alerts of one reading (from step 0 on, once per crossing)."""
        fired = []
        for rule, (_, keys, _) in NON_FINITE.items():
            values = [readings[key] for key in keys if readings.get(key) is not None]
            bad = any(not math.isfinite(float(v)) for v in values)
            if bad and not self._above.get((layer, rule)):
                fired.append(Alert(int(step), int(layer), rule, math.nan, math.inf))
            if values:
                self._above[(layer, rule)] = bad
        return fired

    def update(self, step: int, layer: int, readings: dict) -> list[Alert]:
        """Feed one layer's combined readings of one step; returns the alerts fired, each
        said at once (:meth:`notify`)."""
        fired = self.check(step, layer, readings)
        self.notify(fired)
        return fired

    def check(self, step: int, layer: int, readings: dict) -> list[Alert]:
        """Feed one layer's combined readings of one step; returns the alerts fired (kept
        in :attr:`fired`) without saying them: the monitor says them with :meth:`notify`
        once the step's rows are written, outside the autograd hooks."""
        fired = self._non_finite(step, layer, readings)
        values = self.values(step, layer, readings)
        for rule, value in values.items():
            threshold = self.thresholds.get(rule)
            if threshold is None or not math.isfinite(value):
                continue
            if rule in RELATIVE and step <= self.early[1]:
                continue  # no level of the run's own yet
            if rule == "delta_lean":
                growth = self.thresholds.get("wq_growth")
                if growth is None or not values.get("wq_growth", -math.inf) > growth:
                    value = -math.inf  # a lean counts only while W_Q runs away
            key = (layer, rule)
            if value > threshold:
                if not self._above.get(key):
                    fired.append(Alert(int(step), int(layer), rule, value, threshold))
                self._above[key] = True
            else:
                self._above[key] = False
        self.fired.extend(fired)
        return fired

    def notify(self, alerts) -> None:
        """Say each alert: a log line, a warning (``warn``) and ``on_alert(alert)``. An
        exception from ``on_alert`` (raise one to stop training) reaches the caller."""
        for alert in alerts:
            log.info(alert.message)
            if self.warn:
                warnings.warn(alert.message, AttentionAlert, stacklevel=user_stacklevel())
            if self.on_alert is not None:
                self.on_alert(alert)


def make_alerts(alerts, on_alert=None, warmup_steps=None):
    """The :class:`Alerts` of a monitor from ``attach``'s options: True (the book's
    thresholds), False or None (none), a dict of thresholds, or an Alerts of the user's
    own (which takes no ``on_alert`` or ``warmup_steps`` besides)."""
    if isinstance(alerts, Alerts):
        if on_alert is not None or warmup_steps is not None:
            raise ValueError(
                "give on_alert and warmup_steps to your Alerts object, not to attach, "
                "when you pass one"
            )
        return alerts
    if alerts is False or alerts is None:
        if on_alert is not None:
            raise ValueError("on_alert needs alerts on (alerts=True or thresholds)")
        return None
    if alerts is True or isinstance(alerts, dict):
        thresholds = None if alerts is True else alerts
        return Alerts(thresholds, on_alert=on_alert, warmup_steps=warmup_steps)
    raise TypeError(
        f"alerts must be True, False, a dict of thresholds or an Alerts, "
        f"got {type(alerts).__name__}"
    )


# ------------------------------------------------------------------ the stored runs
def run_readings(run: dict):
    """(step, layer, readings) of a run stored by ``kernels.gpt2.search``, heads combined
    as the monitor combines them."""
    for m in run["monitor"]:
        for layer, st in enumerate(m["layers"]):
            yield (
                m["step"],
                layer,
                {
                    "ties_bf16": st["rows_tied_bf16"] / st["rows"],
                    "wq_norm": max(m["wq_norms"][layer]),
                    "max_logit": st["max_logit"],
                    "delta_err": st.get("delta_err"),
                    "delta_abs": st.get("delta_abs"),
                },
            )


def replay(run: dict, thresholds=None, until=None, **options) -> list[Alert]:
    """The alerts the rules fire over a stored run (readings before step ``until``), with
    no warning printed."""
    alerts = Alerts(thresholds, warn=False, **options)
    for step, layer, readings in run_readings(run):
        if until is None or step < until:
            alerts.update(step, layer, readings)
    return alerts.fired


def thresholds_from_runs(healthy, early=EARLY, window=WINDOW) -> dict:
    """Each rule's largest value over every layer and reading of the ``healthy`` runs."""
    top = {}
    for run in healthy:
        alerts = Alerts({key: None for key in RULES}, early=early, window=window, warn=False)
        for step, layer, readings in run_readings(run):
            for rule, value in alerts.values(step, layer, readings).items():
                if math.isfinite(value):
                    top[rule] = max(top.get(rule, -math.inf), value)
    return top


__all__ = [
    "Alert",
    "Alerts",
    "AttentionAlert",
    "make_alerts",
    "RULES",
    "NON_FINITE",
    "THRESHOLDS",
    "CEILINGS",
    "RELATIVE",
    "EARLY",
    "WARMUP_STEPS",
    "WINDOW",
    "replay",
    "run_readings",
    "thresholds_from_runs",
]
