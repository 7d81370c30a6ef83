"""The Python side of a kernel launch, shared by the forward and backward passes.

Which rounding path runs (:func:`use_explicit`), the output buffers (NaN-poisoned when
:data:`POISON_OUTPUTS` is on, so an unwritten entry shows), the scalar parameters
(:func:`kernel_params`, cached), the tile sizes (:func:`pick_blocks`), the speed-up switches
(:data:`SPEEDUPS`, :func:`speedups`) and :class:`Launcher`, which launches one kernel with as
little host work per call as possible.

Why the host work matters: at the GPT-2 shape (B8 H12 N1024 D64) the forward kernel runs for
~60 µs and the three backward kernels for ~200 µs on an H100. A Python wrapper that spends
hundreds of µs per call preparing launches leaves the GPU idle, and the measured speed then
follows the CPU. So everything that depends only on shapes, strides, dtypes and options is
worked out once per *plan key* and cached:

* the grid, the constexpr values and (autotuned kernels) the chosen configuration;
* (autotuned kernels, :data:`SPEEDUPS` ``"tune_by_bucket"``) that configuration once more per
  *bucket*: the same compile-time values with the sequence lengths rounded up to a power of two
  (:func:`n_bucket`), so a new length in a tuned bucket only compiles, it is not tuned again;
* on a CUDA GPU, the compiled kernel itself: later calls launch it directly
  (:data:`SPEEDUPS` ``"direct_launch"``) instead of going through Triton's autotuner and
  argument binder, which re-derive the same specialisation on every call.

The plan key must hold everything that decides what Triton compiles: dtypes, every integer
argument (sizes and strides, exactly) and whether each tensor's address is 16-byte aligned.
The callers (:mod:`.flash_fwd`, :mod:`.flash_bwd`) build it from their inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from triton.runtime import (
    _allocation,  # no public getter for the allocator in Triton 3.6
    _async_compile,  # whether an AsyncCompileMode is active
)

from ..env import interpreting, native_bf16
from ..numerics.rounding import work_dtype

INTERPRETER_BLOCKS = (64, 64)  # fixed (block_m, block_n) in the CPU interpreter (the
# emulator's default block_n is 64 too)

# Fill outputs with NaN before each launch so a missed write shows (the tests turn it on; on a
# GPU it costs an extra memset per output, so it is off there by default).
POISON_OUTPUTS = interpreting()

# The speed-ups, each switchable so the performance chapter can measure what it buys. None of
# them changes a number the kernels compute (the tests run with all of them on; the switches
# only exist for the ablation in kernels.gpu.perf):
#   direct_launch  remember each plan key's launch (grid, tile sizes, constexprs) and on CUDA
#                  launch the cached compiled kernel directly (no autotuner lookup, no
#                  argument re-binding); off: every call goes through Triton's autotuner
#                  and launch path, as before
#   causal_split   the kernels' key/query loops run the tiles that need no mask (most of them)
#                  without computing one; only the diagonal and ragged tiles are masked
#   wide_tuning    autotune over more tile shapes, warp counts and pipeline depths (CUDA,
#                  bf16/fp16 only; the interpreter always uses one fixed configuration)
#   tune_by_bucket the configuration the autotuner picks for the first sequence length of a
#                  power-of-two bucket (n_bucket) serves every later length of that bucket
#                  (same compile-time values and dtypes): a new length at most compiles one
#                  configuration, where Triton's autotuner re-times every configuration for
#                  each exact length (16-39 s forward + backward on an H100, issue 28;
#                  kernels.gpu.first_call measures both); off, or with direct_launch off:
#                  every new length is autotuned, as before. It changes which tile shape runs
#                  (and so the bits, as autotuning does), never what is computed
#   nearest_bucket a new bucket of a family already tuned in this process (same kernel,
#                  compile-time values and dtypes, lengths at most NEAREST_STEPS powers of two
#                  away) borrows the nearest tuned bucket's configuration instead of autotuning:
#                  its first call compiles one configuration (seconds), not every one (16-39 s).
#                  Benchmarks switch it off (every bucket tuned for itself); LPFA_NEAREST_BUCKET=0
#                  switches it off everywhere
#   tma            the forward kernel reads its K and V tiles through tensor descriptors
#                  (tl.make_tensor_descriptor), which sm_90+ GPUs serve with the TMA copy engine,
#                  at head dims >= TMA_MIN_HEAD_DIM where the layout allows it (tma_usable);
#                  off, or elsewhere: pointer loads. The same values arrive either way;
#                  LPFA_TMA=0 switches it off everywhere
#   exp2           the forward and backward kernels (FA2 numerics, bf16/fp16: base_two)
#                  exponentiate with 2^x, log₂e folded into the scale and the row's offset
#                  (one fused multiply-add per score), as FlashAttention's own kernels do; a
#                  GPU's tl.exp is 2^(x·log₂e), so this saves one multiply per score (H100:
#                  forward 17 % faster at N >= 4096, chapter 10). The same numbers up to fp32
#                  rounding (P̄ = 2^(S·log₂e − m·log₂e) = e^(S − m)); rare bf16 values flip, so
#                  it moves bits. LPFA_EXP2=0 switches it off everywhere
#   max_first      the forward kernel (FA2 numerics, offset rule off) finds each row's maximum
#                  of QKᵀ and scales that one number, where it scaled every score first: a
#                  multiplication per score fewer, and the same bits, since max(fl(x·s)) =
#                  fl(max(x)·s) exactly (rounding is monotone and s > 0). The paper's numerics
#                  and the offset rules need every scaled score anyway (they compare each with
#                  the row's maximum)
#   stored_tuning  a bucket of a family never tuned in this process (no nearby tuned bucket to
#                  borrow from either) takes the configuration the autotuner chose for the
#                  nearest lengths of the same family in the stored GPU benchmark
#                  (results/perf_tuning.json, written by kernels.gpu.perf), when this GPU is the
#                  model that benchmark ran on: its first call compiles one configuration
#                  (seconds) instead of timing every one. Elsewhere, or off: autotune.
#                  LPFA_STORED_TUNING=0 switches it off everywhere
#   parallel_compile  a first launch that compiles several configurations (autotuning), and
#                  the backward's two kernels, compile in parallel threads (compile_ahead)
#                  instead of one after the other. LPFA_PARALLEL_COMPILE=0 switches it off
#   tma_narrow     descriptors at the smaller head dims too (off: on an H100 and an H200 they
#                  made the forward slower at D = 64, where D = 128 gained; chapter 10)
SPEEDUPS = {
    "direct_launch": os.environ.get("LPFA_DIRECT_LAUNCH", "1") != "0",
    "causal_split": True,
    "wide_tuning": True,
    "tune_by_bucket": True,
    "nearest_bucket": os.environ.get("LPFA_NEAREST_BUCKET", "1") != "0",
    "tma": os.environ.get("LPFA_TMA", "1") != "0",
    "tma_narrow": False,
    "exp2": os.environ.get("LPFA_EXP2", "1") != "0",
    "max_first": True,
    "stored_tuning": os.environ.get("LPFA_STORED_TUNING", "1") != "0",
    "parallel_compile": os.environ.get("LPFA_PARALLEL_COMPILE", "1") != "0",
}
TMA_MIN_HEAD_DIM = 128  # descriptors below this head dim only with "tma_narrow"
# Triton compiles one kernel per *specialisation* of the integer arguments: whether each is 1
# and whether it is divisible by 16. The head count H only splits the grid, so it is never
# specialised (one compile for every head count). The sequence lengths are, by default: a
# length divisible by 16 gets kernels of its own (a compile of seconds on its first call, as
# kernels.gpu.first_call shows), but they run faster. LPFA_SPECIALISE_LENGTHS=0, read when the
# kernels are defined, compiles one kernel for every length; kernels.gpu.call_cost measures
# both, in two processes.
SPECIALISE_LENGTHS = os.environ.get("LPFA_SPECIALISE_LENGTHS", "1") != "0"


def not_specialised(*lengths: str) -> list[str]:
    """The ``do_not_specialize`` list of a kernel whose length arguments are ``lengths``."""
    return ["H"] + ([] if SPECIALISE_LENGTHS else list(lengths))


NEAREST_STEPS = 2  # how far (in powers of two of each length) a borrowed configuration may come


@contextlib.contextmanager
def speedups(**switches):
    """Change :data:`SPEEDUPS` inside the block (``with speedups(direct_launch=False): ...``);
    every switch is as it was afterwards, whatever happens inside."""
    unknown = set(switches) - set(SPEEDUPS)
    if unknown:
        raise ValueError(f"unknown speed-up {sorted(unknown)}; one of {sorted(SPEEDUPS)}")
    saved = dict(SPEEDUPS)
    SPEEDUPS.update(switches)
    try:
        yield SPEEDUPS
    finally:
        SPEEDUPS.update(saved)


def tune_every_bucket() -> None:
    """For a benchmark: every bucket tuned for itself (``"nearest_bucket"`` and
    ``"stored_tuning"`` off), in this process and in the processes it starts
    (``LPFA_NEAREST_BUCKET=0``, ``LPFA_STORED_TUNING=0``), so each timed shape runs the
    configuration tuned for it."""
    os.environ["LPFA_NEAREST_BUCKET"] = "0"
    os.environ["LPFA_STORED_TUNING"] = "0"
    SPEEDUPS["nearest_bucket"] = False
    SPEEDUPS["stored_tuning"] = False


_PARAMS_CACHE: dict = {}
_MAX_PLANS = 1024  # per launcher; a full cache is emptied, never trimmed
# The smallest bucket: every length up to the largest tile (128) shares one, so short
# sequences are tuned once, not once per power of two
MIN_BUCKET = 128


def n_bucket(n: int) -> int:
    """The tuning bucket of a sequence length: ``n`` rounded up to a power of two, at least
    :data:`MIN_BUCKET` (1000 -> 1024, 1025 -> 2048, 1 -> 128)."""
    return max(MIN_BUCKET, 1 << (int(n) - 1).bit_length())


_NATIVE_BF16: list[bool] = []  # remembered: it queries the device, and this runs every call


def _native_bf16() -> bool:
    # a plain memo, not functools.lru_cache, which torch.compile warns about when it traces it
    if not _NATIVE_BF16:
        _NATIVE_BF16.append(native_bf16())
    return _NATIVE_BF16[0]


def use_explicit(explicit=None) -> bool:
    """The rounding path: explicit iff interpreting or the GPU is older than sm_80."""
    if explicit is None:
        return not _native_bf16()
    if not isinstance(explicit, bool):
        raise TypeError(f"explicit must be None, True or False, got {explicit!r}")
    if not explicit and not _native_bf16():
        raise ValueError(
            "explicit=False needs a CUDA GPU with compute capability >= 8.0 "
            "(the interpreter and older GPUs cannot round bf16 in hardware)"
        )
    return explicit


def check_device(q) -> None:
    """CPU tensors need the interpreter; GPU tensors need it switched off."""
    if q.device.type == "cuda" and interpreting():
        raise ValueError(
            "TRITON_INTERPRET=1 is set but the tensors are on the GPU: move them "
            "to the CPU or unset TRITON_INTERPRET before importing kernels"
        )
    if q.device.type == "cpu" and not interpreting():
        raise ValueError(
            "CPU tensors need the Triton interpreter (import kernels before triton "
            "on a machine without a GPU), or move the tensors to the GPU"
        )


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
    if (
        block_m is None
        and block_n is None
        and not interpreting()
        and not explicit
        and dtype in (torch.bfloat16, torch.float16)
    ):
        return None
    if interpreting():
        dm, dn = INTERPRETER_BLOCKS
    elif dtype == torch.float64:
        dm, dn = 32, 32
    else:
        dm, dn = (32, 64) if backward else (64, 32)
    return (block_m or dm, block_n or dn)


def tma_usable(*tensors) -> bool:
    """Whether these (B, H, N, D) tensors are read through tensor descriptors: the ``"tma"``
    speed-up is on, the head dim is at least :data:`TMA_MIN_HEAD_DIM` (or ``"tma_narrow"`` is
    on), they are on a GPU with TMA (sm_90+) or in the interpreter (which reads descriptors
    too, so the CPU tests run this path), and they meet TMA's layout rules: unit stride along
    the head dim, every other stride and the address a multiple of 16 bytes. Everything it
    reads is in the forward's plan key, so it runs once per plan, not per call."""
    if not SPEEDUPS["tma"]:
        return False
    if tensors[0].shape[-1] < TMA_MIN_HEAD_DIM and not SPEEDUPS["tma_narrow"]:
        return False
    device = tensors[0].device
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device)[0] < 9:
            return False
    elif not interpreting():
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_scratch_allocator() -> None:
    """Kernels that build tensor descriptors on the GPU need a little global memory per
    launch (128 bytes per descriptor and program), which Triton asks an allocator for; give it
    PyTorch's caching allocator unless the program has set one (kernels that need no scratch
    never call it). Triton keeps the allocator in a context variable, so this runs in the
    thread that launches (autograd's backward thread may re-run a forward under activation
    checkpointing), on every call: a lookup and a comparison."""
    if _allocation._allocator.get() is _allocation._NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉ for grids (plain Python: ``triton.cdiv`` is a constexpr function in Triton 3.6
    and costs microseconds per call on the host)."""
    return -(-a // b)


def aligned(*tensors) -> tuple:
    """Whether each tensor's address is a multiple of 16 bytes: Triton compiles a different
    kernel (vectorised loads) for aligned pointers, so this belongs in every plan key."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors)


def switches() -> tuple:
    """The current :data:`SPEEDUPS`, as part of a plan key."""
    return (
        SPEEDUPS["direct_launch"],
        SPEEDUPS["causal_split"],
        SPEEDUPS["wide_tuning"],
        SPEEDUPS["tune_by_bucket"],
        SPEEDUPS["tma"],
        SPEEDUPS["tma_narrow"],
        SPEEDUPS["exp2"],
        SPEEDUPS["max_first"],
    )


def base_two(paper: bool, dtype) -> bool:
    """Whether the kernels exponentiate in base 2 (:data:`SPEEDUPS` ``"exp2"``,
    :func:`~kernels.attention.jit.exp_shifted`): FA2 numerics with bf16/fp16 inputs only. The
    paper's numerics round S and S − m to the low format, which in base 2 would be other
    roundings; fp32/fp64 inputs (the references) keep e^x."""
    return SPEEDUPS["exp2"] and not paper and dtype in (torch.bfloat16, torch.float16)


class _Plan:
    """What one plan key decides: the grid, the keyword arguments of a normal launch, and on
    CUDA the compiled kernel's launcher with the constexpr values it expects after ``args``."""

    __slots__ = ("grid", "kwargs", "runner", "tail")

    def __init__(self, grid, kwargs):
        self.grid, self.kwargs, self.runner, self.tail = grid, kwargs, None, ()


class Launch:
    """How to launch a kernel the first time a plan key is seen (see :class:`Launcher`)."""

    __slots__ = ("consts", "grid_of", "blocks", "tuned", "lengths", "options")

    def __init__(self, consts, grid_of, blocks=None, tuned=None, lengths=None, **options):
        self.consts, self.grid_of, self.blocks = consts, grid_of, blocks
        self.tuned, self.lengths, self.options = tuned, lengths, options


class Launcher:
    """Launch one ``@triton.jit`` kernel (and its autotuned twins) with cached plans.

    ``launcher(key, args, first)``:

    * ``key``: hashable; equal keys must mean equal dtypes, integer arguments, pointer
      alignment, constexprs and tile choice (see the module docstring);
    * ``args``: the kernel's non-constexpr arguments, in order;
    * ``first()``: a :class:`Launch`, called only for a new key: the constexpr keyword
      arguments except the tile sizes, ``grid_of(meta)`` (the grid for a dict of tile sizes),
      the tile sizes ``blocks`` (a dict such as ``{"BLOCK_M": 64, "BLOCK_N": 32}``) or
      ``None`` to autotune with ``tuned``, the sequence lengths the autotuning key holds
      (``lengths``, a tuple of ints) and launch options (``num_stages``).

    The first call of a key launches through Triton as usual (compiling, autotuning) and, with
    ``SPEEDUPS["direct_launch"]``, remembers the outcome: later calls reuse it, and on CUDA
    launch the compiled kernel directly. With ``SPEEDUPS["tune_by_bucket"]`` an autotuned
    configuration is also remembered per bucket (:meth:`bucket`): the first call of a new key
    in a tuned bucket launches with it instead of autotuning, and with
    ``SPEEDUPS["nearest_bucket"]`` so does the first call of a new bucket near a tuned one
    (:meth:`nearest`).
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = getattr(kernel, "__name__", type(kernel).__name__)
        self.plans: dict = {}
        self.buckets: dict = {}  # bucket -> the triton.Config tuned for its first key

    def __call__(self, key, args, first):
        plan = self.plans.get(key)
        if plan is None:
            how = first()
            compile_ahead(self.compile_jobs(args, how))  # several configurations: in parallel
            self._first_launch(key, args, how)
        elif plan.runner is not None:
            plan.runner(*args, *plan.tail)
        else:
            self.kernel[plan.grid](*args, **plan.kwargs)

    @staticmethod
    def bucket(args, how: Launch):
        """Where an autotuned configuration is shared (None: nowhere, every autotuning key
        is tuned, as before, also whenever ``direct_launch`` is off): the autotuner, the
        compile-time values, the tensors' dtypes and the sequence lengths rounded up by
        :func:`n_bucket`."""
        if how.lengths is None or not (SPEEDUPS["tune_by_bucket"] and SPEEDUPS["direct_launch"]):
            return None
        dtypes = tuple(str(a.dtype) for a in args if hasattr(a, "dtype"))
        lengths = tuple(n_bucket(n) for n in how.lengths)
        return (how.tuned, tuple(sorted(how.consts.items())), dtypes, lengths)

    def nearest(self, bucket):
        """The configuration tuned for the bucket of ``bucket``'s family (same autotuner,
        compile-time values and dtypes) whose lengths are nearest (fewest powers of two away,
        at most :data:`NEAREST_STEPS` for each length; the first tuned wins a tie), or None."""
        if bucket is None or not SPEEDUPS["nearest_bucket"]:
            return None
        best, best_steps = None, None
        for other, config in self.buckets.items():
            if other[:3] != bucket[:3]:
                continue
            steps = [abs(a.bit_length() - b.bit_length()) for a, b in zip(bucket[3], other[3])]
            if max(steps) <= NEAREST_STEPS and (best is None or sum(steps) < best_steps):
                best, best_steps = config, sum(steps)
        return best

    def stored(self, bucket, device):
        """The configuration the stored GPU benchmark's autotuner chose for ``bucket``'s
        family (same kernel, autotuner choices, compile-time values and dtypes) at the
        nearest lengths (fewest powers of two away, any number), if it ran on this GPU's
        model (:func:`stored_table`); else None."""
        if bucket is None or not SPEEDUPS["stored_tuning"]:
            return None
        family = (self.name, choices_id(bucket[0]), bucket[1], bucket[2])
        best, best_steps = None, None
        for lengths, config in stored_table(device).get(family, ()):
            steps = sum(abs(a.bit_length() - b.bit_length()) for a, b in zip(bucket[3], lengths))
            if best is None or steps < best_steps:
                best, best_steps = config, steps
        return best

    def tuned_entries(self) -> list[dict]:
        """This launcher's tuned buckets as JSON-ready entries (see :func:`tuned_entries`)."""
        return [
            dict(
                kernel=self.name,
                choices=choices_id(tuned),
                consts=dict(consts),
                dtypes=list(dtypes),
                lengths=list(lengths),
                config=dict(
                    kwargs=dict(config.kwargs),
                    num_warps=config.num_warps,
                    num_stages=config.num_stages,
                ),
            )
            for (tuned, consts, dtypes, lengths), config in self.buckets.items()
        ]

    def _known_config(self, args, how: Launch):
        """(bucket, configuration): the bucket of an autotuned launch (None for fixed tiles or
        with bucket tuning off) and the configuration tuned for it, borrowed from the nearest
        tuned bucket or stored (None: the autotuner must time its choices)."""
        bucket = None if how.blocks is not None else self.bucket(args, how)
        config = None
        if bucket is not None:
            config = (
                self.buckets.get(bucket)
                or self.nearest(bucket)
                or self.stored(bucket, _device_of(args))
            )
        return bucket, config

    def compile_jobs(self, args, how: Launch) -> list:
        """(kernel, args, grid, keyword arguments) for each configuration the first launch of
        ``how`` compiles: the fixed tiles, the known configuration, or every choice of the
        autotuner left after its pruning."""
        if how.blocks is not None:
            configs = [{**how.blocks, **how.options}]
        else:
            _, config = self._known_config(args, how)
            if config is not None:
                configs = [config.all_kwargs()]
            else:
                tuned = how.tuned
                choices = getattr(tuned, "configs", None) or []
                if getattr(tuned, "early_config_prune", None):
                    named = dict(zip(self.kernel.arg_names, args))
                    choices = tuned.early_config_prune(choices, named, **how.consts)
                configs = [c.all_kwargs() for c in choices]
        return [(self.kernel, args, how.grid_of(kw), {**how.consts, **kw}) for kw in configs]

    def pending(self, key, args, first):
        """The compile jobs of this call's first launch (none for a known key), and a ``first``
        that returns the same :class:`Launch` without building it again: a caller about to
        launch several new kernels compiles all of them at once (:func:`compile_ahead`)."""
        if key in self.plans:
            return [], first
        how = first()
        return self.compile_jobs(args, how), lambda: how

    def _first_launch(self, key, args, how: Launch):
        bucket, config = self._known_config(args, how)
        if how.blocks is None and config is not None:
            # a configuration tuned for this bucket, borrowed from the nearest tuned one or
            # taken from the stored benchmark: compile (if new) and launch, no timing
            kwargs = {**how.consts, **config.all_kwargs()}
            grid = how.grid_of(config.kwargs)
            compiled = self.kernel[grid](*args, **kwargs)
        elif how.blocks is None:
            # autotune: Triton times its configurations once per autotuning key
            compiled = how.tuned[how.grid_of](*args, **how.consts)
            config = how.tuned.best_config
            kwargs = {**how.consts, **config.all_kwargs()}
            grid = how.grid_of(config.kwargs)
            if bucket is not None:
                self.buckets[bucket] = config
        else:
            kwargs = {**how.consts, **how.blocks, **how.options}
            grid = how.grid_of(how.blocks)
            compiled = self.kernel[grid](*args, **kwargs)
        if not SPEEDUPS["direct_launch"]:
            return  # as before: every call goes through Triton's launch path
        if len(self.plans) >= _MAX_PLANS:
            self.plans.clear()
        plan = _Plan(grid, kwargs)
        if not interpreting():
            plan.runner, plan.tail = self._direct(compiled, grid, len(args), kwargs)
        self.plans[key] = plan

    def _direct(self, compiled, grid, n_args, kwargs):
        """The compiled kernel's launcher for this grid and the constexpr values that follow
        the runtime arguments (Triton's launcher takes every argument in signature order);
        (None, ()) where this Triton does not offer them: the normal launch is used then."""
        if hasattr(compiled, "result"):  # an asynchronous compile: wait for it
            compiled = compiled.result()
        names = getattr(self.kernel, "arg_names", None)
        if compiled is None or names is None or not hasattr(compiled, "__getitem__"):
            return None, ()
        try:
            tail = tuple(kwargs[name] for name in names[n_args:])
            runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        except (KeyError, AttributeError, TypeError):
            return None, ()
        return runner, tail


_LAUNCHERS: list = []


def launcher(kernel) -> Launcher:
    """A :class:`Launcher` for ``kernel``, registered so :func:`clear_plans` reaches it."""
    made = Launcher(kernel)
    _LAUNCHERS.append(made)
    return made


def compile_ahead(jobs) -> None:
    """Compile these kernels (:meth:`Launcher.compile_jobs`) in parallel threads, where the
    launches that follow would compile them one after the other; they then find them compiled
    (:data:`SPEEDUPS` ``"parallel_compile"``; CUDA only, two jobs or more). Triton's compiler
    spends its time in C++ passes and in ptxas, neither holding Python's lock, so threads
    overlap: on an H100 host, 36 kernels compiled in 78 s one after the other and in 13 s on
    12 threads. A job that fails here is left for its launch, which raises the error itself."""
    if len(jobs) < 2 or not SPEEDUPS["parallel_compile"] or interpreting():
        return
    if _async_compile.active_mode.get() is not None:  # the program compiles asynchronously
        return
    workers = max(1, min(len(jobs), os.cpu_count() or 1, MAX_COMPILE_THREADS))
    with ThreadPoolExecutor(workers) as pool, triton.AsyncCompileMode(pool, ignore_errors=True):
        for kernel, args, grid, kwargs in jobs:
            try:
                kernel.warmup(*args, grid=grid, **kwargs)
            except Exception:  # noqa: BLE001 - the launch raises it, with its own message
                continue


MAX_COMPILE_THREADS = 16


def choices_id(tuned) -> str:
    """A short name for the configurations an autotuner chooses among (a hash of their tile
    sizes, warps and stages): a stored pick is used only by an autotuner with the same ones."""
    configs = getattr(tuned, "configs", None) or ()
    text = repr([(sorted(c.kwargs.items()), c.num_warps, c.num_stages) for c in configs])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _device_of(args):
    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


def tuned_entries() -> list[dict]:
    """Every configuration the autotuner chose in this process, one entry per tuned bucket of
    every launcher: the kernel, its autotuner's choices (:func:`choices_id`), the compile-time
    values, the dtypes, the bucket's lengths and the chosen tile sizes, warps and stages.
    :mod:`kernels.gpu.perf` stores them (``perf_tuning.json``) for :func:`stored_table`."""
    return [entry for made in _LAUNCHERS for entry in made.tuned_entries()]


STORED_TUNING = "perf_tuning"  # results/perf_tuning.json, written by python -m kernels.gpu.perf
_STORED: dict = {}  # GPU name -> its table (read once per process)


def stored_table(device) -> dict:
    """The stored benchmark's picks (``results/perf_tuning.json``) as {family: [(lengths,
    triton.Config)]}, if that benchmark ran on the same GPU model as ``device`` (its name, as
    CUDA reports it); else (another GPU, the CPU, no stored file) empty."""
    if device is None or device.type != "cuda":
        return {}
    gpu = torch.cuda.get_device_name(device)
    if gpu not in _STORED:
        from .. import results  # here, not at import: results/ is read only when needed

        try:
            record = results.load(STORED_TUNING)
        except (FileNotFoundError, OSError, ValueError):
            record = None
        _STORED[gpu] = {}
        if record is not None and record.get("provenance", {}).get("gpu") == gpu:
            _STORED[gpu] = table_of(record["data"]["entries"])
    return _STORED[gpu]


def table_of(entries) -> dict:
    """{(kernel, choices, compile-time values, dtypes): [(lengths, triton.Config)]} from
    :func:`tuned_entries`' JSON."""
    table: dict = {}
    for e in entries:
        family = (e["kernel"], e["choices"], tuple(sorted(e["consts"].items())), tuple(e["dtypes"]))
        c = e["config"]
        config = triton.Config(c["kwargs"], num_warps=c["num_warps"], num_stages=c["num_stages"])
        table.setdefault(family, []).append((tuple(e["lengths"]), config))
    return table


_AUTOTUNERS: list = []


def autotuners(*tuned):
    """Register the kernels' autotuners, so :func:`forget_compiled` reaches their memory."""
    _AUTOTUNERS.extend(tuned)


def forget_compiled() -> None:
    """Drop the compiled kernels every launcher's kernel holds in memory (Triton's caches per
    device) and what every autotuner remembers choosing: with :func:`clear_plans` and an empty
    Triton cache folder, the next calls compile and tune again, as in a fresh process (for
    measuring compile times)."""
    for made in _LAUNCHERS:
        caches = getattr(made.kernel, "device_caches", None)
        if caches is not None:
            caches.clear()
    for tuned in _AUTOTUNERS:
        tuned.cache.clear()


def clear_plans() -> None:
    """Forget every cached plan and tuned bucket (the next call of each key launches through
    Triton again, and autotunes where its kernel is autotuned)."""
    for made in _LAUNCHERS:
        made.plans.clear()
        made.buckets.clear()
