"""Rounding to bf16 / fp16 inside Triton kernels, done the same way on every machine.

A GPU of compute capability 8.0 or newer rounds an fp32 value to bf16 in hardware
(``x.to(tl.bfloat16)``, round-to-nearest, ties to even). Two places cannot:

* the Triton interpreter on the CPU, whose fp32 -> bf16 cast *truncates*;
* GPUs older than sm_80 (Colab's T4), where Triton cannot emit bf16 instructions at all.

There we keep every bf16 value in an fp32 register and round it ourselves with integer
arithmetic on the fp32 bit pattern. An fp32 number is ``sign | 8 exponent bits | 23 mantissa
bits``; bf16 keeps the top 16 bits. Rounding to nearest-even means: add half of the dropped
part (``0x7FFF``) plus one more if the kept last bit is odd (so an exact tie goes to the even
neighbour), then clear the low 16 bits. A carry out of the mantissa bumps the exponent, which
is exactly right (and turns the largest finite values into infinity, as the hardware does).
NaN is the one input that needs care: it is kept NaN (quiet, sign preserved).

fp16 rounding needs no bit tricks: the interpreter's ``.to(tl.float16)`` is NumPy's correct
round-to-nearest-even and every CUDA GPU converts fp32 -> fp16 in hardware.

Everything here is a ``@triton.jit`` helper (inlined into the calling kernel) plus one tiny
test kernel, :func:`round_tensor`, that the tests and chapter 1 use to check the helper
against torch's own ``.to(torch.bfloat16)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Codes for the low-precision format a kernel rounds to (compile-time constants).
LOW_BF16, LOW_FP16, LOW_FP32, LOW_FP64 = 0, 1, 2, 3
LOW_CODES = {
    torch.bfloat16: LOW_BF16,
    torch.float16: LOW_FP16,
    torch.float32: LOW_FP32,
    torch.float64: LOW_FP64,
}
_BF16 = tl.constexpr(LOW_BF16)
_FP16 = tl.constexpr(LOW_FP16)


@triton.jit
def round_to_bf16(x):
    """Nearest bf16 value of the fp32 tensor ``x`` (ties to even), returned as fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    odd = (bits >> 16) & 1  # last bit bf16 keeps
    rounded = ((bits + 0x7FFF + odd) >> 16) << 16  # add half an ulp (-1 if even), drop 16 bits
    quiet_nan = ((bits >> 16) | 0x0040) << 16  # NaN stays NaN, made quiet, sign kept
    out = tl.where(x != x, quiet_nan, rounded)
    return out.to(tl.float32, bitcast=True)


@triton.jit
def round_to_fp16(x):
    """Nearest fp16 value of the fp32 tensor ``x`` (ties to even), returned as fp32."""
    return x.to(tl.float16).to(tl.float32)


@triton.jit
def round_low(x, LOW: tl.constexpr, EXPLICIT: tl.constexpr):
    """Round the working-precision tensor ``x`` to the low format ``LOW``, keep ``x``'s dtype.

    ``EXPLICIT`` picks the integer-arithmetic bf16 rounding (interpreter, pre-sm_80 GPUs);
    otherwise the hardware cast does it. fp32 and fp64 "rounding" is the identity.
    """
    if LOW == _BF16:
        if EXPLICIT:
            return round_to_bf16(x)
        else:
            return x.to(tl.bfloat16).to(tl.float32)
    elif LOW == _FP16:
        return round_to_fp16(x)
    else:
        return x


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, EXPLICIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, round_low(x, _BF16, EXPLICIT), mask=mask)


def round_tensor(x: torch.Tensor, explicit: bool = True, block: int = 1024) -> torch.Tensor:
    """Round an fp32 tensor to bf16 with the Triton helper; result as fp32 (for checking).

    ``explicit=False`` uses the hardware cast instead (only meaningful on a GPU >= sm_80).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x must be float32, got {x.dtype}")
    flat = x.contiguous().view(-1)
    out = torch.full_like(flat, float("nan"))
    grid = (triton.cdiv(flat.numel(), block),)
    _round_kernel[grid](flat, out, flat.numel(), EXPLICIT=explicit, BLOCK=block)
    return out.view(x.shape)
