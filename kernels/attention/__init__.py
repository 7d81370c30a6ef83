"""Attention: the options of a call, the Triton kernels, the emulator, the fp64 reference.

Imports point one way: this package uses :mod:`kernels.numerics` and :mod:`kernels.env`, and
nothing in it imports from ``lab``, ``gpt2`` or ``gpu``.

* :mod:`.options`    :class:`AttentionOptions` (validated once) and :func:`check_tensors`
* :mod:`.jit`        Triton helpers shared by the kernels (tiles, MMAs, ``offset_update``,
  ``accumulate``); :mod:`.launch` the Python side of a launch, :mod:`.speedups` its switches,
  :mod:`.tuning` parallel compiles and the stored autotuning picks
* :mod:`.flash_fwd`, :mod:`.flash_bwd`   the FlashAttention-2 kernels (Algorithms 1 and 2)
* :mod:`.emulator`   the numerics contract in PyTorch, forward and (paper numerics) backward
* :mod:`.reference`  the fp64 truth and torch's "standard" attention
* :mod:`.autograd`   :func:`flash_attention` and :func:`backward_pass`
* :mod:`.tiling`     chapter 3's step-by-step tiled implementations in PyTorch
* :mod:`.registry`   the one place an implementation is named: spelling, label, short label,
  ``run(name, q, k, v, opts)``
* :mod:`.exercises`  the checks of the exercises of chapters 3 and 4
"""

from .autograd import Gradients, backward_pass, flash_attention
from .options import AttentionOptions, check_tensors

__all__ = ["AttentionOptions", "check_tensors", "flash_attention", "backward_pass", "Gradients"]
