"""The Python side of a kernel launch, shared by the forward and backward passes.

Which rounding path runs (:func:`use_explicit`), how tensors travel into a kernel
(:func:`as_kernel_arg`), the output buffers (NaN-poisoned when :data:`POISON_OUTPUTS` is on, so an
unwritten entry shows), the scalar parameters (:func:`kernel_params`, cached) and the tile sizes
(:func:`pick_blocks`).
"""
from __future__ import annotations

import functools

import torch

from ..env import interpreting, native_bf16

INTERPRETER_BLOCKS = (64, 64)   # fixed (block_m, block_n) in the CPU interpreter (the
                                # emulator's default block_n is 64 too)

# Fill outputs with NaN before each launch so a missed write shows (the tests turn it on; on a
# GPU it costs an extra memset per output, so it is off there by default).
POISON_OUTPUTS = interpreting()

_PARAMS_CACHE: dict = {}


@functools.lru_cache(maxsize=1)
def _native_bf16() -> bool:
    return native_bf16()   # cached: it queries the device, and this runs on every call


def use_explicit(explicit=None) -> bool:
    """The rounding path: explicit iff interpreting or the GPU is older than sm_80."""
    if explicit is None:
        return not _native_bf16()
    if not isinstance(explicit, bool):
        raise TypeError(f"explicit must be None, True or False, got {explicit!r}")
    if not explicit and not _native_bf16():
        raise ValueError("explicit=False needs a CUDA GPU with compute capability >= 8.0 "
                         "(the interpreter and older GPUs cannot round bf16 in hardware)")
    return explicit


def check_device(q) -> None:
    """CPU tensors need the interpreter; GPU tensors need it switched off."""
    if q.device.type == "cuda" and interpreting():
        raise ValueError("TRITON_INTERPRET=1 is set but the tensors are on the GPU: move them "
                         "to the CPU or unset TRITON_INTERPRET before importing kernels")
    if q.device.type == "cpu" and not interpreting():
        raise ValueError("CPU tensors need the Triton interpreter (import kernels before triton "
                         "on a machine without a GPU), or move the tensors to the GPU")


def as_kernel_arg(t: torch.Tensor, explicit: bool) -> torch.Tensor:
    """On the explicit path bf16 tensors travel as their raw 16-bit patterns."""
    return t.view(torch.int16) if (explicit and t.dtype == torch.bfloat16) else t


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def new_output(shape, dtype, device):
    if POISON_OUTPUTS:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def kernel_params(scale, beta, eps, dtype, device, cap=0.0) -> torch.Tensor:
    """scale, beta, eps and the offset cap as a tiny tensor of the working dtype (fp64 stays
    exact for fp64).

    Cached: building it each call would be a blocking host-to-GPU copy per attention call."""
    key = (float(scale), float(beta), float(eps), float(cap), work_dtype(dtype), str(device))
    if key not in _PARAMS_CACHE:
        if len(_PARAMS_CACHE) > 256:
            _PARAMS_CACHE.clear()
        _PARAMS_CACHE[key] = torch.tensor(key[:4], dtype=key[4], device=device)
    return _PARAMS_CACHE[key]


def pick_blocks(block_m, block_n, dtype, explicit, backward=False):
    """Caller's blocks; else fixed ones in the interpreter and for the fp32-dot paths (fp32,
    fp64, explicit rounding); else None: autotune (native bf16/fp16 on a GPU)."""
    if block_m is None and block_n is None and not interpreting() and not explicit \
            and dtype in (torch.bfloat16, torch.float16):
        return None
    if interpreting():
        dm, dn = INTERPRETER_BLOCKS
    elif dtype == torch.float64:
        dm, dn = 32, 32
    else:
        dm, dn = (32, 64) if backward else (64, 32)
    return (block_m or dm, block_n or dn)
