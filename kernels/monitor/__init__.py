"""A monitor readers attach to their own training run (chapter 9).

    from kernels.monitor import AttentionMonitor
    monitor = AttentionMonitor.attach(model, every=100, path="runs/monitor.csv")
    ...                             # in the training loop, before the forward pass:
    monitor.step(step)

Per attention layer and head, every ``every`` steps: the share of softmax rows with
repeated maxima counted two ways (``ties_bf16``: a bf16 S with >= 2 entries equal to the
row maximum; ``p1_fa2``: an fp32 S with >= 2 entries whose P̄ = exp(S − rowmax) rounds
to 1.0 in bf16), ‖W_Q‖₂ (``wq_norm``), the largest logit (``max_logit``) and, with
``delta=True``, Σ_T(δ_lp − δ_hp) and Σ_T|δ_lp − δ_hp| (``delta_err``, ``delta_abs``).

metrics.py (the pure functions; :mod:`kernels.gpt2.diagnostics` imports them from here),
layers.py (finding the attention layers), monitor.py (the monitor), hooks.py (its hooks),
safety.py (NaN for a reading that cannot be made, never an exception in the step),
sinks.py (CSV, JSON lines, TensorBoard, any callable), alerts.py (thresholds from the
stored runs, a warning once per crossing, ceilings from step 0), readings.py (the cost of
a step, thresholds from stored runs, heads combined per layer), callbacks.py (a Hugging
Face TrainerCallback and a Lightning Callback), exercises.py (the chapter's exercise
checks). It imports only :mod:`kernels.numerics`. The fix practitioners can train with
(δ from rowsum(dP∘P), for Hugging Face's ``attn_implementation=`` and nanoGPT's SDPA
call) is :mod:`kernels.attention.hf_attention`; chapter 9's GPU measurements are
:mod:`kernels.gpt2.monitor_gpu`.
"""

from .alerts import THRESHOLDS, Alert, Alerts, AttentionAlert, replay
from .metrics import (
    causal_scores,
    delta_error,
    exact_output,
    head_readings,
    max_logit,
    rows_rounding_to_one,
    rows_with_tied_max,
    spectral_norm,
    wq_head_norms,
)
from .monitor import LAYOUTS, METRICS, ROWS_KEPT, AttentionMonitor, find_attention, query_weight
from .readings import LAYER_RULES, ceiling_and_lead, layer_table, time_steps
from .sinks import COLUMNS, read_rows

__all__ = [
    "AttentionMonitor",
    "METRICS",
    "ROWS_KEPT",
    "LAYOUTS",
    "COLUMNS",
    "Alert",
    "Alerts",
    "AttentionAlert",
    "THRESHOLDS",
    "replay",
    "find_attention",
    "query_weight",
    "read_rows",
    "time_steps",
    "ceiling_and_lead",
    "layer_table",
    "LAYER_RULES",
    "causal_scores",
    "delta_error",
    "exact_output",
    "head_readings",
    "max_logit",
    "rows_rounding_to_one",
    "rows_with_tied_max",
    "spectral_norm",
    "wq_head_norms",
]
