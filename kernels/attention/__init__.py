"""Attention: the options of a call, the Triton kernels, the emulator, the fp64 reference.

Imports point one way: this package uses :mod:`kernels.numerics` and :mod:`kernels.env`, and
nothing in it imports from ``lab``, ``gpt2`` or ``gpu``.

* :mod:`.options`    :class:`AttentionOptions` (validated once), :func:`check_tensors` and
  :func:`~.options.checked_call` (all of a call's checks, and its rounding path); the offset
  rules and δ sources the kernels know, listed once
* :mod:`.tile_ops`   Triton helpers shared by the kernels (tiles, MMAs, ``offset_update``,
  ``accumulate``)
* :mod:`.flash_fwd`, :mod:`.flash_bwd`   the FlashAttention-2 kernels (Algorithms 1 and 2) and
  their host side; the eager backward pass (:func:`~.flash_bwd.backward_gradients`) sits
  beside the backward kernels
* :mod:`.launcher`   everything that makes a launch fast (plans, tuning, stored picks, compiles,
  TMA decisions); the kernels reach it through one call. Its speed-ups are one immutable
  :class:`Speedups` value, changed only inside ``with speedups(...)``, and ``LPFA_OFF`` (a comma
  list of speed-ups) switches some off for a whole process. Code outside this package uses the
  names below, never the launcher's modules
* :mod:`.emulator`   the numerics contract in PyTorch, forward and (paper numerics) backward
* :mod:`.reference`  the fp64 truth and torch's "standard" attention
* :mod:`.autograd`   :func:`flash_attention` and :func:`backward_pass`
* :mod:`.tiling`     chapter 3's step-by-step tiled implementations in PyTorch
* :mod:`.registry`   the one place an implementation is named: spelling, label, short label,
  ``run(name, q, k, v, opts)``
* :mod:`.exercises`  the checks of the exercises of chapters 3 and 4
"""

from .autograd import Gradients, backward_pass, flash_attention
from .launcher import (
    OFF_VARIABLE,
    TMA_MIN_HEAD_DIM,
    Launcher,
    Speedups,
    clear_plans,
    current as current_speedups,
    forget_compiled,
    n_bucket,
    off_in_children,
    plans_made,
    routes,
    speedups,
    stored_table,
    tma_usable,
    tune_every_bucket,
    tuned_entries,
)
from .options import AttentionOptions, check_tensors

__all__ = [
    "AttentionOptions",
    "check_tensors",
    "flash_attention",
    "backward_pass",
    "Gradients",
    # the launcher: its speed-ups and what the GPU tools measure (chapter 10 reads Launcher)
    "Launcher",
    "Speedups",
    "speedups",
    "current_speedups",
    "tune_every_bucket",
    "off_in_children",
    "OFF_VARIABLE",
    "TMA_MIN_HEAD_DIM",
    "tma_usable",
    "n_bucket",
    "clear_plans",
    "forget_compiled",
    "plans_made",
    "tuned_entries",
    "stored_table",
    "routes",
]
