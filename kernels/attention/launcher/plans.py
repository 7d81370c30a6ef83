"""Launching a kernel with as little host work per call as possible: :class:`Launcher`.

A kernel module makes one :class:`Launcher` per ``@triton.jit`` kernel (:func:`launcher`) and
reaches it through one call per launch, ``launcher(key, args, first)``; what that call decides
the first time a key is seen (grid, tile sizes, compile-time values, the autotuner's pick) is
its *plan*. :func:`launch_together` launches several kernels whose new configurations compile
at once, :func:`compile_ahead_of` compiles a later call's kernels in the background, and
:func:`pick_blocks` says which tile sizes a launch uses when the caller names none.

Why the host work matters: at the GPT-2 shape (B8 H12 N1024 D64) the forward kernel runs for
~60 µs and the three backward kernels for ~200 µs on an H100. A Python wrapper that spends
hundreds of µs per call preparing launches leaves the GPU idle, and the measured speed then
follows the CPU. So everything that depends only on shapes, strides, dtypes and options is
worked out once per *plan key* and cached:

* the grid, the constexpr values and (autotuned kernels) the chosen configuration;
* (autotuned kernels, the ``tune_by_bucket`` speed-up) that configuration once more per
  *bucket*: the same compile-time values with the sequence lengths rounded up to a power of two
  (:func:`n_bucket`), so a new length in a tuned bucket only compiles, it is not tuned again;
* on a CUDA GPU, the compiled kernel itself: later calls launch it directly (``direct_launch``)
  instead of going through Triton's autotuner and argument binder, which re-derive the same
  specialisation on every call.

The plan key must hold everything that decides what Triton compiles: dtypes, every integer
argument (sizes and strides, exactly) and whether each tensor's address is 16-byte aligned.
The callers (:mod:`..flash_fwd`, :mod:`..backward`) build it from their inputs; the launcher
adds the speed-ups in force (:attr:`Speedups.plan_key`) and the alignment of the first
``aligned`` arguments (the tensors whose layout the caller does not choose).
"""

from __future__ import annotations

import torch
import triton
from triton.runtime import _allocation  # no public getter for the allocator in Triton 3.6

from ...interpreter import interpreting
from . import switches, tuning

INTERPRETER_BLOCKS = (64, 64)  # fixed (block_m, block_n) in the CPU interpreter (the
# emulator's default block_n is 64 too)

NEAREST_STEPS = 2  # how far (in powers of two of each length) a borrowed configuration may come


_MAX_PLANS = 1024  # per launcher; a full cache is emptied, never trimmed
# The smallest bucket: every length up to the largest tile (128) shares one, so short
# sequences are tuned once, not once per power of two
MIN_BUCKET = 128


def n_bucket(n: int) -> int:
    """The tuning bucket of a sequence length: ``n`` rounded up to a power of two, at least
    :data:`MIN_BUCKET` (1000 -> 1024, 1025 -> 2048, 1 -> 128)."""
    return max(MIN_BUCKET, 1 << (int(n) - 1).bit_length())


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

    * ``key``: hashable; equal keys must mean equal dtypes, integer arguments, constexprs and
      tile choice (see the module docstring); the launcher adds the alignment of the first
      ``aligned`` arguments and the speed-ups in force (:meth:`plan_key`);
    * ``args``: the kernel's non-constexpr arguments, in order;
    * ``first()``: a :class:`Launch`, called only for a new key: the constexpr keyword
      arguments except the tile sizes, ``grid_of(meta)`` (the grid for a dict of tile sizes),
      the tile sizes ``blocks`` (a dict such as ``{"BLOCK_M": 64, "BLOCK_N": 32}``) or
      ``None`` to autotune with ``tuned``, the sequence lengths the autotuning key holds
      (``lengths``, a tuple of ints) and launch options (``num_stages``).

    The first call of a key launches through Triton as usual (compiling, autotuning) and, with
    ``direct_launch``, remembers the outcome: later calls reuse it, and on CUDA launch the
    compiled kernel directly. With ``tune_by_bucket`` an autotuned configuration is also
    remembered per bucket (:meth:`bucket`): the first call of a new key in a tuned bucket
    launches with it instead of autotuning, and with ``nearest_bucket`` so does the first call
    of a new bucket near a tuned one (:meth:`nearest`). ``scratch``: the kernel may build
    tensor descriptors on the GPU (``tma``), so every CUDA launch makes sure Triton has an
    allocator for them (:func:`ensure_scratch_allocator`).
    """

    def __init__(self, kernel, aligned: int = 0, scratch: bool = False):
        self.kernel = kernel
        self.aligned, self.scratch = aligned, scratch
        self.first_launches = 0  # how many keys it has launched for the first time
        self.name = getattr(kernel, "__name__", type(kernel).__name__)
        self.plans: dict = {}
        self.buckets: dict = {}  # bucket -> the triton.Config tuned for its first key

    def plan_key(self, key, args) -> tuple:
        """The caller's key, the speed-ups that decide what compiles, and whether each of the
        first ``aligned`` arguments sits at a multiple of 16 bytes (Triton compiles another
        kernel, with vectorised loads, for aligned pointers)."""
        aligned = tuple(a.data_ptr() % 16 == 0 for a in args[: self.aligned])
        return (key, switches.CURRENT.plan_key, aligned)

    def __call__(self, key, args, first):
        now = switches.CURRENT
        key = (key, now.plan_key, tuple(a.data_ptr() % 16 == 0 for a in args[: self.aligned]))
        self.launch_planned(key, args, first, now)

    def launch_planned(self, key, args, first, now):
        """Launch with ``key`` already a plan key (:meth:`plan_key`) and ``now`` the speed-ups
        in force."""
        if self.scratch and now.tma and args[0].is_cuda:  # per call: Triton keeps it per thread
            ensure_scratch_allocator()
        plan = self.plans.get(key)
        if plan is None:
            how = first()
            # several configurations to compile (autotuning): all at once, in threads
            tuning.compile_ahead(self.compile_jobs(args, how))
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
        if how.lengths is None or not (
            switches.CURRENT.tune_by_bucket and switches.CURRENT.direct_launch
        ):
            return None
        dtypes = tuple(str(a.dtype) for a in args if hasattr(a, "dtype"))
        lengths = tuple(n_bucket(n) for n in how.lengths)
        return (how.tuned, tuple(sorted(how.consts.items())), dtypes, lengths)

    def nearest(self, bucket):
        """The configuration tuned for the bucket of ``bucket``'s family (same autotuner,
        compile-time values and dtypes) whose lengths are nearest (fewest powers of two away,
        at most :data:`NEAREST_STEPS` for each length; the first tuned wins a tie), or None."""
        if bucket is None or not switches.CURRENT.nearest_bucket:
            return None
        tuned = [(b[3], config) for b, config in self.buckets.items() if b[:3] == bucket[:3]]
        return _closest(bucket[3], tuned, NEAREST_STEPS)

    def stored(self, bucket, device):
        """The configuration the stored GPU benchmark's autotuner chose for ``bucket``'s
        family (same kernel, autotuner choices, compile-time values and dtypes) at the
        nearest lengths (fewest powers of two away, any number), if it ran on this GPU's
        model (:func:`stored_table`); else None."""
        if bucket is None or not switches.CURRENT.stored_tuning:
            return None
        family = (self.name, tuning.choices_id(bucket[0]), bucket[1], bucket[2])
        return _closest(bucket[3], tuning.stored_table(device).get(family, ()))

    def tuned_entries(self) -> list[dict]:
        """This launcher's tuned buckets as JSON-ready entries (see :func:`tuned_entries`)."""
        return [
            dict(
                kernel=self.name,
                choices=tuning.choices_id(tuned),
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
                or self.stored(bucket, tuning.device_of(args))
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
        launch several new kernels compiles all of them at once (:func:`launch_together`)."""
        if self.plan_key(key, args) in self.plans:
            return [], first
        how = first()
        return self.compile_jobs(args, how), lambda: how

    def _first_launch(self, key, args, how: Launch):
        self.first_launches += 1
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
        if not switches.CURRENT.direct_launch:
            return  # as before: every call goes through Triton's launch path
        if len(self.plans) >= _MAX_PLANS:
            self.plans.clear()
        plan = _Plan(grid, kwargs)
        if not interpreting():
            if hasattr(compiled, "result"):  # an asynchronous compile: wait for it
                compiled = compiled.result()
            plan.runner, plan.tail = self._direct(compiled, grid, len(args), kwargs)
            if plan.runner is not None and switches.CURRENT.lean_launch:
                plan.runner = _lean_runner(plan.runner, compiled, grid, args)
        self.plans[key] = plan

    def _direct(self, compiled, grid, n_args, kwargs):
        """The compiled kernel's launcher for this grid and the constexpr values that follow
        the runtime arguments (Triton's launcher takes every argument in signature order);
        (None, ()) where this Triton does not offer them: the normal launch is used then."""
        names = getattr(self.kernel, "arg_names", None)
        if compiled is None or names is None or not hasattr(compiled, "__getitem__"):
            return None, ()
        try:
            tail = tuple(kwargs[name] for name in names[n_args:])
            runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
        except (KeyError, AttributeError, TypeError):
            return None, ()
        return runner, tail


def _lean_runner(runner, compiled, grid, args):
    """The ``lean_launch`` speed-up: a launch that calls the compiled kernel's C launcher
    itself, the tensors among ``args`` (by position) passed as their addresses and no hooks
    (Triton's runner hands it its two empty hook chains, which the launcher calls, and builds
    launch metadata for them, on every launch); ``runner`` (Triton's) takes over whenever a
    launch hook is set."""
    from triton import knobs
    from triton.runtime import driver

    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    g0, g1, g2 = tuple(grid) + (1,) * (3 - len(grid))
    device, stream = driver.active.get_current_device, driver.active.get_current_stream
    tensors = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
    hooks = knobs.runtime

    def launch(*call_args):
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            return runner(*call_args)
        call_args = list(call_args)
        for i in tensors:
            call_args[i] = call_args[i].data_ptr()
        return run(g0, g1, g2, stream(device()), function, meta, None, None, None, *call_args)

    launch.lean = True  # how the host-cost measurement counts lean plans
    return launch


def _hooked(hook) -> bool:
    """Whether a launch hook of Triton's knobs would do anything: a function, or (Triton 3.6's
    default) a chain of hooks that is not empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _closest(lengths, candidates, max_steps=None):
    """The configuration of the (lengths, configuration) candidate fewest powers of two from
    ``lengths`` in all (each at most ``max_steps`` away if given; the first wins a tie)."""
    best, best_steps = None, None
    for other, config in candidates:
        steps = [abs(a.bit_length() - b.bit_length()) for a, b in zip(lengths, other)]
        if max_steps is not None and max(steps) > max_steps:
            continue
        if best is None or sum(steps) < best_steps:
            best, best_steps = config, sum(steps)
    return best


_LAUNCHERS: list = []


def launcher(kernel, aligned: int = 0, scratch: bool = False) -> Launcher:
    """A :class:`Launcher` for ``kernel``, registered so :func:`clear_plans` reaches it."""
    made = Launcher(kernel, aligned, scratch)
    _LAUNCHERS.append(made)
    return made


def launch_together(calls) -> None:
    """Make these launches, each ``(launcher, key, args, first)``, in order; the
    configurations of those with a new key compile first, all at once, in parallel threads
    (the ``parallel_compile`` speed-up). Kernels a background compile may be building for
    them are waited for first (:func:`compile_ahead_of`)."""
    tuning.wait_for_background()
    now = switches.CURRENT
    planned = [(made, made.plan_key(key, args), args, first) for made, key, args, first in calls]
    if any(key not in made.plans for made, key, _, _ in planned):
        jobs = []
        for i, (made, key, args, first) in enumerate(planned):
            if key not in made.plans:
                how = first()
                jobs += made.compile_jobs(args, how)
                planned[i] = (made, key, args, lambda how=how: how)
        tuning.compile_ahead(jobs)
    for made, key, args, first in planned:
        made.launch_planned(key, args, first, now)


def compile_ahead_of(calls, device=None) -> None:
    """Compile, in a background thread, what these launches (as in :func:`launch_together`)
    would compile, so that they find it compiled when they come."""
    jobs = []
    for made, key, args, first in calls:
        jobs += made.pending(key, args, first)[0]
    tuning.compile_in_background(jobs, device)


def plans_made() -> list:
    """Every launcher's plans (what each plan key decided), for the host-cost measurements."""
    return [plan for made in _LAUNCHERS for plan in made.plans.values()]


def tuned_entries() -> list[dict]:
    """Every configuration the autotuner chose in this process, one entry per tuned bucket of
    every launcher: the kernel, its autotuner's choices (:func:`choices_id`), the compile-time
    values, the dtypes, the bucket's lengths and the chosen tile sizes, warps and stages.
    :mod:`kernels.gpu.perf` stores them (``perf_tuning.json``) for :func:`stored_table`."""
    return [entry for made in _LAUNCHERS for entry in made.tuned_entries()]


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
