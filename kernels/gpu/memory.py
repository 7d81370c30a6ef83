"""Memory of attention implementations, reusable by the chapters (timing:
:mod:`kernels.timing`).

:func:`kernels.timing.peak_memory_cuda` measures the extra peak allocation of a call on the
GPU (:func:`measure_memory` uses it); :func:`materialized_bytes` counts, on any device (the
CPU included), the bytes of the tensors that naive attention materialises versus the ones the
flash kernel writes.
"""

from __future__ import annotations

import math

import torch

from .. import timing
from ..attention import registry
from ..attention.reference import default_scale

BENCH_SHAPES = [(8, 12, 1024, 64), (4, 16, 4096, 64), (2, 16, 8192, 128)]  # (B, H, N, D)


def naive_attention_tensors(q, k, v, causal=True) -> dict:
    """Run standard attention step by step and report the bytes of each tensor it creates."""
    scale = default_scale(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale
    sizes = {"scores S (N×N)": scores.nbytes}
    if causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(1)
        sizes["causal mask (N×N)"] = hidden.nbytes
        scores = scores.masked_fill(hidden, -math.inf)
        sizes["masked S (N×N)"] = scores.nbytes
    probs = torch.softmax(scores, dim=-1)
    sizes["probabilities P (N×N)"] = probs.nbytes
    out = probs @ v
    sizes["output O"] = out.nbytes
    return sizes


def flash_attention_tensors(q, k, v, causal=True, **options) -> dict:
    """Bytes of the tensors the flash forward writes to memory: O and L (one float per row)."""
    from ..attention.flash_fwd import flash_forward

    out, lse, _ = flash_forward(q, k, v, causal=causal, **options)
    return {"output O": out.nbytes, "log-sum-exp L": lse.nbytes}


def materialized_bytes(
    n, d=64, batch=1, heads=1, dtype=torch.bfloat16, causal=True, device="cpu", **options
) -> dict:
    """Total bytes materialised by naive attention and by the flash kernel at length ``n``.

    Runs both for real (in the interpreter on the CPU: keep ``n`` small) and sums the sizes of
    the tensors each one creates. The flash kernel's tiles live in registers/shared memory and
    never reach the allocator, so its total grows like N while naive attention's grows like N².
    """
    q, k, v, _ = timing.inputs((batch, heads, n, d), dtype, device, seed=None)
    naive = naive_attention_tensors(q, k, v, causal)
    flash = flash_attention_tensors(q, k, v, causal, **options)
    return dict(
        n=n,
        naive_bytes=sum(naive.values()),
        flash_bytes=sum(flash.values()),
        naive_parts=naive,
        flash_parts=flash,
    )


def measure_memory(
    n, shape=(1, 16, None, 64), dtype=torch.bfloat16, causal=True, mode="fwd"
) -> dict:
    """Peak extra GPU memory of the flash kernel and of naive attention at sequence length n."""
    batch, heads, _, d = shape
    q, k, v, grad_out = timing.inputs((batch, heads, n, d), dtype, "cuda", seed=None)
    row = dict(
        n=n, batch=batch, heads=heads, d=d, mode=mode, causal=causal, inputs_bytes=3 * q.nbytes
    )
    for name, attn in (
        ("flash", registry.runner("triton", causal=causal)),
        ("naive", registry.runner("torch_math", causal=causal)),
    ):
        step = timing.step(attn, q, k, v, grad_out, mode)
        try:
            step()  # warm-up: compilation and autotuning allocate scratch memory once
            row[f"{name}_peak_bytes"] = timing.peak_memory_cuda(step)
        except torch.cuda.OutOfMemoryError:
            row[f"{name}_peak_bytes"] = None
            torch.cuda.empty_cache()
    return row
