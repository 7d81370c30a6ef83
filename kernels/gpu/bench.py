"""Speed and memory measurements of attention implementations, reusable by the chapters.

GPU timings use ``triton.testing.do_bench`` (warm-up, then the median of many runs, the L2
cache flushed between runs) on random inputs (never zeros: zeros make some hardware paths
faster). A FLOP count turns a time into TFLOP/s, with the usual convention: the forward pass
does 4·B·H·N²·D flops (two matmuls), half of that when causal, and forward + backward counts
3.5 times the forward.

Memory: :func:`peak_memory_cuda` measures the extra peak allocation of a call on the GPU;
:func:`materialized_bytes` counts, on any device (the CPU included), the bytes of the tensors
that naive attention materialises versus the ones the flash kernel writes. Never present an
interpreter/CPU time as a GPU figure: the functions here refuse to time on the CPU.
"""
from __future__ import annotations

import math

import torch

from ..attention.reference import standard_attention

BENCH_SHAPES = [(8, 12, 1024, 64), (4, 16, 4096, 64), (2, 16, 8192, 128)]   # (B, H, N, D)


def attention_flops(batch, heads, n, d, causal=True, mode="fwd") -> float:
    """FLOPs of attention: 4·B·H·N²·D forward (halved if causal), ×3.5 for forward+backward."""
    if mode not in ("fwd", "fwd+bwd"):
        raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")
    flops = 4.0 * batch * heads * n * n * d
    if causal:
        flops /= 2
    return flops * (3.5 if mode == "fwd+bwd" else 1.0)


def random_inputs(batch, heads, n, d, dtype=torch.bfloat16, device="cuda", requires_grad=False):
    """q, k, v, dO ~ N(0, 1) of shape (batch, heads, n, d)."""
    out = [torch.randn(batch, heads, n, d, device=device, dtype=dtype) for _ in range(4)]
    for t in out[:3]:
        t.requires_grad_(requires_grad)
    return out


def _require_gpu():
    if not torch.cuda.is_available():
        raise RuntimeError("GPU timing needs a CUDA GPU; chapters read results/flash_bench.json "
                           "on the CPU instead of timing the interpreter")


def time_ms(fn, warmup=25, rep=100) -> float:
    """Median milliseconds of ``fn()`` on the GPU (triton.testing.do_bench)."""
    _require_gpu()
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def attention_step(attn, q, k, v, grad_out, mode):
    """A zero-argument callable running ``attn`` forward (and backward if mode says so)."""
    if mode == "fwd":
        def step():
            with torch.no_grad():
                return attn(q, k, v)
        return step

    def step():
        out = attn(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad_out)
    return step


def sdpa_fn(backend=None, causal=True):
    """torch SDPA restricted to one backend ('flash', 'cudnn', 'efficient', 'math' or None)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}

    def attn(q, k, v):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(backends[backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attn


def flash_fn(causal=True, **options):
    """The book's kernel with fixed options, as attn(q, k, v)."""
    from ..attention import flash_attention

    def attn(q, k, v):
        return flash_attention(q, k, v, causal=causal, **options)
    return attn


def measure_speed(name, attn, shape, mode, causal=True, dtype=torch.bfloat16) -> dict:
    """One row of a speed table: median ms and TFLOP/s, or the error if it cannot run."""
    _require_gpu()
    batch, heads, n, d = shape
    q, k, v, grad_out = random_inputs(batch, heads, n, d, dtype, "cuda", mode == "fwd+bwd")
    row = dict(impl=name, batch=batch, heads=heads, n=n, d=d, mode=mode, causal=causal,
               dtype=str(dtype).replace("torch.", ""))
    try:
        ms = time_ms(attention_step(attn, q, k, v, grad_out, mode))
    except Exception as exc:   # e.g. a backend unavailable for this shape or GPU
        row.update(ms=None, tflops=None, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        return row
    row.update(ms=ms, tflops=attention_flops(batch, heads, n, d, causal, mode) / ms * 1e-9)
    return row


def peak_memory_cuda(fn) -> int:
    """Extra bytes allocated at the peak while ``fn()`` runs (beyond what existed before)."""
    _require_gpu()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return int(peak)


def naive_attention_tensors(q, k, v, causal=True) -> dict:
    """Run standard attention step by step and report the bytes of each tensor it creates."""
    scale = 1.0 / math.sqrt(q.shape[-1])
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


def materialized_bytes(n, d=64, batch=1, heads=1, dtype=torch.bfloat16, causal=True,
                       device="cpu", **options) -> dict:
    """Total bytes materialised by naive attention and by the flash kernel at length ``n``.

    Runs both for real (in the interpreter on the CPU: keep ``n`` small) and sums the sizes of
    the tensors each one creates. The flash kernel's tiles live in registers/shared memory and
    never reach the allocator, so its total grows like N while naive attention's grows like N².
    """
    q, k, v, _ = random_inputs(batch, heads, n, d, dtype, device)
    naive = naive_attention_tensors(q, k, v, causal)
    flash = flash_attention_tensors(q, k, v, causal, **options)
    return dict(n=n, naive_bytes=sum(naive.values()), flash_bytes=sum(flash.values()),
                naive_parts=naive, flash_parts=flash)


def measure_memory(n, shape=(1, 16, None, 64), dtype=torch.bfloat16, causal=True,
                   mode="fwd") -> dict:
    """Peak extra GPU memory of the flash kernel and of naive attention at sequence length n."""
    batch, heads, _, d = shape
    q, k, v, grad_out = random_inputs(batch, heads, n, d, dtype, "cuda", mode == "fwd+bwd")
    row = dict(n=n, batch=batch, heads=heads, d=d, mode=mode, causal=causal,
               inputs_bytes=3 * q.nbytes)
    for name, attn in (("flash", flash_fn(causal)),
                       ("naive", lambda a, b, c: standard_attention(a, b, c, causal))):
        step = attention_step(attn, q, k, v, grad_out, mode)
        try:
            step()   # warm-up: compilation and autotuning allocate scratch memory once
            row[f"{name}_peak_bytes"] = peak_memory_cuda(step)
        except torch.cuda.OutOfMemoryError:
            row[f"{name}_peak_bytes"] = None
            torch.cuda.empty_cache()
    return row
