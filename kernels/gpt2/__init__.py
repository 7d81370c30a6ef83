"""A small GPT-2 for reproducing the BF16 flash-attention training failure (chapter 7).

model.py (the network, attention chosen per layer), attention.py (attention specs: which
implementation each layer uses), controls.py (δ controls that tell a biased error from a large one),
data.py (offline corpus, recorded batch order), config.py (one run's options, checked once, as
JSON), train.py (the training loop, resumable bit-identically, DDP via torchrun), diagnostics.py
(what is watched), plans.py (the variants and named plans of runs), search.py (many runs at once,
dealt over the visible GPUs, resumed across calls), report.py (reading stored runs and the chapter's
figures), screen.py (the testbed screen's table: whose control stays healthy), testbed.py (the
second testbed's arms: survival and per-head ‖W_Q‖), chapter_tables.py and chapter_fixes.py (the
chapter's printed tables and glued numbers, sections 2–6 and 7–8), chapter_figures.py (its small
figures of a few runs), exercises.py (the chapter's exercise checks).
"""

from ..attention.emulator import EmulatedAttention
from .attention import AttnSpec, attend, exact_attention, parse_spec
from .data import BatchOrder, Corpus, load_corpus
from .model import GPT, GPTConfig
from .plans import PLANS, VARIANTS, plan, variant_options

_TRAIN_NAMES = ("TrainConfig", "Trainer", "lr_at", "run_training")


def __getattr__(name):
    # train.py is imported lazily so that `python -m kernels.gpt2.train` runs it exactly once
    if name in _TRAIN_NAMES:
        import importlib

        return getattr(importlib.import_module(__name__ + ".train"), name)
    raise AttributeError(f"module 'kernels.gpt2' has no attribute {name!r}")


__all__ = [
    "AttnSpec",
    "EmulatedAttention",
    "attend",
    "exact_attention",
    "parse_spec",
    "BatchOrder",
    "Corpus",
    "load_corpus",
    "GPT",
    "GPTConfig",
    "PLANS",
    "VARIANTS",
    "plan",
    "variant_options",
    *_TRAIN_NAMES,
]
