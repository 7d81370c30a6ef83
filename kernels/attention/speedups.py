"""The kernels' speed-ups, each a switch in :data:`SPEEDUPS`, and what they decide.

Each can be switched off so the performance chapter can measure what it buys (the ablation in
:mod:`kernels.gpu.perf`); :func:`speedups` switches some for a block of code, and
:func:`switches` puts the current ones into the launchers' plan keys.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..env import interpreting

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
