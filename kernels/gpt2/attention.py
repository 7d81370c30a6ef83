"""Causal self-attention, switchable per layer, for the GPT-2 chapter.

An attention *spec* is a short string ``kind[:key=value,...]``:

``sdpa``        torch ``scaled_dot_product_attention`` (FlashAttention-2 on a CUDA GPU under bf16)
``math32``      plain softmax(QKᵀ/√d)V computed in fp32 (autocast switched off)
``triton``      the book's Triton FA2 (``kernels.flash_attention``); options numerics=fa2|paper,
                delta, stable=off|cross|tile, beta, eps, block (key tile width)
``paper``       the paper's bf16 PyTorch FA2: :class:`kernels.attention.emulator.EmulatedAttention`
                with ``numerics="paper"`` (S, P̄, Ō, ℓ held in bf16), backward = FA2's Algorithm 2
                in PyTorch. Options:
                  delta=o | dp | o_fp32   where δ comes from (§3.2 of the paper):
                      o       rowsum(dO ∘ O) with the bf16 O of the forward pass (the failing path)
                      dp      rowsum(dP ∘ P)                      (mathematically equal, no O)
                      o_fp32  rowsum(dO ∘ PV) with PV recomputed in fp32 (the paper's stable
                      control)
                  stable=off | cross | tile, beta=2, eps=1e-3   (Algorithm 3's offset, §4)
                  block=0 (untiled: one tile of the whole sequence, the paper's setup) or a tile
                  width
                  obits=7 mantissa bits of Ō and of P̄V (7 = bf16; fewer magnifies their rounding,
                      the chapter's amplifier; the exponent stays bf16's)
                  oround=rne | sr  how Ō is rounded at obits < 7: to nearest-even, or stochastically
                      (unbiased, same error size: the control for "biased, not just large")
                  cap=c    Algorithm 3's offset moves m at most c above the row maximum
                      (ℓ cannot underflow); clamp=x  ℓ clamped at x from below, where
                      clamp_at=out (the final denominator only) or clamp_at=tiles (each key
                      tile's row sum, which then also forms L: the paper's released code)
                  dshift=c, dnoise=σ, derr=keep|mean|sign, out=low|exact   controls that tell a
                      biased δ from a large one: see :mod:`kernels.gpt2.controls`
                  fp32_heads=h or h1+h2   with delta=o: these heads take δ from O in fp32 (the
                      control's route), the others the failing path's (the paper's per-head
                      ablation, §3.2 and Fig. 3)

Examples: ``"paper"``, ``"paper:delta=o_fp32"``, ``"paper:stable=cross,beta=2"``,
``"paper:obits=3"``,
``"paper:delta=o_fp32,dshift=2e-9"``, ``"paper:delta=o,derr=sign"``, ``"paper:delta=o,out=exact"``,
``"paper:delta=o,fp32_heads=3"``.

Every option is checked once, by :class:`kernels.attention.AttentionOptions` (``spec.options``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import AttentionOptions, flash_attention
from ..attention.emulator import EmulatedAttention
from ..attention.options import KERNEL_STABLE_MODES
from ..attention.reference import standard_attention
from ..attention.registry import group
from .controls import ControlledAttention, check_control

KINDS = group("gpt2")  # the attention kinds a spec may name (kernels.attention.registry)


@dataclass(frozen=True)
class AttnSpec:
    kind: str = "sdpa"
    delta: str = "o"
    stable: str = "off"
    beta: float = 2.0
    eps: float = 1e-3
    block: int = 0
    numerics: str = "fa2"  # only for kind="triton"
    obits: int = 7  # only for kind="paper": mantissa bits of Ō (7 = bf16)
    oround: str = "rne"  # only for kind="paper" with obits < 7: "rne" or "sr"
    cap: float | None = None  # Algorithm 3's offset at most this far above the row maximum
    clamp: float | None = None  # paper numerics: ℓ ≥ clamp (see clamp_at)
    clamp_at: str = "out"  # "out": final denominator only; "tiles": each tile's sum, as released
    dshift: float = 0.0  # the δ controls of kernels.gpt2.controls
    dnoise: float = 0.0
    derr: str = "keep"
    out: str = "low"
    fp32_heads: tuple = ()  # kind="paper", delta=o: heads whose δ comes from O in fp32

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"attention kind must be one of {KINDS}, got {self.kind!r}")
        if self.stable not in KERNEL_STABLE_MODES:
            raise ValueError(f"stable must be one of {KERNEL_STABLE_MODES}, got {self.stable!r}")
        if self.obits != 7 and self.kind != "paper":
            raise ValueError(f"obits applies to the 'paper' kind only, got it with {self.kind!r}")
        if (
            self.kind == "triton"
            and self.block
            and (self.block < 16 or self.block & (self.block - 1))
        ):
            raise ValueError(
                f"block must be a power of two >= 16 for the triton kind, got {self.block}"
            )
        self.options(self.block or 1)  # every other field is checked by AttentionOptions
        check_control(self.kind, self.delta, self.dshift, self.dnoise, self.derr, self.out)
        if self.fp32_heads:
            _check_heads(self)

    @property
    def controlled(self) -> bool:
        """True when a δ control of :mod:`kernels.gpt2.controls` is switched on."""
        return self.dshift != 0 or self.dnoise != 0 or self.derr != "keep" or self.out != "low"

    def options(self, n: int) -> AttentionOptions:
        """The attention options for sequences of ``n`` tokens (block=0: one tile of all)."""
        return _options(self, n)

    def __str__(self):
        if self.kind in ("sdpa", "math32"):
            return self.kind
        opts = [f"delta={self.delta}"] + (
            [f"numerics={self.numerics}"] if self.kind == "triton" else []
        )
        opts.append(f"stable={self.stable}")
        if self.stable != "off":
            opts += [f"beta={self.beta:g}", f"eps={self.eps:g}"]
        if self.block:
            opts.append(f"block={self.block}")
        if self.obits != 7:
            opts.append(f"obits={self.obits}")
        if self.oround != "rne":
            opts.append(f"oround={self.oround}")
        opts += [
            f"{key}={getattr(self, key)!r}"
            for key in ("cap", "clamp")  # repr: exact
            if getattr(self, key) is not None
        ]
        opts += [f"clamp_at={self.clamp_at}"] * (self.clamp_at != "out")
        opts += [
            f"{key}={getattr(self, key)!r}" for key in ("dshift", "dnoise") if getattr(self, key)
        ]
        opts += [f"derr={self.derr}"] * (self.derr != "keep") + [f"out={self.out}"] * (
            self.out != "low"
        )
        if self.fp32_heads:
            opts.append("fp32_heads=" + "+".join(map(str, self.fp32_heads)))
        return f"{self.kind}:" + ",".join(opts)


def _check_heads(spec: AttnSpec):
    heads = spec.fp32_heads
    if spec.kind != "paper" or spec.delta != "o" or spec.controlled:
        raise ValueError(
            "fp32_heads splits the failing path (kind 'paper', delta=o, no δ control) into two "
            f"routes; got kind {spec.kind!r}, delta={spec.delta}"
        )
    ok = isinstance(heads, tuple) and all(isinstance(h, int) and h >= 0 for h in heads)
    if not ok or list(heads) != sorted(set(heads)):
        raise ValueError(
            f"fp32_heads must be a tuple of distinct head indices >= 0, in order; got {heads!r}"
        )


@functools.lru_cache(maxsize=256)
def _options(spec: AttnSpec, n: int) -> AttentionOptions:
    paper = spec.kind == "paper"
    if spec.obits == 7 and spec.oround != "rne":
        raise ValueError("oround=sr needs obits < 7 (it rounds the narrower amplifier format)")
    return AttentionOptions(
        causal=True,
        numerics="paper" if paper else spec.numerics,
        stable=spec.stable,
        beta=spec.beta,
        eps=spec.eps,
        delta_source=spec.delta,
        block_n=(spec.block or n) if paper else (spec.block or None),
        acc_bits=spec.obits if spec.obits != 7 else None,
        acc_rounding=spec.oround,
        offset_cap=spec.cap,
        ell_clamp=spec.clamp,
        ell_clamp_at=spec.clamp_at,
    )


def parse_spec(text: str) -> AttnSpec:
    """Parse ``"paper:delta=o_fp32,stable=cross"`` into an :class:`AttnSpec` (clear errors)."""
    if isinstance(text, AttnSpec):
        return text
    if not isinstance(text, str):
        raise TypeError(
            f"an attention spec is a string like 'paper:delta=o', got {type(text).__name__}"
        )
    kind, _, rest = text.strip().partition(":")
    fields = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"attention option {item!r} in {text!r} is not key=value")
        key = key.strip()
        if key in ("beta", "eps", "cap", "clamp", "dshift", "dnoise"):
            fields[key] = float(value)
        elif key in ("block", "obits"):
            fields[key] = int(value)
        elif key in ("delta", "stable", "numerics", "oround", "derr", "out", "clamp_at"):
            fields[key] = value.strip()
        elif key == "fp32_heads":
            fields[key] = tuple(int(h) for h in value.split("+"))
        else:
            raise ValueError(f"unknown attention option {key!r} in {text!r}")
    try:
        return AttnSpec(kind=kind, **fields)
    except ValueError as err:
        raise ValueError(f"{err} (in {text!r})") from None


def attend(q, k, v, spec: AttnSpec, probe=None):
    """softmax(QKᵀ/√d)V, causal, computed the way ``spec`` says. Shapes (B, H, N, D).
    ``probe`` (a layer's :class:`AttentionProbe`) receives what a δ control did."""
    if spec.kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if spec.kind == "math32":
        with torch.autocast(device_type=q.device.type, enabled=False):
            return exact_attention(q.float(), k.float(), v.float())
    if spec.fp32_heads:
        return _two_routes(q, k, v, spec, probe)
    opts = spec.options(q.shape[-2])
    if spec.kind == "paper":
        if spec.controlled:
            return ControlledAttention.apply(q, k, v, opts, spec, probe)
        return EmulatedAttention.apply(q, k, v, opts)
    return flash_attention(q, k, v, opts)


_HEAD_GROUPS: dict = {}  # (fp32 heads, n_heads, device) -> device index tensors, made once


def _head_groups(fp32_heads, n_heads: int, device):
    """The heads on the control's route, the others, and the permutation that puts the two
    groups' outputs back in head order, as index tensors on ``device``. Made on the first call
    and reused, so a CUDA graph that captures a later call copies nothing from the host."""
    key = (tuple(fp32_heads), n_heads, str(device))
    if key not in _HEAD_GROUPS:
        chosen = torch.zeros(n_heads, dtype=torch.bool)
        chosen[list(fp32_heads)] = True
        picked, rest = chosen.nonzero().flatten(), (~chosen).nonzero().flatten()
        back = torch.argsort(torch.cat([picked, rest]))
        _HEAD_GROUPS[key] = tuple(t.to(device) for t in (picked, rest, back))
    return _HEAD_GROUPS[key]


def _two_routes(q, k, v, spec: AttnSpec, probe):
    """The failing path with the heads ``spec.fp32_heads`` on the control's route (δ from O in
    fp32). Heads do not mix in attention, so each group runs on its own and the outputs go back
    in head order; the forward pass is the failing path's either way."""
    n_heads = q.shape[1]
    if spec.fp32_heads[-1] >= n_heads:
        raise ValueError(f"fp32_heads {spec.fp32_heads} names a head past the {n_heads} heads")
    picked, rest, back = _head_groups(spec.fp32_heads, n_heads, q.device)
    groups = [
        (picked, dataclasses.replace(spec, delta="o_fp32", fp32_heads=())),
        (rest, dataclasses.replace(spec, fp32_heads=())),
    ]
    groups = [(heads, route) for heads, route in groups if len(heads)]
    out = torch.cat([attend(q[:, h], k[:, h], v[:, h], route, probe) for h, route in groups], 1)
    return out[:, back]


def exact_attention(q, k, v):
    """Causal softmax attention in the dtype of the inputs (no rounding inside)."""
    return standard_attention(q, k, v, causal=True)
