"""A small GPT-2 for reproducing the BF16 flash-attention training failure (chapter 6).

model.py (the network, attention chosen per layer), attention.py (the paper's bf16 FA2 as an
autograd function), data.py (offline corpus, recorded batch order), train.py (the training loop,
DDP via torchrun), diagnostics.py (what is watched), search.py (many runs at once on one GPU).
"""
from .attention import AttnSpec, PaperFlashAttention, attend, exact_attention, parse_spec
from .data import BatchOrder, Corpus, load_corpus
from .model import GPT, GPTConfig

_TRAIN_NAMES = ("TrainConfig", "Trainer", "lr_at", "run_training")


def __getattr__(name):
    # train.py is imported lazily so that `python -m kernels.gpt2.train` runs it exactly once
    if name in _TRAIN_NAMES:
        import importlib
        return getattr(importlib.import_module(__name__ + ".train"), name)
    raise AttributeError(f"module 'kernels.gpt2' has no attribute {name!r}")


__all__ = ["AttnSpec", "PaperFlashAttention", "attend", "exact_attention", "parse_spec", "BatchOrder",
           "Corpus", "load_corpus", "GPT", "GPTConfig", *_TRAIN_NAMES]
