"""The biased-rounding lab of chapter 5: build attention rows with tied maxima, measure the bias.

Everything the chapter (and its sliders) computes lives here; the numerics themselves are the
contract in :mod:`kernels.emulate`, which this module only calls.

The construction
----------------
We want *exact* control over every score S[r, t], so we make the dot products trivial: with
``scale = 1`` and Q the D×D identity, S = Q Kᵀ = Kᵀ, i.e. row r of S is column r of K. A product
with 0 or 1 is exact and a sum of one non-zero term and zeros is exact in any order, so every
implementation (emulator, torch SDPA on a GPU, a Triton kernel) sees exactly the scores we wrote.
One "batch element" therefore holds D independent query rows; its V (N×D) is shared by the rows,
like the keys of one sequence. Per batch element:

* ``ties`` key positions (the *tied*, "sink" tokens) carry the row maximum rm of every row;
* every other score sits below it: ``rm - gap - rest_spread·|z|`` (z standard normal), rounded to
  bf16 and forced strictly below rm, so each row has exactly ``ties`` maxima;
* V at the tied positions is drawn from ``v_tied``, V elsewhere from ``v_rest``.

Every score and value is a bf16 number, so the fp64 reference O_hp = softmax(S) V computed from
the same numbers is the exact answer (up to fp64 rounding) and O_lp − O_hp is the error of the
implementation alone.

Units
-----
Errors are in *ulps of O_lp's binade*: for a bf16 result x ≠ 0, ulp(x) = 2^(⌊log2|x|⌋ − 7) (bf16
keeps 7 fraction bits), the spacing of bf16 numbers around x. When O_lp = 0 the binade of O_hp is
used. A correctly rounded result is always within ±0.5 ulp of the exact value.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from . import emulate

BF16_FRACTION_BITS = 7
V_FAMILIES = ("normal", "uniform", "laplace", "one-signed")
PLACEMENTS = ("split", "same", "any")
# implementations run by kernels.emulate; "-untiled" uses one tile of the whole sequence (the
# paper's own PyTorch code is untiled, so its Algorithm 3 sees every key at once)
EMULATED = ("paper", "fa2", "paper-untiled", "fa2-untiled")
# triton: the book's kernel (kernels.attention), hardware bf16 on a GPU; triton-explicit: the
# same kernel on its explicit-rounding path (fp32 IEEE dots); fa2-mma: P̄V as one tensor-core
# bf16 matmul with an fp32 result (torch.bmm(..., out_dtype=float32)), the rest as fa2, untiled
GPU_ONLY = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "triton", "triton-explicit", "fa2-mma")
# fa2-fma: FA2 numerics with the products added one by one to the running accumulator (a CPU
# model of what tl.dot(p, v, acc) does on a GPU; see fa2_fused_accumulation)
IMPLEMENTATIONS = ("ideal", "fa2-fma") + EMULATED + GPU_ONLY
NEGLIGIBLE_ULP = 0.02   # a statistically detectable mean below this is called negligible
# exp(-x) rounds to 1.0 in bf16 when x <= -ln(1 - 2^-9): the largest bf16 below 1 is 1 - 2^-8 and
# the halfway point 1 - 2^-9 rounds (ties to even) up to 1.0.
EXP_ROUNDS_TO_ONE = -math.log1p(-2.0 ** -9)


# ----------------------------------------------------------------------------------------------
# bf16 helpers
# ----------------------------------------------------------------------------------------------
def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bf16 (ties to even), keep the dtype (fp32/fp64)."""
    return x.to(torch.bfloat16).to(x.dtype)


def bf16_next_below(x: torch.Tensor) -> torch.Tensor:
    """The largest bf16 number strictly below each (bf16, finite) value of ``x``."""
    bits = x.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    positive = bits >= 0                              # sign bit clear (includes +0)
    is_pos_zero = bits == 0
    below = torch.where(positive, bits - 1, bits + 1)
    below = torch.where(is_pos_zero, torch.full_like(bits, -32767), below)   # 0x8001: -tiny
    below = torch.where(bits == -32768, torch.full_like(bits, -32767), below)  # -0 -> -tiny
    return below.to(torch.int16).view(torch.bfloat16).to(x.dtype)


def ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers in the binade of ``x``: 2^(floor(log2|x|) - 7); NaN for x = 0."""
    ax = x.abs().to(torch.float64)
    exponent = torch.floor(torch.log2(ax))
    exponent = torch.clamp(exponent, min=-126.0)      # subnormal bf16 share the smallest spacing
    ulp = torch.pow(2.0, exponent - BF16_FRACTION_BITS)
    return torch.where(ax > 0, ulp, torch.full_like(ulp, math.nan))


def error_in_ulps(o_lp: torch.Tensor, o_hp: torch.Tensor) -> torch.Tensor:
    """(O_lp − O_hp) / ulp(O_lp) in fp64; O_hp's binade where O_lp = 0; 0 where both are 0.

    Non-finite O_lp gives NaN (counted separately by the callers)."""
    o_lp, o_hp = o_lp.to(torch.float64), o_hp.to(torch.float64)
    unit = torch.where(o_lp != 0, ulp_bf16(o_lp), ulp_bf16(o_hp))
    err = (o_lp - o_hp) / unit
    both_zero = (o_lp == 0) & (o_hp == 0)
    err = torch.where(both_zero, torch.zeros_like(err), err)
    return torch.where(torch.isfinite(o_lp), err, torch.full_like(err, math.nan))


# ----------------------------------------------------------------------------------------------
# the construction
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VDist:
    """How V is drawn. ``spread`` is the standard deviation for normal/uniform/laplace.

    ``one-signed``: v = s·|mean + spread·z| with s the sign of ``mean`` (+ for 0): every value has
    the same sign, the situation the paper's Fig. 6a shows."""
    family: str = "normal"
    mean: float = 0.0
    spread: float = 0.5

    def __post_init__(self):
        if self.family not in V_FAMILIES:
            raise ValueError(f"V family must be one of {V_FAMILIES}, got {self.family!r}")
        if not self.spread >= 0:
            raise ValueError(f"V spread must be >= 0, got {self.spread}")

    def sample(self, shape, gen: torch.Generator) -> torch.Tensor:
        if self.family == "normal":
            z = torch.randn(shape, generator=gen, dtype=torch.float64)
        elif self.family == "uniform":        # variance of U(-√3, √3) is 1
            z = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * math.sqrt(3)
        elif self.family == "laplace":        # Laplace(0, 1/√2) has variance 1
            u = torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5
            z = -torch.sign(u) * torch.log1p(-2 * u.abs()) / math.sqrt(2)
        else:
            z = torch.randn(shape, generator=gen, dtype=torch.float64)
            sign = -1.0 if self.mean < 0 else 1.0
            return sign * (self.mean + self.spread * z).abs()
        return self.mean + self.spread * z


@dataclass(frozen=True)
class Case:
    """One experiment: ``batch`` sequences of ``n_keys`` keys, ``head_dim`` query rows each."""
    n_keys: int = 1024
    ties: int = 2
    gap: float = 15.6
    rest_spread: float = 1.0
    row_max: float = 2.0
    row_max_jitter: float = 1.0
    tie_jitter: float = 0.0          # > 0: tied keys after the first sit this far below rm
    placement: str = "split"         # 'split': one tied key per tile; 'same': all in one tile
    block_n: int = 64
    head_dim: int = 64
    batch: int = 16
    v_tied: VDist = field(default_factory=lambda: VDist("normal", -1.0, 0.3))
    v_rest: VDist = field(default_factory=lambda: VDist("normal", 0.0, 0.3))

    def check(self) -> None:
        if self.n_keys < 1 or self.head_dim < 1 or self.batch < 1 or self.block_n < 1:
            raise ValueError(f"n_keys, head_dim, batch and block_n must be >= 1 ({self})")
        if not 1 <= self.ties <= self.n_keys:
            raise ValueError(f"ties must be in 1..n_keys={self.n_keys}, got {self.ties}")
        if not (self.gap >= 0 and self.rest_spread >= 0 and self.tie_jitter >= 0):
            raise ValueError("gap, rest_spread and tie_jitter must be >= 0")
        if not all(math.isfinite(x) for x in (self.gap, self.rest_spread, self.row_max,
                                              self.row_max_jitter, self.tie_jitter)):
            raise ValueError("score parameters must be finite numbers")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        n_tiles = math.ceil(self.n_keys / self.block_n)
        if self.placement == "split" and self.ties > n_tiles:
            raise ValueError(f"cannot put {self.ties} tied keys in different tiles: only {n_tiles} "
                             f"tiles of {self.block_n} keys")
        if self.placement == "same" and self.ties > min(self.block_n, self.n_keys):
            raise ValueError(f"cannot put {self.ties} tied keys in one tile of {self.block_n} keys")


@dataclass
class Built:
    q: torch.Tensor          # (B, D, D) identity rows
    k: torch.Tensor          # (B, N, D) = scoresᵀ
    v: torch.Tensor          # (B, N, D)
    scores: torch.Tensor     # (B, D, N), exactly S
    tie_pos: torch.Tensor    # (B, ties) key positions of the tied maxima
    row_max: torch.Tensor    # (B, D)


def _tie_positions(case: Case, gen: torch.Generator) -> torch.Tensor:
    n, bn, k = case.n_keys, case.block_n, case.ties
    out = []
    for _ in range(case.batch):
        if case.placement == "any":
            pos = torch.randperm(n, generator=gen)[:k]
        elif case.placement == "same":
            n_tiles = math.ceil(n / bn)
            sizes = [min(bn, n - t * bn) for t in range(n_tiles)]
            fits = [t for t in range(n_tiles) if sizes[t] >= k]
            tile = fits[int(torch.randint(len(fits), (1,), generator=gen))]
            pos = tile * bn + torch.randperm(sizes[tile], generator=gen)[:k]
        else:
            n_tiles = math.ceil(n / bn)
            tiles = torch.randperm(n_tiles, generator=gen)[:k]
            sizes = torch.clamp(n - tiles * bn, max=bn)
            offs = (torch.rand(k, generator=gen, dtype=torch.float64) * sizes).long()
            pos = tiles * bn + offs
        out.append(torch.sort(pos).values)
    return torch.stack(out)


def build(case: Case, seed: int = 0, device="cpu") -> Built:
    """Make Q, K, V (fp32 tensors holding bf16 values) for ``case``; see the module docstring."""
    case.check()
    gen = torch.Generator().manual_seed(seed)
    b, n, d = case.batch, case.n_keys, case.head_dim
    tie_pos = _tie_positions(case, gen)
    jitter = (torch.rand((b, d), generator=gen, dtype=torch.float64) * 2 - 1) * case.row_max_jitter
    rm = to_bf16(case.row_max + jitter)
    rest = rm.unsqueeze(-1) - case.gap - case.rest_spread * torch.randn((b, d, n), generator=gen,
                                                                        dtype=torch.float64).abs()
    rest = to_bf16(rest)
    below = bf16_next_below(rm).unsqueeze(-1).expand_as(rest)
    scores = torch.where(rest < rm.unsqueeze(-1), rest, below)
    tied = to_bf16(rm.unsqueeze(-1) - case.tie_jitter).expand(b, d, case.ties).clone()
    tied[..., 0] = rm
    scores.scatter_(-1, tie_pos.unsqueeze(1).expand(b, d, case.ties), tied)
    v = case.v_rest.sample((b, n, d), gen)
    v_tied = case.v_tied.sample((b, case.ties, d), gen)
    v.scatter_(1, tie_pos.unsqueeze(-1).expand(b, case.ties, d), v_tied)
    v = to_bf16(v)
    q = torch.eye(d, dtype=torch.float64).expand(b, d, d)
    f32 = dict(dtype=torch.float32, device=device)
    return Built(q=q.to(**f32).contiguous(), k=scores.transpose(-1, -2).contiguous().to(**f32),
                 v=v.to(**f32),
                 scores=scores.to(**f32), tie_pos=tie_pos.to(device), row_max=rm.to(**f32))


# ----------------------------------------------------------------------------------------------
# running the implementations
# ----------------------------------------------------------------------------------------------
def reference(built: Built) -> torch.Tensor:
    """O_hp = softmax(S) V in fp64 from the same (bf16-valued) inputs."""
    s = built.scores.to(torch.float64)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ built.v.to(torch.float64)) / p.sum(-1, keepdim=True)


@dataclass
class Output:
    out: torch.Tensor                 # O as computed (fp32 holding bf16 values, or NaN/inf)
    row_offset: torch.Tensor | None   # final m of each row (emulator only)
    row_sum: torch.Tensor | None      # final ℓ of each row (emulator only)
    ties_seen: torch.Tensor | None    # did the rule see rs > 1 (emulator only)


def _sdpa(built: Built, backend_name: str) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]
    q, k, v = (t.to(torch.bfloat16).unsqueeze(1).contiguous() for t in (built.q, built.k, built.v))
    with sdpa_kernel([backend]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    return o.squeeze(1).float()


def _triton(built: Built, stable, beta, eps, block_n, explicit=None) -> torch.Tensor:
    from .attention import flash_attention     # the book's kernel; the GPU script guards it
    q, k, v = (t.to(torch.bfloat16).unsqueeze(1).contiguous() for t in (built.q, built.k, built.v))
    o = flash_attention(q, k, v, causal=False, scale=1.0, stable=stable, beta=beta, eps=eps,
                        numerics="fa2", block_m=min(64, q.shape[-2]), block_n=block_n or 64,
                        explicit=explicit)
    return o.squeeze(1).float()


def _fa2_mma(built: Built) -> torch.Tensor:
    """FA2 numerics, untiled, with P̄V done by the GPU's bf16 matrix unit into fp32."""
    s = built.scores
    p = torch.exp(s - s.amax(-1, keepdim=True))                      # fp32
    acc = torch.bmm(p.to(torch.bfloat16), built.v.to(torch.bfloat16), out_dtype=torch.float32)
    return to_bf16(acc / p.sum(-1, keepdim=True))


def run(impl: str, built: Built, *, stable="off", beta=2.0, eps=1e-3, offset=0.0,
        block_n=None) -> Output:
    """Compute O with implementation ``impl`` (see :data:`IMPLEMENTATIONS`).

    ``ideal`` is the exact O_hp rounded once to bf16: the best any bf16 output can do."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "ideal":
        return Output(to_bf16(reference(built)).float(), None, None, None)
    if impl == "fa2-fma":
        if stable != "off":
            raise ValueError("fa2-fma models the kernel without the offset rule: use stable='off'")
        return Output(fa2_fused_accumulation(built, block_n or 64), None, None, None)
    if impl in EMULATED:
        block = built.k.shape[-2] if impl.endswith("-untiled") else (block_n or 64)
        res = emulate.flash_forward(built.q, built.k, built.v, scale=1.0,
                                    numerics=impl.split("-")[0], block_n=block, stable=stable,
                                    beta=beta, eps=eps, offset=offset)
        return Output(res.out.float(), res.row_offset, res.row_sum, res.ties)
    if impl in ("triton", "triton-explicit"):   # native on a GPU, the interpreter on a CPU
        explicit = True if impl == "triton-explicit" else None
        return Output(_triton(built, stable, beta, eps, block_n, explicit), None, None, None)
    if not built.q.is_cuda:
        raise ValueError(f"{impl} needs a CUDA GPU; build the case with device='cuda'")
    if impl == "fa2-mma":
        return Output(_fa2_mma(built), None, None, None)
    return Output(_sdpa(built, impl), None, None, None)


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------
def mean_ci(values, z: float = 1.96) -> dict:
    """Mean, standard error and a normal-approximation 95% interval of 1-D ``values``."""
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    x = x[torch.isfinite(x)]
    n = x.numel()
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    mean = float(x.mean())
    se = float(x.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan
    return {"mean": mean, "se": se, "lo": mean - z * se, "hi": mean + z * se, "n": n}


def bias_summary(err: torch.Tensor) -> dict:
    """Bias of the errors ``err`` (..., rows, columns) in ulps.

    The mean is over all finite elements; its standard error is computed from the per-row means
    (elements of one row share P̄, so rows, not elements, are the independent units)."""
    err = err.to(torch.float64)
    finite = torch.isfinite(err)
    n_elem = int(finite.sum())
    if n_elem == 0:
        out = mean_ci([])
    else:
        rows = err.reshape(-1, err.shape[-1])
        fin = finite.reshape(-1, err.shape[-1])
        counts = fin.sum(-1)
        row_means = torch.where(fin, rows, torch.zeros_like(rows)).sum(-1) / counts.clamp(min=1)
        out = mean_ci(row_means[counts > 0])
        out["mean"] = float(err[finite].mean())
        out["lo"], out["hi"] = out["mean"] - 1.96 * out["se"], out["mean"] + 1.96 * out["se"]
    out["n_elements"] = n_elem
    out["nonfinite"] = int((~finite).sum())
    out["verdict"] = verdict(out)
    return out


def verdict(stats: dict) -> str:
    """Plain-language reading of a bias estimate."""
    mean, se = stats["mean"], stats["se"]
    if not math.isfinite(mean):
        return "no finite output to measure"
    if not math.isfinite(se) or se == 0:
        if mean == 0:
            return "no error at all"
        return f"biased: every sample has error {mean:+.3f} ulp"
    if abs(mean) <= 1.96 * se:
        return f"not distinguishable from zero ({mean:+.3f} ± {1.96 * se:.3f} ulp)"
    direction = "upward" if mean > 0 else "downward"
    if abs(mean) < NEGLIGIBLE_ULP:
        return f"detectable but negligible ({mean:+.3f} ulp, below {NEGLIGIBLE_ULP})"
    return f"biased {direction}: {mean:+.3f} ulp (95% CI {stats['lo']:+.3f} .. {stats['hi']:+.3f})"


def is_biased(stats: dict) -> bool:
    """True when the mean is outside its 95% interval around zero and at least NEGLIGIBLE_ULP."""
    m, se = stats["mean"], stats["se"]
    if not math.isfinite(m):
        return False
    if not math.isfinite(se) or se == 0:
        return abs(m) >= NEGLIGIBLE_ULP
    return abs(m) > 1.96 * se and abs(m) >= NEGLIGIBLE_ULP


def residual_in_ulps(built: Built, o_hp: torch.Tensor | None = None) -> float:
    """How far the non-tied tokens move O, in ulps of O: median |O_hp − mean of tied V| / ulp.

    Below ~0.5 the other tokens cannot change a correctly rounded O at all."""
    o_hp = reference(built) if o_hp is None else o_hp
    b, n, d = built.v.shape
    idx = built.tie_pos.unsqueeze(-1).expand(b, built.tie_pos.shape[1], d)
    tied_only = built.v.to(torch.float64).gather(1, idx).mean(1, keepdim=True)
    tied_only = tied_only.expand_as(o_hp)
    shift = (o_hp - tied_only).abs() / ulp_bf16(tied_only.to(torch.bfloat16).to(torch.float64))
    shift = shift[torch.isfinite(shift)]
    return float(shift.median()) if shift.numel() else math.nan


def measure(case: Case, impl: str, stable="off", *, beta=2.0, eps=1e-3, offset=0.0, seed=0,
            device="cpu", built: Built | None = None) -> dict:
    """Bias of one implementation on one case: the numbers a sweep cell holds."""
    built = build(case, seed, device) if built is None else built
    o_hp = reference(built)
    res = run(impl, built, stable=stable, beta=beta, eps=eps, offset=offset, block_n=case.block_n)
    stats = bias_summary(error_in_ulps(res.out, o_hp))
    stats["correctly_rounded"] = float((res.out.double() == to_bf16(o_hp)).double().mean())
    return stats


# ----------------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------------
SWEEP_TIES = (1, 2, 4, 8)
SWEEP_V = ((-1.0, 0.0), (-1.0, -1.0), (0.0, -1.0), (1.0, 0.0))     # (tied mean, rest mean)
SWEEP_GAPS = (10.0, 12.0, 13.0, 14.0, 15.0, 16.0)
SWEEP_IMPLS = ("ideal", "fa2/off", "fa2/tile", "fa2/cross", "paper/off", "paper/tile",
               "paper/cross", "paper-untiled/off", "paper-untiled/cross")


def parse_impl(label: str) -> tuple[str, str]:
    """'fa2/cross' -> ('fa2', 'cross'); 'sdpa-flash' -> ('sdpa-flash', 'off')."""
    impl, _, stable = label.partition("/")
    stable = stable or "off"
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r} in {label!r}; one of {IMPLEMENTATIONS}")
    if stable not in emulate.STABLE_MODES:
        raise ValueError(f"unknown stabilization {stable!r} in {label!r}")
    return impl, stable


def sweep_cases(ties=SWEEP_TIES, gaps=SWEEP_GAPS, v_means=SWEEP_V, base: Case | None = None):
    """The (case, key) grid of the sweep; the key is a dict of the swept values."""
    base = Case() if base is None else base
    for k in ties:
        for gap in gaps:
            for vt, vr in v_means:
                case = replace(base, ties=k, gap=gap, v_tied=replace(base.v_tied, mean=vt),
                               v_rest=replace(base.v_rest, mean=vr))
                yield case, {"ties": k, "gap": gap, "v_tied_mean": vt, "v_rest_mean": vr}


def sweep(ties=SWEEP_TIES, gaps=SWEEP_GAPS, v_means=SWEEP_V, impls=SWEEP_IMPLS,
          base: Case | None = None, beta=2.0, eps=1e-3, seed=0, device="cpu", pairs=(),
          progress=True):
    """Bias for every cell × implementation. Each cell's inputs come from ``seed + cell index``
    and are built on the CPU, so every device sees identical inputs. ``pairs`` lists (a, b)
    implementation labels compared element by element on the same inputs. Returns records:
    one per cell × implementation, plus one per cell × pair (``impl`` = 'a vs b')."""
    from tqdm.auto import tqdm
    cells = list(sweep_cases(ties, gaps, v_means, base))
    records = []
    for i, (case, key) in enumerate(tqdm(cells, desc="sweep", disable=not progress)):
        built = build(case, seed + i)
        checksum = float(built.v.double().sum() + built.scores.double().sum())
        if device != "cpu":
            built = Built(*(t.to(device) for t in (built.q, built.k, built.v, built.scores,
                                                   built.tie_pos, built.row_max)))
        o_hp = reference(built)
        common = {**key, "residual_ulps": residual_in_ulps(built, o_hp), "cell": i,
                  "input_checksum": checksum}
        outs = {}
        for label in impls:
            impl, stable = parse_impl(label)
            try:
                outs[label] = run(impl, built, stable=stable, beta=beta, eps=eps,
                                  block_n=case.block_n).out
            except Exception as exc:   # a GPU backend that refuses this shape: recorded, not fatal
                records.append({**common, "impl": label,
                                "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            stats = bias_summary(error_in_ulps(outs[label], o_hp))
            stats["correctly_rounded"] = float((outs[label].double() == to_bf16(o_hp))
                                               .double().mean())
            records.append({**common, "impl": label, **stats})
        for a, b in pairs:
            if a in outs and b in outs:
                diff = error_in_ulps(outs[a], o_hp) - error_in_ulps(outs[b], o_hp)
                stats = bias_summary(diff)
                stats["identical"] = float((outs[a] == outs[b]).double().mean())
                records.append({**common, "impl": f"{a} vs {b}", **stats})
    return records


def sweep_config(base: Case | None = None, **kw) -> dict:
    base = Case() if base is None else base
    cfg = asdict(base)
    cfg.update({k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()})
    return cfg


def save_cpu_sweep(beta=2.0, eps=1e-3, seed=0) -> str:
    """Recompute the chapter's sweep on the CPU and store it as results/lab_sweep_cpu.json."""
    from . import results
    records = sweep(beta=beta, eps=eps, seed=seed)
    config = sweep_config(ties=SWEEP_TIES, gaps=SWEEP_GAPS, v_means=SWEEP_V, impls=SWEEP_IMPLS,
                          beta=beta, eps=eps, seed=seed)
    return results.save("lab_sweep_cpu", {"config": config, "records": records},
                        "python -m kernels.lab")


def sweep_table(records):
    """Records as a pandas DataFrame (one row per cell × implementation)."""
    import pandas as pd
    return pd.DataFrame(records)


# ----------------------------------------------------------------------------------------------
# β, ε and the offset rule
# ----------------------------------------------------------------------------------------------
def largest_rm_rounding_to_one(beta: float) -> float:
    """With m = β·rm the tied entries get P̄ = exp(−(β−1)·rm); in bf16 that is exactly 1.0 when
    (β−1)·rm ≤ −ln(1 − 2⁻⁹) ≈ 0.00196. Returns the largest such rm (fp32 exponent, bf16 P̄)."""
    if not beta > 1:
        raise ValueError(f"beta must be > 1, got {beta}")
    return EXP_ROUNDS_TO_ONE / (beta - 1.0)


def p_bar_of_tied(rm: torch.Tensor, beta: float, numerics: str = "fa2") -> torch.Tensor:
    """P̄ of a tied maximum after the offset rule, as bf16 would see it (brute-force check)."""
    rm = rm.to(torch.float32)
    if numerics == "paper":
        m = torch.where(rm > 0, to_bf16(beta * rm), torch.where(rm < 0, torch.zeros_like(rm), rm))
        return to_bf16(torch.exp(to_bf16(rm - m)))
    m = torch.where(rm > 0, beta * rm, torch.where(rm < 0, torch.zeros_like(rm), rm))
    return to_bf16(torch.exp(rm - m))


# ----------------------------------------------------------------------------------------------
# the lab: one function the sliders call
# ----------------------------------------------------------------------------------------------
def running_error(scores_row, v_col, offset, numerics):
    """Error of the running sum Σ_{t'≤t} P̄[t'] V[t'] along the keys, in fp64 (paper Eq. 5).

    paper: P̄ = bf16(exp(bf16(S − m))); lp(t) = bf16(Σ in fp32), hp(t) = Σ in fp64 of the same P̄V.
    fa2:   lp(t) = the fp32 accumulator Σ bf16(P̄)V (P̄ = exp(S − m) in fp32), hp(t) = Σ in fp64 of
           the exact P·V. The FA2 output is rounded only once, after dividing by ℓ.
    ``m`` is the row's final offset (a tiled kernel changes m between tiles; the rescaling by
    α = exp(m_old − m_new) is an fp32 multiplication and does not change the picture)."""
    s = np.asarray(scores_row, dtype=np.float64)
    v = np.asarray(v_col, dtype=np.float64)
    if numerics == "paper":
        arg = torch.from_numpy(s - offset).float()
        p_lp = to_bf16(torch.exp(to_bf16(arg))).double().numpy()
        terms32 = (p_lp * v).astype(np.float32)               # bf16 × bf16 is exact in fp32
        lp32 = np.add.accumulate(terms32, dtype=np.float32)   # sequential fp32 sum
        lp = to_bf16(torch.from_numpy(lp32)).double().numpy()
        hp = np.cumsum(p_lp * v)
        p_used = p_lp
    else:
        p32 = torch.exp(torch.from_numpy(s - offset).float())
        p_lp = to_bf16(p32).double().numpy()
        lp = np.add.accumulate((p_lp * v).astype(np.float32), dtype=np.float32).astype(np.float64)
        hp = np.cumsum(np.exp(s - offset) * v)
        p_used = p_lp
    return {"error": lp - hp, "p_is_one": np.flatnonzero(p_used == 1.0), "lp": lp, "hp": hp}


@dataclass
class LabResult:
    params: dict
    stats: dict
    errors: np.ndarray               # finite errors in ulps (flattened)
    counts: dict
    messages: list
    residual_ulps: float
    running: dict | None
    delta_diff: np.ndarray | None    # per row (token) δ_lp − δ_hp
    delta_sum: float


def lab(impl="fa2", stable="off", ties=2, gap=15.6, n_keys=1024, block_n=64, placement="split",
        v_tied_family="normal", v_tied_mean=-1.0, v_tied_spread=0.3, v_rest_family="normal",
        v_rest_mean=0.0, v_rest_spread=0.3, beta=2.0, eps=1e-3, offset=0.0, row_max=2.0,
        row_max_jitter=1.0, rest_spread=1.0, tie_jitter=0.0, do_mean=-0.5, batch=16,
        head_dim=64, seed=0, device="cpu") -> LabResult:
    """Everything the chapter's sliders show, for one setting. Never raises for slider values:
    what goes wrong (impossible placement, β ≤ 1, NaN, underflow, overflow) becomes a message."""
    params = {k: v for k, v in locals().items()}
    messages = []
    empty = LabResult(params, bias_summary(torch.full((1, 1), math.nan)), np.array([]), {},
                      messages, math.nan, None, None, math.nan)
    try:
        case = Case(n_keys=int(n_keys), ties=int(ties), gap=float(gap), rest_spread=rest_spread,
                    row_max=row_max, row_max_jitter=row_max_jitter, tie_jitter=tie_jitter,
                    placement=placement, block_n=int(block_n), head_dim=int(head_dim),
                    batch=int(batch), v_tied=VDist(v_tied_family, v_tied_mean, v_tied_spread),
                    v_rest=VDist(v_rest_family, v_rest_mean, v_rest_spread))
        try:
            case.check()
        except ValueError as exc:
            if placement == "any" or not 1 <= int(ties) <= int(n_keys):
                raise
            messages.append(f"{exc}; the tied keys were placed at random positions instead.")
            case = replace(case, placement="any")
        built = build(case, seed, device)
    except (ValueError, TypeError) as exc:
        messages.append(f"cannot build this case: {exc}")
        return empty
    with np.errstate(all="ignore"):
        try:
            res = run(impl, built, stable=stable, beta=beta, eps=eps, offset=offset,
                      block_n=case.block_n)
        except (ValueError, TypeError, RuntimeError, ImportError) as exc:
            messages.append(f"{impl}/{stable} did not run: {exc}")
            return empty
        o_hp = reference(built)
        err = error_in_ulps(res.out, o_hp)
        stats = bias_summary(err)
        counts, more = _counts(built, res, o_hp, case, impl, stable, beta, eps)
        messages += more
        running = _running_for_row(built, res, impl, o_hp) if impl in EMULATED else None
        d_o = torch.randn(o_hp.shape, generator=torch.Generator().manual_seed(seed + 1),
                          dtype=torch.float64).to(o_hp.device) + do_mean
        delta_lp = (d_o.float() * res.out.float()).sum(-1).double()
        delta_hp = (d_o * o_hp).sum(-1)
        delta_diff = (delta_lp - delta_hp).flatten().cpu().numpy()
    finite = err[torch.isfinite(err)].cpu().numpy()
    return LabResult(params, stats, finite, counts, messages, residual_in_ulps(built, o_hp),
                     running, delta_diff, float(np.nansum(delta_diff)))


def _counts(built, res, o_hp, case, impl, stable, beta, eps):
    s = built.scores
    rm = s.amax(-1, keepdim=True)
    exact_ties = (s == rm).sum(-1)
    near = (s >= rm - eps).sum(-1)
    window = (s >= rm - EXP_ROUNDS_TO_ONE).sum(-1)
    out = res.out
    counts = {
        "rows": int(exact_ties.numel()),
        "rows with repeated maxima (exact)": int((exact_ties > 1).sum()),
        "rows with > 1 score within eps of the max": int((near > 1).sum()),
        "rows with > 1 score within 2^-9 of the max (P̄ rounds to 1)": int((window > 1).sum()),
        "NaN outputs": int(torch.isnan(out).sum()),
        "inf outputs": int(torch.isinf(out).sum()),
    }
    messages = []
    if res.row_offset is not None:
        m = res.row_offset.unsqueeze(-1)
        if impl.startswith("paper"):
            p_bar = to_bf16(torch.exp(to_bf16(s - m)))
        else:
            p_bar = to_bf16(torch.exp(s - m))
        counts["entries with P̄ = 1 (final offset m)"] = int((p_bar == 1.0).sum())
        counts["rows where the rule saw a tie"] = int(res.ties_seen.sum())
        ell = res.row_sum
        counts["rows with ℓ = 0 (underflow)"] = int((ell == 0).sum())
        if (ell == 0).any():
            messages.append(f"ℓ underflowed to 0 in {int((ell == 0).sum())} rows: "
                            "exp(S − m) is 0 for every key, so O = Ō/ℓ = 0/0 (NaN). "
                            "β·rm is too large (Appendix C).")
        tiny = (ell > 0) & (ell < 2.0 ** -126)
        if tiny.any():
            messages.append(f"ℓ is subnormal in {int(tiny.sum())} rows: P̄ is flushed to 0 in "
                            "bf16, so O comes out 0 (or NaN) — silent underflow.")
        several_ones = (p_bar == 1.0).sum(-1) > 1
        counts["rows with ≥ 2 entries P̄ = 1"] = int(several_ones.sum())
        if stable in ("tile", "cross", "always") and several_ones.any():
            why = []
            if stable == "tile":
                why.append("ties split across tiles are invisible to the per-tile rule")
            if eps < EXP_ROUNDS_TO_ONE:
                why.append(f"ε = {eps:g} < 2^-9 ≈ 0.00196 misses near-ties whose P̄ rounds to 1")
            why.append(f"(β−1)·rm ≤ {EXP_ROUNDS_TO_ONE:.5f} makes exp(−(β−1)·rm) round back to 1")
            why.append("a tied maximum of exactly 0 fires neither branch")
            messages.append(f"{int(several_ones.sum())} rows still hold ≥ 2 entries with P̄ = 1 "
                            f"after the offset rule; possible reasons: {'; '.join(why)}.")
        zero_rm = (exact_ties > 1) & (s.amax(-1) == 0)
        if stable in ("tile", "cross", "always") and zero_rm.any():
            messages.append(f"{int(zero_rm.sum())} rows have a tied maximum of exactly 0: "
                            "the rule has no branch for rm = 0, so m = rm and P̄ = 1 stays.")
    if counts["NaN outputs"]:
        messages.append(f"{counts['NaN outputs']} outputs are NaN.")
    if counts["inf outputs"]:
        messages.append(f"{counts['inf outputs']} outputs are ±inf (bf16 overflow: |V| too large "
                        "for the accumulator or the output).")
    if not torch.isfinite(built.v).all():
        messages.append("some V values overflow bf16 (|V| > 3.39e38) and are ±inf already.")
    if not torch.isfinite(o_hp).all():
        messages.append("the fp64 reference itself is not finite for some rows (inf V).")
    if stable in ("tile", "cross", "always") and not (beta > 1):
        messages.append(f"β = {beta} must be > 1.")
    return counts, messages


def _running_for_row(built, res, impl, o_hp):
    """Fig. 6c: the running error of Ō for the first row and the column with the largest error."""
    s_row = built.scores[0, 0].cpu()
    m = float(res.row_offset[0, 0]) if res.row_offset is not None else float(s_row.max())
    if not math.isfinite(m):
        return None
    errs = (res.out[0, 0].double().cpu() - o_hp[0, 0].cpu()).abs()
    errs = torch.nan_to_num(errs, nan=-1.0)
    col = int(errs.argmax())
    r = running_error(s_row.numpy(), built.v[0, :, col].cpu().numpy(), m, impl.split("-")[0])
    final = r["hp"][-1]
    unit = float(ulp_bf16(torch.tensor(final))) if final != 0 else 1.0
    o_lp, o_exact = float(res.out[0, 0, col]), float(o_hp[0, 0, col])
    ell = float(np.exp(s_row.double().numpy() - m).sum())       # exact ℓ for this offset
    r.update(column=col, unit=unit, offset=m, final_output_error=(o_lp - o_exact) * ell)
    return r


def lab_text(result: LabResult) -> str:
    """The printed part of the lab: verdict, numbers and messages."""
    p, st = result.params, result.stats
    lines = [f"{p['impl']} / stable={p['stable']}: k={p['ties']} tied maxima, gap={p['gap']}, "
             f"N={p['n_keys']}, tile={p['block_n']} ({p['placement']})",
             f"  non-max tokens move O by {result.residual_ulps:.3g} ulp on average",
             f"  mean error {st['mean']:+.4f} ulp, 95% CI [{st['lo']:+.4f}, {st['hi']:+.4f}] "
             f"over {st['n_elements']} outputs -> {st['verdict']}",
             f"  Σ_T (δ_lp − δ_hp) = {result.delta_sum:+.4g} over {0 if result.delta_diff is None else result.delta_diff.size} rows"]
    lines += [f"  {k}: {v}" for k, v in result.counts.items()]
    lines += [f"  ! {m}" for m in result.messages]
    return "\n".join(lines)


def plot_lab(result: LabResult, fig=None):
    """Three panels: error histogram, running error of Ō (Fig. 6c), cumulative Σ(δ_lp − δ_hp)."""
    import matplotlib.pyplot as plt
    if fig is None:
        fig = plt.figure(figsize=(12, 3.4))
    axes = fig.subplots(1, 3)
    st = result.stats
    ax = axes[0]
    if result.errors.size:
        lo, hi = np.percentile(result.errors, [0.5, 99.5])
        lo, hi = min(lo, -0.6), max(hi, 0.6)
        ax.hist(np.clip(result.errors, lo, hi), bins=np.linspace(lo, hi, 49), color="C0")
        ax.axvline(st["mean"], color="C3", label=f"mean {st['mean']:+.3f}")
        ax.axvspan(st["lo"], st["hi"], color="C3", alpha=0.25, label="95% CI")
        ax.legend(fontsize=8)
    ax.set_xlabel("O_lp − O_hp  [ulp of O_lp's binade]")
    ax.set_ylabel("outputs")
    ax.set_title(st["verdict"].split(" (")[0], fontsize=9)
    ax = axes[1]
    r = result.running
    if r is not None:
        e = r["error"] / r["unit"]
        ax.plot(np.arange(e.size), e, lw=0.8)
        ones = r["p_is_one"]
        ax.plot(ones, e[ones], "rv", ms=6, label="P̄ = 1")
        if r.get("final_output_error") is not None:
            ax.plot([e.size - 1], [r["final_output_error"] / r["unit"]], "k*", ms=9,
                    label="(O_lp − O_hp)·ℓ: after the last rounding")
        ax.legend(fontsize=7)
        ax.set_title(f"running error of Ō, row 0, column {r['column']}", fontsize=9)
    else:
        ax.text(0.5, 0.5, "running sum shown for\nemulated paths only", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel("key position t")
    ax.set_ylabel("Ō_lp(t) − Ō_hp(t)  [ulp of final Ō]")
    ax = axes[2]
    if result.delta_diff is not None and result.delta_diff.size:
        ax.plot(np.nancumsum(result.delta_diff), color="C2")
    ax.set_xlabel("row (token) T")
    ax.set_ylabel("cumulative Σ (δ_lp − δ_hp)")
    ax.set_title(f"Σ_T (δ_lp − δ_hp) = {result.delta_sum:+.3g}", fontsize=9)
    fig.tight_layout()
    return fig


def show(**params):
    """Run :func:`lab`, print :func:`lab_text` and draw :func:`plot_lab` (the widget's body)."""
    import matplotlib.pyplot as plt
    result = lab(**params)
    print(lab_text(result))
    plot_lab(result)
    plt.show()
    return result


def widget(device="cpu"):
    """The interactive lab (ipywidgets). Returns the widget box to display."""
    import ipywidgets as w
    impls = ["fa2", "paper", "paper-untiled", "ideal"] + (list(GPU_ONLY[:3]) if device != "cpu"
                                                          else [])
    fam = list(V_FAMILIES)
    style = {"description_width": "110px"}

    def fs(desc, val, lo, hi, step):
        return w.FloatSlider(value=val, min=lo, max=hi, step=step, description=desc, style=style,
                             continuous_update=False)

    c = {
        "impl": w.Dropdown(options=impls, value="fa2", description="implementation", style=style),
        "stable": w.Dropdown(options=list(emulate.STABLE_MODES), value="off",
                             description="stabilization", style=style),
        "ties": w.IntSlider(value=2, min=1, max=64, description="tied maxima k", style=style,
                            continuous_update=False),
        "gap": fs("gap below max", 15.6, 0.0, 40.0, 0.1),
        "n_keys": w.Dropdown(options=[64, 128, 256, 512, 1024, 2048, 4096], value=1024,
                             description="sequence N", style=style),
        "block_n": w.Dropdown(options=[16, 32, 64, 128, 256], value=64, description="tile",
                              style=style),
        "placement": w.Dropdown(options=list(PLACEMENTS), value="split",
                                description="tied keys", style=style),
        "v_tied_family": w.Dropdown(options=fam, value="normal", description="V tied: family",
                                    style=style),
        "v_tied_mean": fs("V tied: mean", -1.0, -4.0, 4.0, 0.05),
        "v_tied_spread": fs("V tied: spread", 0.3, 0.0, 2.0, 0.05),
        "v_rest_family": w.Dropdown(options=fam, value="normal", description="V rest: family",
                                    style=style),
        "v_rest_mean": fs("V rest: mean", 0.0, -4.0, 4.0, 0.05),
        "v_rest_spread": fs("V rest: spread", 0.3, 0.0, 2.0, 0.05),
        "beta": w.FloatText(value=2.0, description="β", style=style),
        "eps": w.FloatText(value=1e-3, description="ε", style=style),
        "offset": w.FloatText(value=-0.5, description="fixed offset", style=style),
        "row_max": w.FloatText(value=2.0, description="row max rm", style=style),
        "do_mean": fs("dO mean", -0.5, -3.0, 3.0, 0.1),
    }
    out = w.interactive_output(lambda **kw: show(device=device, batch=8, **kw), c)
    left = w.VBox([c[k] for k in ("impl", "stable", "ties", "gap", "n_keys", "block_n",
                                  "placement", "beta", "eps")])
    right = w.VBox([c[k] for k in ("v_tied_family", "v_tied_mean", "v_tied_spread",
                                   "v_rest_family", "v_rest_mean", "v_rest_spread", "offset",
                                   "row_max", "do_mean")])
    return w.VBox([w.HBox([left, right]), out])


if __name__ == "__main__":
    print(save_cpu_sweep())


# ----------------------------------------------------------------------------------------------
# reading and plotting the sweep
# ----------------------------------------------------------------------------------------------
FA2_FAMILY = ("ideal", "fa2/off", "fa2/tile", "fa2/cross")
PAPER_FAMILY = ("paper/off", "paper/tile", "paper/cross", "paper-untiled/off", "paper-untiled/cross")


def _v_label(vt, vr):
    return f"V tied {vt:+g}, rest {vr:+g}"


def plot_sweep(records, impls=FA2_FAMILY, limit=0.5, title=None):
    """One heat map (ties × gap) of the mean error per implementation (rows) and V setting
    (columns); numbers in ulps, a dot marks cells that are biased (see :func:`is_biased`)."""
    import matplotlib.pyplot as plt
    df = sweep_table([r for r in records if "mean" in r and " vs " not in r["impl"]])
    vs = sorted({(r.v_tied_mean, r.v_rest_mean) for r in df.itertuples()},
                key=lambda t: SWEEP_V.index(t) if t in SWEEP_V else 99)
    ties, gaps = sorted(df.ties.unique()), sorted(df.gap.unique())
    fig, axes = plt.subplots(len(impls), len(vs), figsize=(2.9 * len(vs), 1.9 * len(impls)),
                             squeeze=False, sharex=True, sharey=True)
    for i, impl in enumerate(impls):
        for j, (vt, vr) in enumerate(vs):
            ax = axes[i][j]
            sub = df[(df.impl == impl) & (df.v_tied_mean == vt) & (df.v_rest_mean == vr)]
            grid = np.full((len(ties), len(gaps)), np.nan)
            for r in sub.itertuples():
                grid[ties.index(r.ties), gaps.index(r.gap)] = r.mean
                txt = f"{r.mean:+.2f}" if abs(r.mean) < 10 else f"{r.mean:+.0f}"
                mark = "•" if is_biased({"mean": r.mean, "se": r.se}) else ""
                ax.text(gaps.index(r.gap), ties.index(r.ties), txt + mark, ha="center",
                        va="center", fontsize=6.5)
            ax.imshow(grid, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
            ax.set_xticks(range(len(gaps)), [f"{g:g}" for g in gaps], fontsize=7)
            ax.set_yticks(range(len(ties)), [str(k) for k in ties], fontsize=7)
            ax.grid(False)
            if i == 0:
                ax.set_title(_v_label(vt, vr), fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{impl}\nties k", fontsize=8)
            if i == len(impls) - 1:
                ax.set_xlabel("gap below the max", fontsize=8)
    fig.suptitle(title or "mean O_lp − O_hp [ulp]; • = biased (95% CI excludes 0, |mean| ≥ 0.02)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def _cells(records, impl):
    return {r["cell"]: r for r in records if r["impl"] == impl and "mean" in r}


def sweep_findings(records) -> dict:
    """The verdicts the chapter states, computed from sweep records."""
    def biased(r):
        return is_biased(r)

    out = {}
    fa2, cross, tile, ideal = (_cells(records, x) for x in ("fa2/off", "fa2/cross", "fa2/tile",
                                                            "ideal"))
    paper, paper_x = _cells(records, "paper-untiled/off"), _cells(records, "paper-untiled/cross")
    paper_t, paper_tx = _cells(records, "paper/off"), _cells(records, "paper/cross")
    out["cells"] = len(fa2)
    diffs = sorted(abs(fa2[c]["mean"] - ideal[c]["mean"]) for c in fa2)
    out["fa2 - ideal: median |difference|"] = diffs[len(diffs) // 2]
    out["fa2 - ideal: max |difference|"] = diffs[-1]
    out["fa2 - ideal: cell of max"] = max(fa2, key=lambda c: abs(fa2[c]["mean"] - ideal[c]["mean"]))
    out["fa2 median fraction correctly rounded"] = float(np.median(
        [r["correctly_rounded"] for r in fa2.values()]))
    out["fa2 biased cells"] = sorted(c for c, r in fa2.items() if biased(r))
    out["fa2 biased, k = 1"] = [c for c in out["fa2 biased cells"] if fa2[c]["ties"] == 1]
    out["fa2 biased, k >= 2"] = [c for c in out["fa2 biased cells"] if fa2[c]["ties"] > 1]
    out["fa2 biased k >= 2, |bias| >= 0.1"] = [c for c in out["fa2 biased, k >= 2"]
                                             if abs(fa2[c]["mean"]) >= 0.1]
    out["fa2 biased, gap <= 12"] = [c for c in out["fa2 biased cells"] if fa2[c]["gap"] <= 12]
    out["fa2 k=1 largest |bias|"] = max((c for c in fa2 if fa2[c]["ties"] == 1),
                                        key=lambda c: abs(fa2[c]["mean"]))
    out["fa2 biased k >= 2, cross removes"] = [c for c in out["fa2 biased, k >= 2"]
                                               if not biased(cross[c])]
    out["fa2 biased k >= 2, cross leaves"] = [c for c in out["fa2 biased, k >= 2"]
                                              if biased(cross[c])]
    out["fa2 biased k = 1, cross leaves"] = [c for c in out["fa2 biased, k = 1"]
                                             if biased(cross[c])]
    out["fa2 unbiased, cross adds bias"] = sorted(c for c, r in fa2.items()
                                                  if not biased(r) and biased(cross[c]))
    out["fa2 biased, tile removes"] = sorted(c for c in out["fa2 biased cells"]
                                             if not biased(tile[c]))
    out["paper (untiled) biased cells"] = sorted(c for c, r in paper.items() if biased(r))
    out["paper biased where fa2 is not"] = sorted(c for c, r in paper.items()
                                                  if biased(r) and not biased(fa2[c]))
    out["paper (untiled) biased, cross leaves"] = sorted(c for c in out["paper (untiled) biased cells"]
                                                         if biased(paper_x[c]))
    out["paper (tiled) biased cells"] = sorted(c for c, r in paper_t.items() if biased(r))
    out["paper (tiled) biased, cross leaves"] = sorted(c for c in out["paper (tiled) biased cells"]
                                                       if biased(paper_tx[c]))
    return out


def describe_cells(records, cells, impl="fa2/off") -> str:
    """'k=2 gap=16 V(-1,+0): +0.198 ±0.002; ...' for the given cell indices."""
    by = _cells(records, impl)
    parts = [f"k={by[c]['ties']} gap={by[c]['gap']:g} V({by[c]['v_tied_mean']:+g},"
             f"{by[c]['v_rest_mean']:+g}): {by[c]['mean']:+.3f}±{by[c]['se']:.3f}"
             for c in cells if c in by]
    return "; ".join(parts) if parts else "none"


def compare_devices(cpu_records, gpu_records, pairs=(("fa2/off", "sdpa-flash"),
                                                      ("fa2/off", "sdpa-cudnn"),
                                                      ("fa2/off", "sdpa-efficient"),
                                                      ("fa2/off", "fa2/off"),
                                                      ("paper/off", "paper/off"),
                                                      ("fa2/cross", "triton/cross"))):
    """z = (GPU mean − CPU mean) / √(se_gpu² + se_cpu²) per cell, for (cpu impl, gpu impl) pairs.
    Returns {pair label: {'max_abs_z', 'z' (list), 'same_inputs'}}; pairs the GPU lacks are skipped."""
    out = {}
    for cpu_impl, gpu_impl in pairs:
        c, g = _cells(cpu_records, cpu_impl), _cells(gpu_records, gpu_impl)
        common = sorted(set(c) & set(g))
        if not common:
            continue
        z = []
        for i in common:
            se = math.hypot(c[i]["se"], g[i]["se"])
            d = g[i]["mean"] - c[i]["mean"]
            z.append(0.0 if d == 0 else (d / se if se > 0 else math.inf))
        same = all(c[i].get("input_checksum") == g[i].get("input_checksum") for i in common)
        out[f"GPU {gpu_impl} vs CPU {cpu_impl}"] = {
            "max_abs_z": max(abs(x) for x in z), "z": z, "cells": common, "same_inputs": same,
            "max_abs_diff": max(abs(g[i]["mean"] - c[i]["mean"]) for i in common)}
    return out


def plot_devices(cpu_records, gpu_records, gpu_impls=("sdpa-flash", "sdpa-cudnn",
                                                      "sdpa-efficient", "triton/off", "fa2/off"),
                 cpu_impl="fa2/off"):
    """Bias per cell measured on the GPU (y) against the CPU emulator (x)."""
    import matplotlib.pyplot as plt
    c = _cells(cpu_records, cpu_impl)
    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    lim = 0.0
    for n, impl in enumerate(gpu_impls):
        g = _cells(gpu_records, impl)
        common = sorted(set(c) & set(g))
        if not common:
            continue
        x = np.array([c[i]["mean"] for i in common])
        y = np.array([g[i]["mean"] for i in common])
        ax.errorbar(x, y, yerr=1.96 * np.array([g[i]["se"] for i in common]), fmt="o",
                    ms=4 - n * 0.6, alpha=0.7, label=f"GPU {impl}")
        lim = max(lim, np.abs(np.concatenate([x, y])).max())
    ax.plot([-lim, lim], [-lim, lim], "k:", lw=0.8)
    ax.set_xlabel(f"CPU emulator {cpu_impl}: mean error [ulp]")
    ax.set_ylabel("GPU: mean error [ulp]")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------
# Appendix C and boundary cases (small, run live in the chapter)
# ----------------------------------------------------------------------------------------------
def small_lab_case(**kw) -> Case:
    """A CPU-friendly case for live cells: N = 512, 8 sequences of 32 rows."""
    return replace(Case(n_keys=512, head_dim=32, batch=8), **kw)


def fixed_offset_bias(offsets, case: Case | None = None, numerics=("fa2", "paper"), seed=0):
    """Bias with m = running max + offset (Appendix C's fixed offset) for each offset."""
    case = small_lab_case(ties=2) if case is None else case
    built = build(case, seed)
    return {num: [measure(case, num, "offset", offset=o, built=built) for o in offsets]
            for num in numerics}


def underflow_scan(row_maxes, beta=2.0, stable="always", ties=1, impl="fa2", seed=0):
    """For tied (or single, with 'always') maxima of value rm: fraction of rows whose ℓ
    underflows to 0, of NaN outputs and of outputs that are exactly 0 though O_hp is not."""
    rows = []
    for rm in row_maxes:
        case = small_lab_case(ties=ties, row_max=float(rm), row_max_jitter=0.0, batch=2)
        built = build(case, seed)
        res = run(impl, built, stable=stable, beta=beta, block_n=case.block_n)
        o_hp = reference(built)
        rows.append({"rm": float(rm), "ell_zero": float((res.row_sum == 0).double().mean()),
                     "ell_subnormal": float(((res.row_sum > 0) & (res.row_sum < 2.0 ** -126))
                                            .double().mean()),
                     "nan": float(torch.isnan(res.out).double().mean()),
                     "zero_out": float(((res.out == 0) & (o_hp != 0)).double().mean())})
    return rows


def compare_settings(settings: dict, impls, seed=0, **run_kw) -> dict:
    """{setting name: {impl label: bias summary}} for Cases given by name (small, live)."""
    out = {}
    for name, case in settings.items():
        built = build(case, seed)
        out[name] = {}
        for label in impls:
            impl, stable = parse_impl(label)
            out[name][label] = measure(case, impl, stable, built=built, **run_kw)
    return out


def plot_compare(table: dict, title="", ylabel="mean O_lp − O_hp [ulp]"):
    """Grouped bars with 95% intervals for :func:`compare_settings` output."""
    import matplotlib.pyplot as plt
    names = list(table)
    impls = list(next(iter(table.values())))
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    width = 0.8 / len(impls)
    for j, impl in enumerate(impls):
        means = [table[n][impl]["mean"] for n in names]
        ci = [1.96 * table[n][impl]["se"] for n in names]
        ax.bar(np.arange(len(names)) + j * width, means, width, yerr=ci, label=impl, capsize=2)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def print_compare(table: dict) -> None:
    for name, row in table.items():
        cells = ", ".join(f"{impl} {st['mean']:+.3f}±{1.96 * st['se']:.3f}"
                          f"{' (biased)' if is_biased(st) else ''}" for impl, st in row.items())
        print(f"{name}: {cells}")


def fa2_fused_accumulation(built: Built, block_n: int = 64) -> torch.Tensor:
    """FA2 numerics (stable='off') with P̄V accumulated *into* the running fp32 accumulator one
    product at a time, as ``acc = tl.dot(p, v, acc)`` does on a GPU (an FMA chain per output):
    a CPU model of the hardware kernels, not of :mod:`kernels.emulate`, which adds each tile's
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
        s_j = s[..., start:start + block_n]
        m_new = torch.maximum(m, s_j.amax(-1))
        p = torch.exp(s_j - m_new.unsqueeze(-1))
        alpha = torch.exp(m - m_new)
        ell = alpha * ell + p.sum(-1)
        acc = alpha.unsqueeze(-1) * acc
        p_low = to_bf16(p)
        for t in range(s_j.shape[-1]):             # one fused multiply-add per key, in order
            acc = acc + p_low[..., t:t + 1] * v[:, None, start + t, :]
        m = m_new
    return to_bf16(acc / ell.unsqueeze(-1))
