"""What an attention call computes, said once: :class:`AttentionOptions`, validated on creation.

The Triton kernels, the emulator, the autograd function and the GPT-2 attention specs all take
one of these, so every option has one meaning and one check. A consumer that supports only part
of the space says so with a *capability* check (``opts.require_kernel()``), never by validating
the options again. The kernels' capability check runs once per options object
(:attr:`AttentionOptions.kernel` keeps its outcome), and keyword options given to
``flash_attention`` are turned into an options object once per distinct set
(:func:`options_from`): a training step repeats neither. Tensors are checked separately, once
per call (:func:`check_tensors`); :func:`checked_call` does all of a call's checks at once and
picks its rounding path (:func:`use_explicit`).

The codes below are the compile-time constants the Triton kernels branch on (``STABLE ==
STABLE_CROSS`` rather than ``STABLE == 2``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import torch

from ..env import native_bf16
from ..interpreter import interpreting
from ..numerics.triton_rounding import LOW_BF16, LOW_CODES, LOW_FP16, LOW_FP32, LOW_FP64
from .reference import default_scale

__all__ = [
    "AttentionOptions",
    "KernelOptions",
    "options_from",
    "check_tensors",
    "check_device",
    "use_explicit",
    "checked_call",
    "NUMERICS",
    "STABLE_MODES",
    "KERNEL_STABLE",
    "KERNEL_STABLE_MODES",
    "OFFSET_RULES",
    "TIE_RULES",
    "STABLE_OFF_ON",
    "DELTA_SOURCES",
    "STABLE_OFF",
    "STABLE_TILE",
    "STABLE_CROSS",
    "LOW_CODES",
    "LOW_BF16",
    "LOW_FP16",
    "LOW_FP32",
    "LOW_FP64",
    "SUPPORTED_HEAD_DIMS",
    "SUPPORTED_DTYPES",
]

NUMERICS = ("fa2", "paper")
# the offset rule: off = running max; tile = the paper's Algorithm 3 per key tile; cross = the
# rule on the running (max, tie count) of all tiles so far; always / offset = Appendix C's
# unconditional rule and a fixed shift (emulator only)
STABLE_MODES = ("off", "tile", "cross", "always", "offset")
STABLE_OFF, STABLE_TILE, STABLE_CROSS = 0, 1, 2
KERNEL_STABLE = {"off": STABLE_OFF, "tile": STABLE_TILE, "cross": STABLE_CROSS}
KERNEL_STABLE_MODES = tuple(KERNEL_STABLE)  # the rules the Triton kernels compute
OFFSET_RULES = tuple(mode for mode in KERNEL_STABLE_MODES if mode != "off")  # they move m
# the rules that look for tied maxima (β > 1 and ε act on them); "offset" shifts m blindly
TIE_RULES = tuple(mode for mode in STABLE_MODES if mode not in ("off", "offset"))
# the rule off, and the rule stable=True turns on: the pair most checks compare
STABLE_OFF_ON = ("off", "cross")
# where the backward pass takes δ = rowsum(dO ∘ O) from
DELTA_SOURCES = ("o", "dp", "o_fp32")
ACC_ROUNDINGS = ("rne", "sr")
ELL_CLAMP_AT = ("out", "tiles")  # the clamp on ℓ: final denominator only, or each tile's sum
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class KernelOptions(NamedTuple):
    """What the Triton kernels read from an :class:`AttentionOptions`, worked out once per
    options object (:attr:`AttentionOptions.kernel`) instead of on every call."""

    causal: bool
    stable: int  # STABLE_OFF / STABLE_TILE / STABLE_CROSS
    cap: bool  # offset_cap given
    cap_value: float  # offset_cap, or 0.0
    paper: bool  # numerics == "paper"
    ell_rounded: bool
    delta_source: str
    block_m: int | None
    block_n: int | None


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    return float(value)


def _stable(stable) -> str:
    """False/None/'off' -> 'off', True/'cross' -> 'cross', other mode names as they are."""
    if stable is False or stable is None:
        return "off"
    if stable is True:
        return "cross"
    if isinstance(stable, str) and stable in STABLE_MODES:
        return stable
    raise ValueError(f"stable must be False, True or one of {STABLE_MODES}, got {stable!r}")


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """Everything that decides the numbers of one attention call, except the tensors.

    causal        hide key j from query i when j > i (top-left aligned)
    scale         multiplies QKᵀ; None: 1/√head_dim
    numerics      "fa2": fp32 accumulation, P̄ rounded before P̄V, O rounded once;
                  "paper": S, P̄, α, ℓ and Ō held in the low format (the paper's PyTorch code)
    stable        the offset rule (see ``STABLE_MODES``); True means "cross", False "off"
    beta, eps     Algorithm 3's β (> 1) and ε (≥ 0); offset: the fixed shift of "offset"
    delta_source  "o" (FA2), "dp" (rowsum(dP ∘ P)) or "o_fp32" (O recomputed unrounded)
    block_m, block_n  tile sizes; None: the kernel's choice (emulator: 64 keys)
    acc_bits      paper numerics only: Ō held with this many mantissa bits (7 = bf16)
    acc_rounding  "rne" or "sr" (stochastic) for Ō at acc_bits < 7
    offset_cap    the offset rule moves m at most this far above the row maximum
                  (m = r_m + min(rule − r_m, cap)): tied P̄ ≥ e^−cap, so ℓ cannot underflow
    ell_rounded   FA2 numerics: ℓ sums the *rounded* P̄ that multiplies V (numerator and
                  denominator then agree), instead of the unrounded fp32 P̄
    ell_clamp     paper numerics: ℓ clamped from below (the paper's released code clamps at 1e-10);
                  None: no clamp (ℓ = 0 gives NaN)
    ell_clamp_at  where the clamp acts: "out" = only the final denominator, O = Ō / max(ℓ, c),
                  with L = m + log ℓ from the unclamped ℓ; "tiles" = as the released code does:
                  each key tile's rnd(rowsum(P̄)) is clamped before it joins ℓ, and L is formed
                  from those clamped sums (forward and backward then agree)
    """

    causal: bool = False
    scale: float | None = None
    numerics: str = "fa2"
    stable: str = "off"
    beta: float = 2.0
    eps: float = 1e-3
    offset: float = 0.0
    delta_source: str = "o"
    block_m: int | None = None
    block_n: int | None = None
    acc_bits: int | None = None
    acc_rounding: str = "rne"
    offset_cap: float | None = None
    ell_rounded: bool = False
    ell_clamp: float | None = None
    ell_clamp_at: str = "out"

    def __post_init__(self):
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        fix("causal", bool(self.causal))
        fix("stable", _stable(self.stable))
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
        if self.delta_source not in DELTA_SOURCES:
            raise ValueError(
                f"delta_source must be one of {DELTA_SOURCES}, got {self.delta_source!r}"
            )
        fix("beta", _number("beta", self.beta))
        fix("eps", _number("eps", self.eps))
        fix("offset", _number("offset", self.offset))
        if self.stable in TIE_RULES and not self.beta > 1:
            raise ValueError(
                f"beta must be > 1 (got {self.beta:g}): with beta <= 1 the tied maxima keep P̄ = 1"
            )
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps:g}")
        if self.scale is not None:
            scale = _number("scale", self.scale)
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"scale must be a positive finite number, got {scale:g}")
            fix("scale", scale)
        for name in ("block_m", "block_n"):
            blk = getattr(self, name)
            if blk is not None and (isinstance(blk, bool) or not isinstance(blk, int) or blk < 1):
                raise ValueError(f"{name} must be a positive number of rows/keys, got {blk!r}")
        self._check_accumulator()
        self._check_fixes()

    def _check_fixes(self):
        if self.offset_cap is not None:
            cap = _number("offset_cap", self.offset_cap)
            if not (math.isfinite(cap) and cap > 0):
                raise ValueError(f"offset_cap must be a positive finite number, got {cap:g}")
            object.__setattr__(self, "offset_cap", cap)
        object.__setattr__(self, "ell_rounded", bool(self.ell_rounded))
        if self.ell_rounded and self.numerics != "fa2":
            raise ValueError(
                "ell_rounded belongs to FA2 numerics (the paper's path rounds ℓ and P̄ anyway)"
            )
        if self.ell_clamp is not None:
            clamp = _number("ell_clamp", self.ell_clamp)
            if not clamp > 0:
                raise ValueError(f"ell_clamp must be > 0, got {clamp:g}")
            if self.numerics != "paper":
                raise ValueError("ell_clamp models the paper's released code: numerics='paper'")
            object.__setattr__(self, "ell_clamp", clamp)
        if self.ell_clamp_at not in ELL_CLAMP_AT:
            raise ValueError(
                f"ell_clamp_at must be one of {ELL_CLAMP_AT}, got {self.ell_clamp_at!r}"
            )

    def _check_accumulator(self):
        if self.acc_rounding not in ACC_ROUNDINGS:
            raise ValueError(f"acc_rounding must be 'rne' or 'sr', got {self.acc_rounding!r}")
        if self.acc_bits is None:
            if self.acc_rounding == "sr":
                raise ValueError(
                    "acc_rounding='sr' needs acc_bits (1..7): it rounds the amplifier format"
                )
            return
        if self.numerics != "paper":
            raise ValueError(f"acc_bits needs numerics='paper' (got {self.numerics!r})")
        if isinstance(self.acc_bits, bool) or not 1 <= int(self.acc_bits) <= 7:
            raise ValueError(
                f"acc_bits must be 1..7 (bf16 keeps 7 mantissa bits), got {self.acc_bits}"
            )

    @functools.cached_property
    def kernel(self) -> KernelOptions:
        """The kernels' view of these options, checked by :meth:`require_kernel` the first
        time it is asked for and then kept on the (immutable) object: a call with options
        that were already used does no validation at all."""
        self.require_kernel()
        return KernelOptions(
            self.causal,
            KERNEL_STABLE[self.stable],
            self.offset_cap is not None,
            self.offset_cap or 0.0,
            self.numerics == "paper",
            self.ell_rounded,
            self.delta_source,
            self.block_m,
            self.block_n,
        )

    def replace(self, **changes) -> AttentionOptions:
        return dataclasses.replace(self, **changes)

    def scale_for(self, head_dim: int) -> float:
        return default_scale(head_dim) if self.scale is None else self.scale

    def require_kernel(self) -> None:
        """What the Triton kernels can do: three offset rules, power-of-two tiles >= 16, no
        amplifier format."""
        if self.stable not in KERNEL_STABLE:
            raise ValueError(
                f"the Triton kernels implement stable = {tuple(KERNEL_STABLE)}; "
                f"{self.stable!r} exists only in the emulator"
            )
        if self.acc_bits is not None:
            raise ValueError("acc_bits (the narrower Ō) exists only in the emulator")
        if self.ell_clamp is not None:
            raise ValueError("ell_clamp (the paper's clamped ℓ) exists only in the emulator")
        for name in ("block_m", "block_n"):
            blk = getattr(self, name)
            if blk is not None and (blk < 16 or blk & (blk - 1)):
                raise ValueError(
                    f"{name} must be a power of two >= 16 for the kernels, got {blk!r}"
                )


_OPTIONS_CACHE: dict = {}


def options_from(options: dict) -> AttentionOptions:
    """``AttentionOptions(**options)``, made and validated once per distinct set of keyword
    options (a training loop calls attention with the same keywords every step)."""
    try:
        # the type is part of the key: stable=1 must still be refused although 1 == True
        key = tuple((name, type(value), value) for name, value in sorted(options.items()))
        found = _OPTIONS_CACHE.get(key)
    except TypeError:  # an unhashable value: let validation say what
        return AttentionOptions(**options)
    if found is None:
        found = AttentionOptions(**options)
        if len(_OPTIONS_CACHE) > 256:
            _OPTIONS_CACHE.clear()
        _OPTIONS_CACHE[key] = found
    return found


def check_tensors(q, k, v, *, kernel: bool = True) -> None:
    """Raise a clear TypeError/ValueError for q, k, v that the kernels (or, with
    ``kernel=False``, the emulator: any (..., N, D) shape and float dtype) cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if kernel and t.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{name} has dtype {t.dtype}; supported: bfloat16, float16, float32, float64"
            )
    if kernel and not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(
            f"shapes do not match: k and v must have the same shape, got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"shapes do not match: q {tuple(q.shape)} and k {tuple(k.shape)} must share batch, "
            "heads and head_dim"
        )
    if kernel and q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head_dim {q.shape[-1]} is not supported; supported head dims: {SUPPORTED_HEAD_DIMS}"
        )
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got {q.shape[-2]} and {k.shape[-2]}")


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


# whether the kernels run in Triton's interpreter: fixed when they are defined, at import
INTERPRETING = interpreting()


def check_device(q) -> None:
    """CPU tensors need the interpreter; GPU tensors need it switched off."""
    if q.device.type == "cuda" and INTERPRETING:
        raise ValueError(
            "TRITON_INTERPRET=1 is set but the tensors are on the GPU: move them "
            "to the CPU or unset TRITON_INTERPRET before importing kernels"
        )
    if q.device.type == "cpu" and not INTERPRETING:
        raise ValueError(
            "CPU tensors need the Triton interpreter (import kernels before triton "
            "on a machine without a GPU), or move the tensors to the GPU"
        )


def checked_call(q, k, v, opts: AttentionOptions | None, options: dict, explicit):
    """The one place a kernel call's inputs are checked: its options (``opts``, or made from the
    keyword ``options``; the kernels' capability check runs once per options object), its
    tensors and their device. Returns the options and the rounding path."""
    opts = options_from(options) if opts is None else opts
    if not torch.compiler.is_compiling():  # traced, the op checks them when it first runs
        opts.kernel  # noqa: B018  (raises if the kernels cannot compute these options)
    check_tensors(q, k, v)
    check_device(q)
    return opts, use_explicit(explicit)
