"""The attention implementations Golden et al. compare, in every number format, with
the rounding points written out.

Golden et al. compare "Flash Attention" with "Baseline Attention" in BF16, FP16, FP32
and FP64, against a golden value (Baseline Attention in FP64). Which flash and which
baseline is meant decides the answer, so this module has every candidate, each a
function ``(q, k, v, low, ...)`` that returns O as a tensor of the working dtype (fp32,
or fp64 when ``low`` is fp64) holding ``low`` values. ``rnd(x)`` rounds to the nearest ``low``
value, ties to even; every other operation is exact in the working dtype (as PyTorch
does when it computes a bf16 op in fp32 and rounds the result once).

``baseline``
    standard attention with S and P *stored* in the format (PyTorch's math path on
    low-precision tensors): O = rnd(rnd(softmax(rnd(rnd(Q Kᵀ)·scale))) V)
``baseline_fp32``
    the same formula computed in fp32 from the format's inputs, O rounded once (a math
    path that upcasts; within fp32 rounding of the ideal rnd(O_exact))
``fa2``
    FlashAttention-2 with fp32 accumulation: the book's Triton kernel, through its
    emulator (:mod:`kernels.attention.emulator`, ``numerics="fa2"``), run by the registry
``paper``
    FlashAttention-2 with every tensor held in the format (Qiu & Yao's released PyTorch
    code): the emulator with ``numerics="paper"``, run by the registry
``fa1``
    FlashAttention (Dao et al. 2022, Algorithm 1) re-implemented with every tensor held
    in the format, as Golden et al. describe their microbenchmark: the output of a row
    block is *normalised after every key tile* and stored,
    O ← rnd(rnd(rnd(rnd(ℓ·α)·O) + rnd(β·rnd(P̃V))) / ℓ_new)

The golden value (:func:`golden`) is softmax(QKᵀ·scale)V in fp64 of the *same* rounded
inputs, so every error below is the implementation's own; :func:`ideal` is that value
rounded once to the format, the best any stored output can be.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from ..attention import emulator, registry
from ..attention.reference import attention_fp64, default_scale
from ..numerics.rounding import round_to_dtype, work_dtype

FORMATS = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
    "fp64": torch.float64,
}
IMPLEMENTATIONS = registry.group("golden")
# what the GPU script runs besides (kernels.golden.gpu), and the ideal output
RUN = registry.group("golden-run")
_NAMED = IMPLEMENTATIONS + ("ideal",) + RUN
LABELS = {name: registry.label(name) for name in _NAMED}
SHORT = {name: registry.short(name) for name in _NAMED}


def format_dtype(fmt) -> torch.dtype:
    """A torch dtype from a format name ("bf16", "fp16", "fp32", "fp64") or a dtype."""
    if isinstance(fmt, torch.dtype) and fmt in FORMATS.values():
        return fmt
    if fmt in FORMATS:
        return FORMATS[fmt]
    raise ValueError(f"format must be one of {tuple(FORMATS)}, got {fmt!r}")


def format_name(low: torch.dtype) -> str:
    """ "bf16", "fp16", "fp32" or "fp64" for a dtype."""
    for name, dtype in FORMATS.items():
        if dtype == low:
            return name
    raise ValueError(f"no format name for {low}")


def _scale(q, scale):
    return default_scale(q.shape[-1], scale)


def _inputs(q, k, v, low):
    work = work_dtype(low)
    return tuple(round_to_dtype(t.to(work), low) for t in (q, k, v))


def golden(q, k, v, low=torch.bfloat16, scale=None) -> torch.Tensor:
    """softmax(Q Kᵀ·scale) V in fp64 of the inputs rounded to ``low`` (the golden
    value)."""
    q, k, v = _inputs(q, k, v, low)
    return attention_fp64(q, k, v, scale=_scale(q, scale))


def ideal(gold: torch.Tensor, low=torch.bfloat16) -> torch.Tensor:
    """The golden value rounded once to ``low`` (fp64 stays as it is)."""
    return gold if low == torch.float64 else round_to_dtype(gold.to(torch.float64), low)


def baseline(q, k, v, low=torch.bfloat16, scale=None, **_) -> torch.Tensor:
    """Standard attention with S, P and O stored in ``low``."""
    rnd = lambda x: round_to_dtype(x, low)  # noqa: E731
    q, k, v = _inputs(q, k, v, low)
    s = rnd(rnd(q @ k.transpose(-1, -2)) * _scale(q, scale))
    return rnd(rnd(torch.softmax(s, dim=-1)) @ v)


def baseline_fp32(q, k, v, low=torch.bfloat16, scale=None, **_) -> torch.Tensor:
    """Standard attention computed in fp32 (fp64 for fp64) from ``low`` inputs; O
    rounded once."""
    q, k, v = _inputs(q, k, v, low)
    s = (q @ k.transpose(-1, -2)) * _scale(q, scale)
    return round_to_dtype(torch.softmax(s, dim=-1) @ v, low)


def fa1(q, k, v, low=torch.bfloat16, scale=None, block_m=None, block_n=64, with_counts=False):
    """FlashAttention's Algorithm 1 with every tensor held in ``low``.

    The outer loop runs over key/value tiles of ``block_n`` (B_c), the inner over query
    blocks of ``block_m`` (B_r; None: all rows at once). Each step normalises and stores
    the row block's output, so O is rounded once per key tile. ``with_counts=True`` also
    returns, per row, how many times the running maximum grew after the first tile (the
    rescalings that change m)."""
    if block_n < 1 or (block_m is not None and block_m < 1):
        raise ValueError(f"block sizes must be >= 1, got block_m={block_m}, block_n={block_n}")
    rnd = lambda x: round_to_dtype(x, low)  # noqa: E731
    q, k, v = _inputs(q, k, v, low)
    scale = _scale(q, scale)
    n_q, n_k = q.shape[-2], k.shape[-2]
    block_m = n_q if block_m is None else block_m
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
    ell = torch.zeros_like(m)
    out = torch.zeros_like(q)
    grew = torch.zeros_like(m)
    for start in range(0, n_k, block_n):  # B_c: key tiles (outer loop)
        k_j, v_j = (k[..., start : start + block_n, :], v[..., start : start + block_n, :])
        # A tile's products are row-local, so they are formed once for every query row: a
        # 1-row block would otherwise reach the BLAS as a matrix-vector product, whose fp32
        # summation order differs from a matrix product's and can flip a rounding.
        s = rnd(rnd(q @ k_j.transpose(-1, -2)) * scale)
        m_tile = s.amax(-1)
        p = rnd(torch.exp(rnd(s - m_tile.unsqueeze(-1))))
        ell_tile, pv = rnd(p.sum(-1)), rnd(p @ v_j)
        for row in range(0, n_q, block_m):  # B_r: query blocks (inner loop)
            rows = slice(row, row + block_m)
            m_i, ell_i, o_i, mt_i = (
                m[..., rows],
                ell[..., rows],
                out[..., rows, :],
                m_tile[..., rows],
            )
            m_new = torch.maximum(m_i, mt_i)
            alpha = rnd(torch.exp(rnd(m_i - m_new)))  # rescales the old O and ℓ
            beta = rnd(torch.exp(rnd(mt_i - m_new)))  # rescales this tile
            ell_new = rnd(rnd(alpha * ell_i) + rnd(beta * ell_tile[..., rows]))
            old = rnd(rnd(ell_i * alpha).unsqueeze(-1) * o_i)
            new = rnd(beta.unsqueeze(-1) * pv[..., rows, :])
            out[..., rows, :] = rnd(rnd(old + new) / ell_new.unsqueeze(-1))
            if start > 0:
                grew[..., rows] += (mt_i > m_i).to(grew.dtype)
            m[..., rows], ell[..., rows] = m_new, ell_new
    return (out, grew) if with_counts else out


# the models this module computes itself; fa2 and paper are the registry's emulator entries
MODELS = {"baseline": baseline, "baseline_fp32": baseline_fp32, "fa1": fa1}


def run_in_format(impl: str, q, k, v, low=torch.bfloat16, scale=None, block_m=None, block_n=64):
    """O of one implementation (a name in :data:`IMPLEMENTATIONS`), working dtype: the
    emulator's through the registry (:func:`kernels.attention.registry.emulator_runner`), the
    rest by :data:`MODELS`."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    low = format_dtype(low)
    if impl in MODELS:
        return MODELS[impl](q, k, v, low=low, scale=scale, block_m=block_m, block_n=block_n)
    forward = registry.emulator_runner(impl, scale=scale, block_n=block_n)
    return forward(q, k, v, low=low).out.to(work_dtype(low))


# each implementation as ``fn(q, k, v, low, scale, block_m=None, block_n=64)``: a view of
# :func:`run_in_format`, which the microbenchmark runs one head at a time
RUNNERS = {name: functools.partial(run_in_format, name) for name in IMPLEMENTATIONS}


class OffsetCounter:
    """Per-row counts of running-maximum growth, one tensor per emulator call (see
    :func:`count_offset_changes`)."""

    def __init__(self, results=None):
        self._results = [] if results is None else results

    @property
    def calls(self) -> list[torch.Tensor]:
        return [r.offset_growths for r in self._results]

    def total(self, dim: int = -2) -> torch.Tensor:
        """The calls' counts side by side along ``dim`` (default: the head axis of
        (B, H, N))."""
        if not self._results:
            raise RuntimeError("no emulator call was counted")
        return torch.cat(self.calls, dim=dim)


@contextlib.contextmanager
def count_offset_changes():
    """Count, inside the emulator, how often each row's running maximum grows after its
    first key tile (each growth rescales ℓ and Ō by α = e^(m_old − m_new) < 1).

    ``with count_offset_changes() as counter: emulator.flash_forward(...)``; then
    ``counter.calls[i]`` holds the per-row counts of call i (shaped like L) and
    ``counter.total()`` all of them: the emulator's own counts
    (:attr:`kernels.attention.emulator.ForwardResult.offset_growths`, seen through
    :func:`kernels.attention.emulator.watch`)."""
    with emulator.watch() as seen:
        yield OffsetCounter(seen)


def expected_record_count(tiles: int) -> float:
    """For i.i.d. continuous tile maxima, the expected number of times a running maximum
    grows after the first of ``tiles`` tiles: H_T − 1 = Σ_{t=2..T} 1/t (tile t holds the
    largest of the first t with probability 1/t)."""
    if tiles < 1:
        raise ValueError(f"tiles must be >= 1, got {tiles}")
    return sum(1.0 / t for t in range(2, tiles + 1))
