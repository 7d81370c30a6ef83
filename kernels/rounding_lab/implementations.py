"""Running one implementation on a built case: the emulator, torch SDPA, the Triton kernel,
and two CPU models of the hardware accumulation (``fa2-fma``, ``fa2-mma``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..attention import registry
from ..numerics.rounding import error_in_ulps, round_to_dtype
from ..numerics.stats import bias_summary
from .cases import Built, Case, build, reference

# implementations run by the emulator; "-untiled" uses one tile of the whole sequence (the
# paper's own PyTorch code is untiled, so its Algorithm 3 sees every key at once)
EMULATED = tuple(n for n in registry.group("lab") if registry.get(n).kind == "emulator")
# triton: the book's kernel (kernels.attention), hardware bf16 on a GPU; triton-explicit: the
# same kernel on its explicit-rounding path (fp32 IEEE dots); fa2-mma: P̄V as one tensor-core
# bf16 matmul with an fp32 result (torch.bmm(..., out_dtype=float32)), the rest as fa2, untiled
GPU_ONLY = registry.group("lab-gpu")
# fa2-fma: FA2 numerics with the products added one by one to the running accumulator (a CPU
# model of what tl.dot(p, v, acc) does on a GPU; see fa2_fused_accumulation)
IMPLEMENTATIONS = registry.group("lab") + GPU_ONLY  # ideal, fa2-fma, then EMULATED


# running the implementations
# ----------------------------------------------------------------------------------------------


@dataclass
class Output:
    out: torch.Tensor  # O as computed (fp32 holding bf16 values, or NaN/inf)
    row_offset: torch.Tensor | None  # final m of each row (emulator only)
    row_sum: torch.Tensor | None  # final ℓ of each row (emulator only)
    ties_seen: torch.Tensor | None  # did the rule see rs > 1 (emulator only)


def _sdpa(built: Built, name: str) -> torch.Tensor:
    q, k, v = (t.to(torch.bfloat16).unsqueeze(1).contiguous() for t in (built.q, built.k, built.v))
    return registry.run(name, q, k, v, scale=1.0).squeeze(1).float()


def _triton(built: Built, name, stable, beta, eps, block_n) -> torch.Tensor:
    """The book's kernel (``triton``, or ``triton-explicit``: its explicit-rounding path)."""
    q, k, v = (t.to(torch.bfloat16).unsqueeze(1).contiguous() for t in (built.q, built.k, built.v))
    o = registry.run(
        name,
        q,
        k,
        v,
        causal=False,
        scale=1.0,
        stable=stable,
        beta=beta,
        eps=eps,
        numerics="fa2",
        block_m=min(64, q.shape[-2]),
        block_n=block_n or 64,
    )
    return o.squeeze(1).float()


def _fa2_mma(built: Built) -> torch.Tensor:
    """FA2 numerics, untiled, with P̄V done by the GPU's bf16 matrix unit into fp32."""
    s = built.scores
    p = torch.exp(s - s.amax(-1, keepdim=True))  # fp32
    acc = torch.bmm(p.to(torch.bfloat16), built.v.to(torch.bfloat16), out_dtype=torch.float32)
    return round_to_dtype(acc / p.sum(-1, keepdim=True), torch.bfloat16)


def run_case(
    impl: str, built: Built, *, stable="off", beta=2.0, eps=1e-3, offset=0.0, block_n=None
) -> Output:
    """Compute O with implementation ``impl`` (see :data:`IMPLEMENTATIONS`).

    ``ideal`` is the exact O_hp rounded once to bf16: the best any bf16 output can do. The
    lab's two models (``fa2-fma``, ``fa2-mma``) run here; every other name is run by the
    registry (:mod:`kernels.attention.registry`)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "ideal":
        return Output(round_to_dtype(reference(built), torch.bfloat16).float(), None, None, None)
    if impl == "fa2-fma":
        if stable != "off":
            raise ValueError("fa2-fma models the kernel without the offset rule: use stable='off'")
        return Output(fa2_fused_accumulation(built, block_n or 64), None, None, None)
    kind = registry.get(impl).kind
    if kind == "emulator":
        rule = dict(scale=1.0, beta=beta, eps=eps, offset=offset, block_n=block_n or 64)
        res = registry.emulator_runner(f"{impl}/{stable}", **rule)(built.q, built.k, built.v)
        return Output(res.out.float(), res.row_offset, res.row_sum, res.ties)
    if kind == "book":  # native on a GPU, the interpreter on a CPU
        return Output(_triton(built, impl, stable, beta, eps, block_n), None, None, None)
    if not built.q.is_cuda:
        raise ValueError(f"{impl} needs a CUDA GPU; build the case with device='cuda'")
    if impl == "fa2-mma":
        return Output(_fa2_mma(built), None, None, None)
    return Output(_sdpa(built, impl), None, None, None)


def measure(
    case: Case,
    impl: str,
    stable="off",
    *,
    beta=2.0,
    eps=1e-3,
    offset=0.0,
    seed=0,
    device="cpu",
    built: Built | None = None,
) -> dict:
    """Bias of one implementation on one case: the numbers a sweep cell holds."""
    built = build(case, seed, device) if built is None else built
    o_hp = reference(built)
    res = run_case(
        impl, built, stable=stable, beta=beta, eps=eps, offset=offset, block_n=case.block_n
    )
    stats = bias_summary(error_in_ulps(res.out, o_hp))
    stats["correctly_rounded"] = float(
        (res.out.double() == round_to_dtype(o_hp, torch.bfloat16)).double().mean()
    )
    return stats


def fa2_fused_accumulation(built: Built, block_n: int = 64) -> torch.Tensor:
    """FA2 numerics (stable='off') with P̄V accumulated *into* the running fp32 accumulator one
    product at a time, as ``acc = tl.dot(p, v, acc)`` does on a GPU (an FMA chain per output):
    a CPU model of the hardware kernels, not of the emulator, which adds each tile's
    product P̄_j V_j to the accumulator as one separately computed sum.

    The difference matters when the accumulator already holds a tied V (|acc| ≈ 1) and the other
    tokens' products (≈ 1e-7) are below half its fp32 ulp: added one by one they are rounded
    away; summed per tile first they survive."""
    s, v = built.scores, built.v
    b, d, n = s.shape
    m = torch.full((b, d), -math.inf, device=s.device)
    ell = torch.zeros((b, d), device=s.device)
    acc = torch.zeros((b, d, v.shape[-1]), device=s.device)
    for start in range(0, n, block_n):
        s_j = s[..., start : start + block_n]
        m_new = torch.maximum(m, s_j.amax(-1))
        p = torch.exp(s_j - m_new.unsqueeze(-1))
        alpha = torch.exp(m - m_new)
        ell = alpha * ell + p.sum(-1)
        acc = alpha.unsqueeze(-1) * acc
        p_low = round_to_dtype(p, torch.bfloat16)
        for t in range(s_j.shape[-1]):  # one fused multiply-add per key, in order
            acc = acc + p_low[..., t : t + 1] * v[:, None, start + t, :]
        m = m_new
    return round_to_dtype(acc / ell.unsqueeze(-1), torch.bfloat16)
