"""Chapter 2's small Triton kernels: a vector add, a row softmax, and the bf16 ``tl.dot`` trap.

The other trap (the interpreter's fp32 -> bf16 cast truncates) and its fix live in
:mod:`kernels.numerics.triton_rounding`, the one implementation of explicit rounding every kernel
uses.

Each kernel sits next to its Python wrapper, the way the Triton tutorials are written:
the ``@triton.jit`` function is what one *program* (one instance of the kernel) does, the
wrapper checks its inputs, allocates the output and launches a *grid* of programs.

Import :mod:`kernels` before this module so that, without a GPU, ``TRITON_INTERPRET=1`` is
set and the same kernels run in Triton's CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# --------------------------------------------------------------------------------------------
# 1. Vector add: programs, program ids, blocks, pointers, masks
# --------------------------------------------------------------------------------------------
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(axis=0)  # which block this program owns: 0, 1, 2, ...
    offsets = pid * BLOCK + tl.arange(0, BLOCK)  # the BLOCK indices of that block
    in_bounds = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=in_bounds)  # pointer + offsets = a block of addresses
    y = tl.load(y_ptr + offsets, mask=in_bounds)
    tl.store(out_ptr + offsets, x + y, mask=in_bounds)


def _check_same_device(*tensors):
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def vector_add(x: torch.Tensor, y: torch.Tensor, block: int = 256) -> torch.Tensor:
    """x + y for two 1-D tensors of the same shape and dtype, one program per ``block`` elements."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
        raise TypeError(f"x and y must be tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.ndim != 1 or x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
            f"need two 1-D tensors of one shape and dtype, got {tuple(x.shape)} {x.dtype}"
            f" and {tuple(y.shape)} {y.dtype}"
        )
    if not x.is_floating_point():
        raise TypeError(f"x and y must be floating-point tensors, got {x.dtype}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two (tl.arange needs one), got {block}")
    _check_same_device(x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.full_like(x, float("nan"))  # poisoned: an element no program writes stays NaN
    grid = (triton.cdiv(x.numel(), block),)  # enough programs to cover every element
    add_kernel[grid](x, y, out, x.numel(), BLOCK=block)
    return out


# --------------------------------------------------------------------------------------------
# 2. Row softmax: one program per row, a reduction inside the program
# --------------------------------------------------------------------------------------------
@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0)  # one program per row
    cols = tl.arange(0, BLOCK)  # BLOCK >= n_cols: the whole row in one block
    in_row = cols < n_cols
    # Masked lanes read -inf so they can neither win the max nor add to the sum (exp(-inf) = 0).
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=in_row, other=-float("inf"))
    x = x.to(tl.float32)
    row_max = tl.max(x, axis=0)  # softmax(x) = softmax(x - c) for any c:
    numerator = tl.exp(x - row_max)  # with c = max every exponent is <= 0, no overflow
    denominator = tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, numerator / denominator, mask=in_row)


def row_softmax(x: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension of a 2-D tensor, computed in fp32; returns fp32."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"need a 2-D tensor with at least one column, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    x = x.contiguous()
    out = torch.full(x.shape, float("nan"), dtype=torch.float32, device=x.device)  # poisoned
    block = triton.next_power_of_2(x.shape[1])
    softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), out.stride(0), BLOCK=block)
    return out


# --------------------------------------------------------------------------------------------
# 3. The bf16 tl.dot trap of the interpreter, and the upcast that avoids it
# --------------------------------------------------------------------------------------------
@triton.jit
def tile_dot_kernel(
    a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, UPCAST: tl.constexpr
):
    rows, inner, cols = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rows[:, None] * K + inner[None, :])  # (M, K) bf16 tile
    b = tl.load(b_ptr + inner[:, None] * N + cols[None, :])  # (K, N) bf16 tile
    if UPCAST:
        # bf16 -> fp32 is exact; a product of two bf16 values (8-bit significands) fits in
        # fp32's 24 bits, so "ieee" fp32 dot gives the same products as the bf16 tensor core.
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b)  # native bf16 dot, fp32 result
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], c)


def tile_dot(a: torch.Tensor, b: torch.Tensor, upcast: bool) -> torch.Tensor:
    """One program multiplies a bf16 (M, K) tile by a bf16 (K, N) tile; returns fp32 (M, N).

    Sizes must be powers of two >= 16 (what ``tl.dot`` accepts). ``upcast=False`` is the
    native bf16 ``tl.dot``; ``upcast=True`` converts both tiles to fp32 first.
    """
    if a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        raise TypeError(f"a and b must be bfloat16, got {a.dtype} and {b.dtype}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"cannot multiply shapes {tuple(a.shape)} and {tuple(b.shape)}")
    for size in (*a.shape, b.shape[1]):
        if size < 16 or size & (size - 1):
            raise ValueError(
                f"every size must be a power of two >= 16, got {tuple(a.shape)} @ {tuple(b.shape)}"
            )
    _check_same_device(a, b)
    c = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.float32, device=a.device)
    tile_dot_kernel[(1,)](
        a.contiguous(), b.contiguous(), c, a.shape[0], a.shape[1], b.shape[1], UPCAST=upcast
    )
    return c
