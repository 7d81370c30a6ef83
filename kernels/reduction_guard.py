"""The guard of exercise ``ch2-rowmax`` (A row maximum in Triton): while a student's row maximum
runs, PyTorch's own reductions raise and every Triton launch is recorded, so the maxima must come
from the student's kernel.

One module for both places that run the answer: the chapter's check
(:mod:`kernels.triton_exercises`) imports it, and the grader's worker
(:mod:`kernels.course_lab.worker`), which may not import the book's package, loads this file by
its path. So it imports nothing from the package.
"""

from __future__ import annotations

import contextlib

# what is switched off, on ``torch`` and on ``torch.Tensor``
REDUCTIONS = ("amax", "max", "aminmax", "sort", "topk", "argmax", "cummax", "kthvalue", "msort")


@contextlib.contextmanager
def triton_only(launches: list):
    """Within the block PyTorch's reductions raise and every Triton launch is appended to
    ``launches`` as (kernel name, grid)."""
    import torch
    from triton.runtime.jit import KernelInterface

    def refuse(name):
        def reduction(*args, **kwargs):
            raise RuntimeError(
                f"torch {name} is switched off in this exercise: compute the maxima in your "
                "Triton kernel"
            )

        return reduction

    original_getitem = KernelInterface.__getitem__

    def getitem(self, grid):
        launches.append((getattr(self, "__name__", "kernel"), grid))
        return original_getitem(self, grid)

    saved = [(o, n, getattr(o, n)) for o in (torch, torch.Tensor) for n in REDUCTIONS]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, refuse(name))
        KernelInterface.__getitem__ = getitem
        yield
    finally:
        KernelInterface.__getitem__ = original_getitem
        for owner, name, fn in saved:
            setattr(owner, name, fn)
