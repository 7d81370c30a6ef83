"""The host (CPU) cost of one attention call, measured with the kernel launches switched off.

A fused attention kernel at the GPT-2 shape (B8 H12 N1024 D64) runs for only ~60 µs
forward and ~200 µs backward on an H100. If the Python that prepares a call costs more than
that, the GPU waits for the CPU and the measured speed follows the host, not the kernel.

:func:`host_cost` times the book's wrapper (``flash_attention`` forward, and forward +
backward through autograd) with every Triton launch replaced by a no-op, so what is left is
the Python and PyTorch work around the launches: option handling, input checks, output
allocation, autograd bookkeeping, choosing tiles and grids. It runs anywhere (CPU tensors in
the Triton interpreter, whose launches are stubbed the same way) and is reported as *host
overhead on this machine*: a CPU figure, never a GPU one. What the launch itself costs
(Triton's argument binding and the driver call) needs a GPU: ``python -m kernels.gpu.perf``
measures the whole call there.

``python -m kernels.gpu.host`` prints the table.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

SHAPE = (2, 2, 128, 64)      # (B, H, N, D): small, so CPU allocations cost what a GPU's do


@contextlib.contextmanager
def launches_stubbed():
    """Every Triton kernel launch (interpreted or compiled) becomes a no-op inside the block;
    output buffers are not NaN-filled (that is a test aid, not part of a call)."""
    from triton.runtime import interpreter, jit
    from ..attention import launch
    saved = (interpreter.InterpretedFunction.run, jit.JITFunction.run, launch.POISON_OUTPUTS,
             getattr(launch, "FAST_LAUNCH", None))

    def no_op(self, *args, grid, warmup, **kwargs):
        return None

    interpreter.InterpretedFunction.run = no_op
    jit.JITFunction.run = no_op
    launch.POISON_OUTPUTS = False
    try:
        yield
    finally:
        (interpreter.InterpretedFunction.run, jit.JITFunction.run,
         launch.POISON_OUTPUTS) = saved[:3]


def _median_us(fn, calls, repeats):
    fn()                                    # first call: caches fill, nothing measured
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(per_call), min(per_call)


class _Identity(torch.autograd.Function):
    """The floor: an autograd function that allocates what attention allocates and nothing
    else (torch's own cost of a custom forward + backward)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def host_cost(shape=SHAPE, dtype=torch.bfloat16, device="cpu", causal=True, calls=300,
              repeats=7, **options) -> dict:
    """Median (and best) µs per call of the wrapper's host work, launches stubbed out."""
    from ..attention import flash_attention
    batch, heads, n, d = shape
    q, k, v, grad = (torch.randn(batch, heads, n, d, device=device).to(dtype) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            flash_attention(q, k, v, causal=causal, **options)

    def forward_backward():
        out = flash_attention(*leaves, causal=causal, **options)
        torch.autograd.grad(out, leaves, grad)

    def floor():
        out = _Identity.apply(*leaves)
        torch.autograd.grad(out, leaves, grad)

    rows = {}
    with launches_stubbed():
        for name, fn in (("forward", forward), ("forward+backward", forward_backward),
                         ("autograd floor", floor)):
            median, best = _median_us(fn, calls, repeats)
            rows[name] = dict(median_us=median, best_us=best)
    rows["backward (difference)"] = dict(
        median_us=rows["forward+backward"]["median_us"] - rows["forward"]["median_us"],
        best_us=rows["forward+backward"]["best_us"] - rows["forward"]["best_us"])
    return rows


def main():
    import kernels  # noqa: F401  (interpreter switch before triton)
    rows = host_cost()
    print(f"host overhead per call on this machine's CPU, launches stubbed out, shape "
          f"B{SHAPE[0]} H{SHAPE[1]} N{SHAPE[2]} D{SHAPE[3]} bf16 causal")
    for name, r in rows.items():
        print(f"  {name:22s} median {r['median_us']:7.1f} µs   best {r['best_us']:7.1f} µs")


if __name__ == "__main__":
    main()
