"""The kernels' speed-ups: one immutable :class:`Speedups` value, changed only inside a block.

:data:`CURRENT` holds the value in force; :func:`speedups` replaces it for a block of code
(``with speedups(direct_launch=False): ...``) and puts the previous one back afterwards,
whatever happens inside. Each speed-up can be switched off so the performance chapter can
measure what it buys (the ablation in :mod:`kernels.gpu.perf`). None of them changes a number
the kernels compute, except where a field says it moves bits (the tests run with all of them on).

One environment variable, ``LPFA_OFF``, switches fields off for a whole process and the
processes it starts: a comma list of field names (``LPFA_OFF=nearest_bucket,stored_tuning``),
read once at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from ...interpreter import interpreting

OFF_VARIABLE = "LPFA_OFF"
TMA_MIN_HEAD_DIM = 128  # descriptors below this head dim only with "tma_narrow"
TMA_FROM = (9, 0)  # the compute capability with the tensor-memory accelerator (Hopper)


@dataclasses.dataclass(frozen=True)
class Speedups:
    """Which speed-ups are on. Fields:

    ``direct_launch``
        remember each plan key's launch (grid, tile sizes, constexprs) and on CUDA launch the
        cached compiled kernel directly (no autotuner lookup, no argument re-binding); off:
        every call goes through Triton's autotuner and launch path, as before.
    ``causal_split``
        the kernels' key/query loops run the tiles that need no mask (most of them) without
        computing one; only the diagonal and ragged tiles are masked.
    ``wide_tuning``
        autotune over more tile shapes, warp counts and pipeline depths (CUDA, bf16/fp16 only;
        the interpreter always uses one fixed configuration).
    ``tune_by_bucket``
        the configuration the autotuner picks for the first sequence length of a power-of-two
        bucket (``n_bucket``) serves every later length of that bucket (same compile-time values
        and dtypes): a new length at most compiles one configuration, where Triton's autotuner
        re-times every configuration for each exact length (16-39 s forward + backward on an
        H100; :mod:`kernels.gpu.first_call` measures both); off, or with ``direct_launch`` off:
        every new length is autotuned, as before. It changes which tile shape runs (and so the
        bits, as autotuning does), never what is computed.
    ``nearest_bucket``
        a new bucket of a family already tuned in this process (same kernel, compile-time values
        and dtypes, lengths at most ``NEAREST_STEPS`` powers of two away) borrows the nearest
        tuned bucket's configuration instead of autotuning: its first call compiles one
        configuration (seconds), not every one (16-39 s). Benchmarks switch it off (every bucket
        tuned for itself, :func:`tune_every_bucket`).
    ``tma``
        the forward kernel reads its K and V tiles through tensor descriptors
        (``tl.make_tensor_descriptor``), which sm_90+ GPUs serve with the TMA copy engine, at head
        dims >= :data:`TMA_MIN_HEAD_DIM` where the layout allows it (:func:`tma_usable`); off, or
        elsewhere: pointer loads. The same values arrive either way.
    ``tma_narrow``
        descriptors at the smaller head dims too (off by default: on an H100 and an H200 they
        made the forward slower at D = 64, where D = 128 gained; chapter 10).
    ``exp2``
        the forward and backward kernels (FA2 numerics, bf16/fp16: :func:`base_two`) exponentiate
        with 2^x, log₂e folded into the scale and the row's offset (one fused multiply-add per
        score), as FlashAttention's own kernels do; a GPU's ``tl.exp`` is 2^(x·log₂e), so this
        saves one multiply per score (H100: forward 17 % faster at N >= 4096, chapter 10). The
        same numbers up to fp32 rounding (P̄ = 2^(S·log₂e − m·log₂e) = e^(S − m)); rare bf16
        values flip, so it moves bits.
    ``max_first``
        the forward kernel (FA2 numerics, offset rule off) finds each row's maximum of QKᵀ and
        scales that one number, where it scaled every score first: a multiplication per score
        fewer, and the same bits, since max(fl(x·s)) = fl(max(x)·s) exactly (rounding is
        monotone and s > 0). The paper's numerics and the offset rules need every scaled score.
    ``stored_tuning``
        a bucket of a family never tuned in this process (no nearby tuned bucket to borrow from
        either) takes the configuration the autotuner chose for the nearest lengths of the same
        family in the stored GPU benchmark (``results/perf_tuning.json``, written by
        :mod:`kernels.gpu.perf`), when this GPU is the model that benchmark ran on: its first
        call compiles one configuration (seconds) instead of timing every one.
    ``parallel_compile``
        a first launch that compiles several configurations (autotuning), the backward's
        kernels, and (on a forward's first call) the backward's kernels ahead, compile in
        parallel threads instead of one after the other.
    ``specialise_lengths``
        Triton compiles one kernel per specialisation of the integer arguments (whether each is
        1, whether it is divisible by 16); the head count is never specialised, the sequence
        lengths are by default (a length divisible by 16 gets kernels of its own, Triton's
        default; the H100 records show no speed difference beyond their noise). Off, one kernel
        serves every length. Read once, when the kernels are defined: only ``LPFA_OFF`` changes
        it (:mod:`kernels.gpu.call_cost` measures both, in two processes).
    ``fused``
        the emulator's paper numerics run their elementwise chains as fused Triton kernels on a
        CUDA GPU (:mod:`kernels.attention.emulator_fused`, the same bits in fewer passes); off,
        op by op, as on a CPU.
    ``lean_launch``
        a direct launch calls the compiled kernel's C launcher itself, with each tensor's address
        as an integer: Triton's runner (a Python closure that looks up the device and the stream
        and builds launch metadata) is skipped, and so is the C launcher's driver query, per
        tensor, of where the pointer lives. The same addresses reach the same kernel, so no
        bit moves; with a launch hook set (a profiler such as proton) the call goes through
        Triton's runner. Off by default: on one H200 (``results/host_profile.json``, from
        ``python -m kernels.gpu.host_profile``) it changed no bit and trimmed the launch path
        under the profiler, but the timed host µs per call did not clearly drop.
    ``poison_outputs``
        not a speed-up but the check it gives up: output buffers start as NaN, so an entry a
        kernel never writes shows. On by default in the interpreter (the tests); on a GPU it
        would cost an extra memset per output.
    """

    direct_launch: bool = True
    causal_split: bool = True
    wide_tuning: bool = True
    tune_by_bucket: bool = True
    nearest_bucket: bool = True
    tma: bool = True
    tma_narrow: bool = False
    exp2: bool = True
    max_first: bool = True
    stored_tuning: bool = True
    parallel_compile: bool = True
    specialise_lengths: bool = True
    fused: bool = True
    lean_launch: bool = False
    poison_outputs: bool = False
    # the switches that decide what a launch compiles, as part of a plan key (worked out once
    # per value: the launcher reads it on every call)
    plan_key: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        key = (
            self.direct_launch,
            self.causal_split,
            self.wide_tuning,
            self.tune_by_bucket,
            self.tma,
            self.tma_narrow,
            self.exp2,
            self.max_first,
            self.lean_launch,
        )
        object.__setattr__(self, "plan_key", key)

    def as_dict(self) -> dict:
        """The switches by name."""
        return {name: getattr(self, name) for name in NAMES}


NAMES = tuple(field.name for field in dataclasses.fields(Speedups) if field.init)


def switched_off(text: str) -> set[str]:
    """The field names of an ``LPFA_OFF`` value (a comma list); an unknown name is an error."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(NAMES)
    if unknown:
        raise ValueError(f"{OFF_VARIABLE}: unknown speed-up {sorted(unknown)}; one of {NAMES}")
    return names


def _from_environment() -> Speedups:
    defaults = Speedups(poison_outputs=interpreting())
    off = switched_off(os.environ.get(OFF_VARIABLE, ""))
    return dataclasses.replace(defaults, **{name: False for name in off})


CURRENT: Speedups = _from_environment()


def current() -> Speedups:
    """The speed-ups in force."""
    return CURRENT


@contextlib.contextmanager
def speedups(**changes):
    """:data:`CURRENT` with ``changes`` inside the block (``with speedups(exp2=False):``); the
    value in force before comes back afterwards, whatever happens inside."""
    global CURRENT
    unknown = set(changes) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown speed-up {sorted(unknown)}; one of {sorted(NAMES)}")
    saved = CURRENT
    CURRENT = dataclasses.replace(saved, **changes)
    try:
        yield CURRENT
    finally:
        CURRENT = saved


def off_in_children(*names: str) -> None:
    """Add ``names`` to ``LPFA_OFF`` in this process's environment, so the processes it starts
    from now on begin with them off."""
    off = switched_off(os.environ.get(OFF_VARIABLE, "")) | switched_off(",".join(names))
    os.environ[OFF_VARIABLE] = ",".join(name for name in NAMES if name in off)


@contextlib.contextmanager
def tune_every_bucket():
    """For a benchmark: every bucket tuned for itself (``nearest_bucket`` and
    ``stored_tuning`` off) inside the block, and in the processes started inside it, so each
    timed shape runs the configuration tuned for it. Also a decorator (``@tune_every_bucket()``
    on a benchmark's ``main``)."""
    saved = os.environ.get(OFF_VARIABLE)
    off_in_children("nearest_bucket", "stored_tuning")
    try:
        with speedups(nearest_bucket=False, stored_tuning=False) as now:
            yield now
    finally:
        if saved is None:
            os.environ.pop(OFF_VARIABLE, None)
        else:
            os.environ[OFF_VARIABLE] = saved


def tma_usable(*tensors) -> bool:
    """Whether these (B, H, N, D) tensors are read through tensor descriptors: the ``tma``
    speed-up is on, the head dim is at least :data:`TMA_MIN_HEAD_DIM` (or ``tma_narrow`` is on),
    they are on a GPU with TMA (sm_90+) or in the interpreter (which reads descriptors too, so
    the CPU tests run this path), and they meet TMA's layout rules: unit stride along the head
    dim, every other stride and the address a multiple of 16 bytes. Everything it reads is in
    the forward's plan key, so it runs once per plan, not per call."""
    if not CURRENT.tma:
        return False
    if tensors[0].shape[-1] < TMA_MIN_HEAD_DIM and not CURRENT.tma_narrow:
        return False
    device = tensors[0].device
    if device.type == "cuda":
        if tuple(torch.cuda.get_device_capability(device)) < TMA_FROM:
            return False
    elif not interpreting():
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


def base_two(paper: bool, dtype) -> bool:
    """Whether the kernels exponentiate in base 2 (``exp2``,
    :func:`~kernels.attention.tile_ops.exp_shifted`): FA2 numerics with bf16/fp16 inputs only. The
    paper's numerics round S and S − m to the low format, which in base 2 would be other
    roundings; fp32/fp64 inputs (the references) keep e^x."""
    return CURRENT.exp2 and not paper and dtype in (torch.bfloat16, torch.float16)


def not_specialised(*lengths: str) -> list[str]:
    """The ``do_not_specialize`` list of a kernel whose length arguments are ``lengths``."""
    return ["H"] + ([] if CURRENT.specialise_lengths else list(lengths))
