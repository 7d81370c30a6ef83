"""Memory of attention implementations, reusable by the chapters (timing:
:mod:`kernels.timing`).

:func:`materialized_bytes` counts, on any device (the CPU included), the bytes of the tensors
that naive attention materialises versus the ones the flash kernel writes; the GPU's peak
allocation is measured by :func:`kernels.gpu.perf.memory` (``perf_memory.json``).
"""

from __future__ import annotations

import math

import torch

from .. import timing
from ..attention.reference import default_scale


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
