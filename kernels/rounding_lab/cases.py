"""The lab's rows: attention rows with tied maxima, built so every score is exact.

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
from dataclasses import dataclass, field, replace

import torch

from ..numerics.rounding import next_below, round_to_dtype, ulp_in_dtype

V_FAMILIES = ("normal", "uniform", "laplace", "one-signed")
PLACEMENTS = ("split", "same", "any")


# exp(-x) rounds to 1.0 in bf16 when x <= -ln(1 - 2^-9): the largest bf16 below 1 is 1 - 2^-8 and
# the halfway point 1 - 2^-9 rounds (ties to even) up to 1.0.
EXP_ROUNDS_TO_ONE = -math.log1p(-(2.0**-9))


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
        elif self.family == "uniform":  # variance of U(-√3, √3) is 1
            z = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * math.sqrt(3)
        elif self.family == "laplace":  # Laplace(0, 1/√2) has variance 1
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
    tie_jitter: float = 0.0  # > 0: tied keys after the first sit this far below rm
    placement: str = "split"  # 'split': one tied key per tile; 'same': all in one tile
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
        if not all(
            math.isfinite(x)
            for x in (
                self.gap,
                self.rest_spread,
                self.row_max,
                self.row_max_jitter,
                self.tie_jitter,
            )
        ):
            raise ValueError("score parameters must be finite numbers")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        n_tiles = math.ceil(self.n_keys / self.block_n)
        if self.placement == "split" and self.ties > n_tiles:
            raise ValueError(
                f"cannot put {self.ties} tied keys in different tiles: only {n_tiles} "
                f"tiles of {self.block_n} keys"
            )
        if self.placement == "same" and self.ties > min(self.block_n, self.n_keys):
            raise ValueError(f"cannot put {self.ties} tied keys in one tile of {self.block_n} keys")


@dataclass
class Built:
    q: torch.Tensor  # (B, D, D) identity rows
    k: torch.Tensor  # (B, N, D) = scoresᵀ
    v: torch.Tensor  # (B, N, D)
    scores: torch.Tensor  # (B, D, N), exactly S
    tie_pos: torch.Tensor  # (B, ties) key positions of the tied maxima
    row_max: torch.Tensor  # (B, D)


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
    rm = round_to_dtype(case.row_max + jitter, torch.bfloat16)
    rest = (
        rm.unsqueeze(-1)
        - case.gap
        - case.rest_spread * torch.randn((b, d, n), generator=gen, dtype=torch.float64).abs()
    )
    rest = round_to_dtype(rest, torch.bfloat16)
    below = next_below(rm).unsqueeze(-1).expand_as(rest)
    scores = torch.where(rest < rm.unsqueeze(-1), rest, below)
    tied = (
        round_to_dtype(rm.unsqueeze(-1) - case.tie_jitter, torch.bfloat16)
        .expand(b, d, case.ties)
        .clone()
    )
    tied[..., 0] = rm
    scores.scatter_(-1, tie_pos.unsqueeze(1).expand(b, d, case.ties), tied)
    v = case.v_rest.sample((b, n, d), gen)
    v_tied = case.v_tied.sample((b, case.ties, d), gen)
    v.scatter_(1, tie_pos.unsqueeze(-1).expand(b, case.ties, d), v_tied)
    v = round_to_dtype(v, torch.bfloat16)
    q = torch.eye(d, dtype=torch.float64).expand(b, d, d)
    f32 = dict(dtype=torch.float32, device=device)
    return Built(
        q=q.to(**f32).contiguous(),
        k=scores.transpose(-1, -2).contiguous().to(**f32),
        v=v.to(**f32),
        scores=scores.to(**f32),
        tie_pos=tie_pos.to(device),
        row_max=rm.to(**f32),
    )


# ----------------------------------------------------------------------------------------------


def residual_in_ulps(built: Built, o_hp: torch.Tensor | None = None) -> float:
    """How far the non-tied tokens move O, in ulps of O: median |O_hp − mean of tied V| / ulp.

    Below ~0.5 the other tokens cannot change a correctly rounded O at all."""
    o_hp = reference(built) if o_hp is None else o_hp
    b, n, d = built.v.shape
    idx = built.tie_pos.unsqueeze(-1).expand(b, built.tie_pos.shape[1], d)
    tied_only = built.v.to(torch.float64).gather(1, idx).mean(1, keepdim=True)
    tied_only = tied_only.expand_as(o_hp)
    shift = (o_hp - tied_only).abs() / ulp_in_dtype(tied_only.to(torch.bfloat16).to(torch.float64))
    shift = shift[torch.isfinite(shift)]
    return float(shift.median()) if shift.numel() else math.nan


def small_lab_case(**kw) -> Case:
    """A CPU-friendly case for live cells: N = 512, 8 sequences of 32 rows."""
    return replace(Case(n_keys=512, head_dim=32, batch=8), **kw)


def reference(built: Built) -> torch.Tensor:
    """O_hp = softmax(S) V in fp64 from the same (bf16-valued) inputs."""
    s = built.scores.to(torch.float64)
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return (p @ built.v.to(torch.float64)) / p.sum(-1, keepdim=True)
