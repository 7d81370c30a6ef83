"""How every measurement in the book times attention: chapter 10's script
(``python -m kernels.gpu.perf``), the whole-GPU check (``python -m kernels.gpu.check``) and the
lab's GPU script (``python -m kernels.rounding_lab.fixes_gpu``) all use the functions here.

GPU timings use ``triton.testing.do_bench`` (warm-up, then the median of many runs, the L2 cache
flushed between runs) on random inputs (never zeros: zeros make some hardware paths faster). A
FLOP count turns a time into TFLOP/s, with the usual convention: the forward pass does
4·B·H·N²·D flops (two matmuls of 2·N²·D per head), half of that when causal, and forward +
backward counts 3.5 times the forward. Never present an interpreter/CPU time as a GPU figure:
:func:`time_ms` refuses to time on the CPU unless asked to (``cpu=True``, a test of a script's
logic whose provenance says it ran without a GPU).

The implementations come from :mod:`kernels.attention.registry` (``runner(name)``); the
speed-up switches are changed with :func:`kernels.attention.speedups`.
"""

from __future__ import annotations

import statistics
import time

import torch

from .interpreter import interpreting

MODES = ("fwd", "fwd+bwd")


def on_gpu() -> bool:
    """True when kernels run on a CUDA GPU (not in the Triton interpreter)."""
    return torch.cuda.is_available() and not interpreting()


def attention_flops(batch, heads, n, d, causal=True, mode="fwd") -> float:
    """FLOPs of attention: 4·B·H·N²·D forward (halved if causal), ×3.5 for forward+backward."""
    if mode not in MODES:
        raise ValueError(f"mode must be 'fwd' or 'fwd+bwd', got {mode!r}")
    flops = 4.0 * batch * heads * n * n * d
    if causal:
        flops /= 2
    return flops * (3.5 if mode == "fwd+bwd" else 1.0)


def inputs(shape, dtype=torch.bfloat16, device="cuda", seed=0) -> list[torch.Tensor]:
    """q, k, v, dO ~ N(0, 1) of ``shape`` (B, H, N, D); ``seed`` None: the global generator."""
    gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*shape, device=device, dtype=dtype, generator=gen) for _ in range(4)]


def _require_gpu():
    if not on_gpu():
        raise RuntimeError(
            "GPU timing needs a CUDA GPU; chapters read results/*.json on the "
            "CPU instead of timing the interpreter"
        )


def time_ms(fn, warmup=25, rep=100, cpu=False) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on a GPU. Without one, a
    RuntimeError, or with ``cpu=True`` the wall-clock median of two calls (a test of a
    script's logic, never a GPU figure)."""
    if on_gpu():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    if not cpu:
        _require_gpu()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def step(attn, q, k, v, grad, mode):
    """A zero-argument callable: ``attn`` forward (no autograd graph), or forward + backward
    (gradients of fresh leaves made from q, k, v)."""
    if mode == "fwd":

        def forward():
            with torch.no_grad():
                return attn(q, k, v)

        return forward
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def forward_backward():
        out = attn(*leaves)
        return torch.autograd.grad(out, leaves, grad)

    return forward_backward


def row_of(name, shape, dtype_name, causal, mode) -> dict:
    """The fields that say what a speed row measured (its numbers come after them)."""
    batch, heads, n, d = shape
    return dict(
        impl=name, dtype=dtype_name, causal=causal, batch=batch, heads=heads, n=n, d=d, mode=mode
    )


def speed_row(
    name,
    attn,
    tensors,
    shape,
    dtype_name,
    causal,
    mode,
    *,
    peak=None,
    warmup=25,
    rep=100,
    cpu=False,
) -> dict:
    """One row of a speed table: median ms and TFLOP/s (and their ``fraction_of_peak`` of
    ``peak`` TFLOP/s when given), or the error when the implementation cannot run the case."""
    row = row_of(name, shape, dtype_name, causal, mode)
    batch, heads, n, d = shape
    run = step(attn, *tensors, mode)
    try:
        run()  # compile / autotune / fail here, outside the timing
        ms = time_ms(run, warmup, rep, cpu)
    except Exception as exc:  # a backend that cannot run this case says why
        row.update(
            ms=None,
            tflops=None,
            error=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:240]}",
        )
        if peak:
            row["fraction_of_peak"] = None
        return row
    tflops = attention_flops(batch, heads, n, d, causal, mode) / ms * 1e-9
    row.update(ms=ms, tflops=tflops)
    if peak:
        row["fraction_of_peak"] = tflops / peak
    return row


def measure_speed(name, attn, shape, mode, causal=True, dtype=torch.bfloat16) -> dict:
    """:func:`speed_row` on fresh random GPU inputs of ``shape`` (the check's speed table)."""
    _require_gpu()
    tensors = inputs(shape, dtype, "cuda", seed=None)
    return speed_row(name, attn, tensors, shape, str(dtype).replace("torch.", ""), causal, mode)


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


# --- host time against GPU time, and a run's budget ---------------------------------------
def profile_kernels(step, calls):
    """torch.profiler over ``calls`` calls: the GPU time of the kernels they launch (µs per
    call, by kernel; empty without a GPU) and the CPU time of the top-level operations
    (µs per call, by name: the autograd function's forward, its backward, ...)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if on_gpu():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            step()
        if on_gpu():
            torch.cuda.synchronize()
    kernels_us: dict = {}
    cpu_us: dict = {}
    for event in prof.events():
        us = (event.time_range.end - event.time_range.start) / calls
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels_us[event.name] = kernels_us.get(event.name, 0.0) + us
        elif event.cpu_parent is None:
            cpu_us[event.name] = cpu_us.get(event.name, 0.0) + us
    top = lambda d: dict(sorted(d.items(), key=lambda kv: -kv[1])[:8])  # noqa: E731
    return top(kernels_us), top(cpu_us), sum(kernels_us.values())


def host_us_per_call(fn, calls, repeats) -> tuple[float, float]:
    """(median, best) µs per call of ``fn()`` on the host, over ``repeats`` runs of ``calls``
    calls after two unmeasured ones (caches fill): the wrapper's cost with the GPU taken out
    (:mod:`kernels.gpu.host_cost`)."""
    fn()
    fn()
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(per_call), min(per_call)


def host_and_wall_us(step, calls):
    """Host µs to issue one call (no synchronisation inside the loop) and wall µs per call
    of the whole stream (synchronised at the end): the larger of host and GPU time."""
    sync = torch.cuda.synchronize if on_gpu() else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    issued = time.perf_counter()
    sync()
    end = time.perf_counter()
    return (issued - start) / calls * 1e6, (end - start) / calls * 1e6


class Budget:
    """Wall-clock budget of a whole run; its sections ask before they start, and what did not
    fit is listed in :attr:`skipped` (and said through ``log``)."""

    def __init__(self, seconds, log=print, start=None):
        self.start = time.time() if start is None else start  # a time.time() value
        self.seconds, self.log = seconds, log
        self.skipped: list[str] = []

    def elapsed(self):
        return time.time() - self.start

    def left(self):
        return self.seconds - self.elapsed()

    def allows(self, what, need):
        if self.left() >= need:
            return True
        self.skipped.append(f"{what}: needs ~{need:.0f} s, {max(self.left(), 0):.0f} s left")
        self.log(f"SKIP {what} ({self.left():.0f} s left, needs ~{need:.0f} s)")
        return False
