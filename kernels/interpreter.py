"""The Triton interpreter: switched on where there is no CUDA GPU, and two of its traps mended.

Without a GPU every kernel of the book runs in Triton's CPU interpreter (``TRITON_INTERPRET=1``).
:func:`configure_triton` turns it on, and must run before any module defining kernels is
imported (``import kernels`` does it first). It also mends two things the interpreter gets wrong
for this book: loop bounds computed from program ids under NumPy >= 2.4, and ``tl.dot``, whose
bits would otherwise depend on the CPU's BLAS kernel.

This file imports nothing from the package (the course lab's grader loads it by its path).
"""

from __future__ import annotations

import os


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def configure_triton() -> bool:
    """Turn on the Triton interpreter when there is no CUDA GPU. Returns True if it is on.

    ``TRITON_INTERPRET`` is read by ``triton.jit`` when a kernel is decorated, so this must run
    before any module defining kernels is imported. A value the user already set is respected.
    """
    if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreting():
        _fix_interpreter_loop_bounds()
        _fix_interpreter_dot()
    return interpreting()


def _fix_interpreter_loop_bounds() -> None:
    """Let the interpreter use program-id-derived values as ``range`` bounds under NumPy >= 2.4.

    The interpreter keeps scalars as 1-element arrays and converts them with ``int(array)``,
    which NumPy 2.4 refuses for arrays of one dimension. We re-register ``__index__`` so it reads
    the single element. Compiled GPU kernels never go through this code.
    """
    from triton.runtime import interpreter

    if getattr(interpreter, "_lpfa_index_fix", False):
        return
    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch
    interpreter._lpfa_index_fix = True


def _fix_interpreter_dot() -> None:
    """Give the interpreter's ``tl.dot`` the same bits on every CPU, whatever the tile layout.

    The interpreter hands ``tl.dot`` to ``np.matmul``, i.e. to whichever BLAS kernel NumPy's
    OpenBLAS picks for this CPU (AVX2, AVX-512, ...) and for the operands' memory layout: a K
    tile read through a descriptor and transposed sums in another order than a pointer load
    of Kᵀ. Here the dot forms every product exactly in fp64 (a product of two fp32 values
    has at most 48 significant bits), adds them one k after another (an elementwise add
    over the (M, N) tile per k: no BLAS, no SIMD-dependent order), adds the accumulator and
    rounds once to its dtype. The result is that of a fused multiply-add chain carried in
    fp64: as accurate as an fp32 dot can be, and identical on every machine.
    """
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_lpfa_dot_fix", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        kinds = (a.dtype, b.dtype)
        if any(not t.is_floating() or t.is_bf16() or t.primitive_bitwidth == 8 for t in kinds):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        a64 = np.ascontiguousarray(a.data, dtype=np.float64)  # one layout, whatever the load
        b64 = np.ascontiguousarray(b.data, dtype=np.float64)
        products = a64[..., :, :, None] * b64[..., None, :, :]  # (..., M, K, N), exact
        total = np.add.reduce(products, axis=-2)  # k by k: the reduced axis is not the inner one
        out = (total + d.data.astype(np.float64)).astype(d.data.dtype)
        return interpreter.TensorHandle(out, d.dtype.scalar)

    builder.create_dot = create_dot
    builder._lpfa_dot_fix = True


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
