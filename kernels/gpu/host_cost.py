"""The host (CPU) cost of one attention call, measured with the GPU taken out.

A fused attention kernel at the GPT-2 shape (B8 H12 N1024 D64) runs for only ~60 µs forward
and ~200 µs backward on an H100. If the Python that prepares a call costs more than that, the
GPU waits for the CPU and the measured speed follows the host, not the kernel.

This module times the book's wrapper (``flash_attention`` forward, and forward + backward
through autograd) on CPU tensors with the GPU replaced by nothing, in one of two ways:

``"stub"``
    every Triton launch is a no-op: what is left is the wrapper's own Python and PyTorch work
    (options, checks, output allocation, autograd bookkeeping, plans and grids);
``"triton"``
    Triton's real launch path runs (autotuner lookup, argument binding and specialisation,
    kernel-cache lookup, the launcher's Python side) as on a GPU machine: the native bf16 path
    is taken, the compiled kernel is a stand-in and only the final driver call is skipped.
    This needs a fresh process (Triton must not be in interpreter mode), so :func:`host_cost`
    runs it in a subprocess.

Both are *host overhead on this machine's CPU*: CPU figures, never GPU ones (and a CPU
allocator, not CUDA's caching one). What a whole call costs on a GPU, including the driver
call, is measured by ``python -m kernels.gpu.perf``.

``python -m kernels.gpu.host_cost`` prints both tables. On a GPU machine,
``python -m kernels.gpu.host_cost --gpu`` measures instead what one eager forward + backward at
GPT-2's shape costs the host there, for the book's kernel, SDPA flash and cuDNN, beside *torch's
floor*: an autograd function that launches nothing, through the same ``torch.autograd.grad``
round trip (:func:`gpu_floor`, stored as ``results/host_floor.json``); where each one's host
time goes, function by function: :mod:`.host_profile`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

SHAPE = (2, 2, 128, 64)  # (B, H, N, D): small, so CPU allocations stay cheap
MODES = ("stub", "triton")


@contextlib.contextmanager
def launches_stubbed():
    """Every Triton kernel launch (interpreted or compiled) becomes a no-op inside the block;
    output buffers are not NaN-filled (that is a test aid, not part of a call)."""
    from triton.runtime import interpreter, jit

    from ..attention import speedups

    saved = (interpreter.InterpretedFunction.run, jit.JITFunction.run)

    def no_op(self, *args, grid, warmup, **kwargs):
        return None

    interpreter.InterpretedFunction.run = no_op
    jit.JITFunction.run = no_op
    try:
        with speedups(poison_outputs=False):
            yield
    finally:
        (interpreter.InterpretedFunction.run, jit.JITFunction.run) = saved


@contextlib.contextmanager
def triton_launch_simulated():
    """Triton's launch path as on an sm_90 GPU, with a stand-in compiled kernel whose driver
    call does nothing. Needs a process where ``TRITON_INTERPRET=0`` was set before
    ``import kernels``. Autotuning picks each kernel's first configuration (nothing to time),
    and those stand-in timings are kept off Triton's on-disk autotuning cache."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime import autotuner, driver, jit

    from ..attention import options, speedups

    class Driver:  # what JITFunction.run asks the driver
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    def no_driver_call(*args):  # CudaLauncher.__call__ stands here
        return None

    def stand_in(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = CompiledKernel.__new__(CompiledKernel)
        kernel.module, kernel.function, kernel.packed_metadata = object(), None, ()
        kernel._run, kernel.name, kernel.src = no_driver_call, self.__name__, None
        self.device_caches[device][0][key] = kernel  # cached, as a compiled kernel is
        return kernel

    patched = [
        (jit.JITFunction, "_do_compile"),
        (autotuner.Autotuner, "_bench"),
        (driver, "_active"),
        (options, "_native_bf16"),
        (options, "check_device"),
        (autotuner.Autotuner, "check_disk_cache"),
    ]
    saved = [getattr(owner, name) for owner, name in patched]
    jit.JITFunction._do_compile = stand_in
    autotuner.Autotuner._bench = lambda self, *args, config, **meta: [1.0, 1.0, 1.0]
    autotuner.Autotuner.check_disk_cache = lambda self, key, configs, bench: bench()
    driver.set_active(Driver())
    options._native_bf16 = lambda: True  # take the native path (no explicit rounding)
    options.check_device = lambda q: None  # CPU tensors, as if on the GPU
    modules = _modules_holding(saved[4])
    for module in modules:
        module.check_device = options.check_device
    try:
        with speedups(poison_outputs=False):
            yield
    finally:
        for (owner, name), value in zip(patched, saved):
            setattr(owner, name, value)
        for module in modules:
            module.check_device = saved[4]


def _modules_holding(fn):
    """The kernels modules that imported ``fn`` by name (so a patch must reach them too)."""
    return [
        m
        for name, m in sys.modules.items()
        if name.startswith("kernels.") and getattr(m, "check_device", None) is fn
    ]


def _identity_function():
    import torch

    class Identity(torch.autograd.Function):
        """The floor: an autograd function that allocates what attention allocates and does
        nothing else (torch's own cost of a custom forward + backward)."""

        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, grad):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    return Identity


def _nothing_function():
    import torch

    class Nothing(torch.autograd.Function):
        """An autograd function that allocates nothing and launches nothing: what the
        round trip through torch's autograd engine costs by itself."""

        @staticmethod
        def forward(ctx, q, k, v):
            return q.new_empty(())

        @staticmethod
        def backward(ctx, grad):
            return None, None, None

    return Nothing


GPT2_SHAPE = (8, 12, 1024, 64)  # (B, H, N, D): GPT-2 small's attention, one batch of 8
GPU_COMMAND = "python -m kernels.gpu.host_cost --gpu"


def _host_us(fns: dict, calls, repeats) -> dict:
    """{name: host µs to issue one call}, the best of ``repeats`` runs of ``calls`` calls
    (:func:`kernels.timing.host_and_wall_us`, which synchronises the GPU around each run, outside
    the host timing, so no backlog blocks the host), the functions taking turns run by run (so a
    slow spell of the machine hits them alike)."""
    from .. import timing

    for fn in fns.values():
        for _ in range(5):
            fn()  # compile, autotune, plans
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], timing.host_and_wall_us(fn, calls)[0])
    return best


def gpu_floor(shape=GPT2_SHAPE, calls=200, repeats=15, rounds=3) -> dict:
    """On a CUDA GPU, host µs per eager forward + backward (``torch.autograd.grad``, bf16,
    causal) at ``shape``: the book's kernel, SDPA flash and cuDNN, and torch's floor, two
    autograd functions that launch no kernel (one allocates what attention allocates).
    ``host_us`` holds one value per round (a shared machine's host times move by a fifth and
    more from round to round: read the spread, not one number)."""
    import torch

    from .. import timing
    from ..attention.registry import label, runner
    from .records import FLOOR_ROWS  # the floor rows' names, as chapter 10 reads them

    q, k, v, grad = timing.inputs(shape, torch.bfloat16, "cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    identity, nothing = _identity_function(), _nothing_function()

    def round_trip(fn, gradient):
        def call():
            out = fn.apply(*leaves)
            torch.autograd.grad(out, leaves, gradient(out), allow_unused=True)

        return call

    rows = {
        FLOOR_ROWS[0]: round_trip(nothing, torch.ones_like),  # nothing allocated
        FLOOR_ROWS[1]: round_trip(identity, lambda out: grad),  # outputs allocated
    }
    for impl in ("triton", "sdpa-flash", "sdpa-cudnn"):
        rows[label(impl)] = timing.step(runner(impl, causal=True), q, k, v, grad, "fwd+bwd")
    per_round = [_host_us(rows, calls, repeats) for _ in range(rounds)]
    return dict(
        shape=list(shape),
        what="host µs to issue one eager forward + backward (torch.autograd.grad), bf16, "
        f"causal; per round, the best of {repeats} runs of {calls} calls, no synchronisation "
        "inside a run",
        host_us={name: [r[name] for r in per_round] for name in rows},
    )


def _measure(mode, shape, causal, calls, repeats, options, switches=None) -> dict:
    import torch

    from .. import timing
    from ..attention import flash_attention, plans_made, speedups

    batch, heads, n, d = shape
    # fp16 in stub mode: on the CPU's explicit path bf16 tensors are re-viewed as int16 for
    # the kernels, which the GPU's native path never does; fp16 takes the same Python path
    dtype = torch.float16 if mode == "stub" else torch.bfloat16
    q, k, v, grad = (torch.randn(batch, heads, n, d).to(dtype) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    identity = _identity_function()

    def forward():
        with torch.no_grad():
            flash_attention(q, k, v, causal=causal, **options)

    def forward_backward():
        out = flash_attention(*leaves, causal=causal, **options)
        torch.autograd.grad(out, leaves, grad)

    def floor():
        out = identity.apply(*leaves)
        torch.autograd.grad(out, leaves, grad)

    rows = {}
    patch = launches_stubbed() if mode == "stub" else triton_launch_simulated()
    with speedups(**(switches or {})), patch:
        for name, fn in (
            ("forward", forward),
            ("forward+backward", forward_backward),
            ("autograd floor", floor),
        ):
            median, best = timing.host_us_per_call(fn, calls, repeats)
            rows[name] = dict(median_us=median, best_us=best)
        plans = plans_made()
    rows["backward (difference)"] = {
        stat: rows["forward+backward"][stat] - rows["forward"][stat]
        for stat in ("median_us", "best_us")
    }
    # how many launch plans exist, and how many launch a compiled kernel directly
    lean = sum(getattr(p.runner, "lean", False) for p in plans)
    rows["plans"] = dict(
        total=len(plans), direct=sum(p.runner is not None for p in plans), lean=lean
    )
    return rows


def host_cost(
    mode="stub", shape=SHAPE, causal=True, calls=300, repeats=9, speedups=None, **options
) -> dict:
    """µs per call (median and best of ``repeats`` runs of ``calls`` calls) of the host work
    of ``flash_attention``, forward and forward + backward, with the GPU taken out (see the
    module docstring for the two ``mode`` values). ``speedups``: changes to
    :class:`kernels.attention.Speedups` for this measurement (``direct_launch=False``:
    every call through Triton's usual launch path, as before the plans were cached)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "stub":
        return _measure(mode, shape, causal, calls, repeats, options, speedups)
    # Triton decides interpreter or compiler when a kernel is decorated: a fresh process
    request = json.dumps(
        dict(
            shape=shape,
            causal=causal,
            calls=calls,
            repeats=repeats,
            options=options,
            speedups=speedups or {},
        )
    )
    from ..env import run_module_json

    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    report, _ = run_module_json(
        "kernels.gpu.host_cost",
        "--child",
        request,
        env=env,
        what="the simulated-launch measurement",
    )
    return report


def table(rows: dict, title: str) -> str:
    lines = [title]
    for name, r in rows.items():
        if "median_us" not in r:
            continue
        lines.append(f"  {name:22s} median {r['median_us']:7.1f} µs   best {r['best_us']:7.1f} µs")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--gpu"]:
        from .. import results
        from ..timing import on_gpu

        if not on_gpu():
            raise SystemExit("--gpu measures on a CUDA GPU; without one, run without --gpu")
        data = gpu_floor()
        for name, us in data["host_us"].items():
            print(f"  {name:36s}" + "  ".join(f"{u:6.1f}" for u in us) + " µs")
        print("saved", results.save("host_floor", data, GPU_COMMAND, argv[1] if argv[1:] else None))
        return
    if argv[:1] == ["--child"]:
        from ..interpreter import configure_triton

        if configure_triton():  # True: the interpreter is on
            raise SystemExit("the simulated launch needs TRITON_INTERPRET=0")
        request = json.loads(argv[1])
        print(
            json.dumps(
                _measure(
                    "triton",
                    tuple(request["shape"]),
                    request["causal"],
                    request["calls"],
                    request["repeats"],
                    request["options"],
                    request["speedups"],
                )
            )
        )
        return
    from ..interpreter import configure_triton

    configure_triton()  # the interpreter switch, before triton
    b, h, n, d = SHAPE
    where = f"B{b} H{h} N{n} D{d} causal, on this machine's CPU (no GPU involved)"
    print(table(host_cost("stub"), f"wrapper only, launches stubbed out, fp16, {where}"))
    for direct, lean in ((False, False), (True, False), (True, True)):
        rows = host_cost("triton", speedups=dict(direct_launch=direct, lean_launch=lean))
        how = "cached plans, direct launches" if direct else "every call through Triton"
        how += ", lean launch" if lean else ""
        print(
            table(
                rows,
                f"with Triton's launch path ({how}; driver call skipped), "
                f"bf16 native path, {where}",
            )
        )


if __name__ == "__main__":
    main()
