"""Checks of the exercises of chapters 3 and 4 (rules: :mod:`kernels.exercise_rules`).

* ``ch3-merge`` :func:`check_merge`: combine two halves' (O, L) without overflow
* ``ch3-bytes`` :func:`check_peak_bytes`: predict naive attention's peak memory
* ``ch3-causal-tiles`` :func:`check_key_tiles`: how many key tiles a causal query tile visits
* ``ch4-dk`` :func:`check_dk_gap`: the analogue of Eq. (1) for dK
* ``ch4-which`` :func:`check_changed`: which gradients change when only V changes
"""

from __future__ import annotations

import math

import torch

from .. import exercise_rules as ck
from ..interpreter import interpreting
from . import reference, tiling
from .autograd import backward_pass


def _device():
    return "cpu" if interpreting() or not torch.cuda.is_available() else "cuda"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# ----------------------------------------------------------------------------------------------
# Exercise ``ch3-merge``: Merge two halves
# ----------------------------------------------------------------------------------------------
def _merge_case(gen, rng):
    """Two halves of a fresh attention problem, as the split-key programs return them, with
    every row's scores shifted by up to ±3,000: e^L overflows (or underflows to 0) in fp64."""
    b, h = (int(x) for x in rng.integers(1, 3, 2))
    n_q, n_k = (int(x) for x in rng.integers(8, 40, 2))
    d = int(rng.choice([8, 16, 32]))
    split = int(rng.integers(1, n_k))
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) for n in (n_q, n_k, n_k))
    q = q * float(rng.uniform(0.5, 3.0))
    o_a, lse_a = tiling.online_attention(q, k[..., :split, :], v[..., :split, :], block_n=16)
    o_b, lse_b = tiling.online_attention(q, k[..., split:, :], v[..., split:, :], block_n=16)
    # shifting all scores of a row by c leaves O alone and adds c to L
    shift = (torch.rand(b, h, n_q, generator=gen, dtype=torch.float64) * 2 - 1) * 3000
    shift[..., : n_q // 4] = 0.0  # and some rows unshifted
    want_o = reference.attention_fp64(q, k, v)
    want_lse = reference.lse_fp64(q, k) + shift
    return (o_a, lse_a + shift, o_b, lse_b + shift), (want_o, want_lse)


def check_merge(fn, thorough: bool = False) -> None:
    """Exercise ``ch3-merge``: ``fn(o_a, lse_a, o_b, lse_b) -> (o, lse)`` combines two partial
    results of the online softmax over disjoint halves of the keys. Fresh problems whose L reach
    ±3,000."""
    ck.need_function(fn, "merge")
    ck.forbid(fn, "ch3-merge")
    gen, rng = ck.fresh_generator(), ck.fresh_rng()
    trials = 8 if thorough else 2
    for _ in range(trials):
        args, (want_o, want_lse) = _merge_case(gen, rng)
        got = ck.call(fn, "merge", *(t.clone() for t in args))
        try:
            o, lse = got
        except (TypeError, ValueError):
            ck.fail(f"merge should return a pair (o, lse), got {type(got).__name__}")
        if not (isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor)):
            ck.fail("merge should return two tensors (o, lse)")
        if o.shape != want_o.shape or lse.shape != want_lse.shape:
            ck.fail(
                f"shapes: o should be {tuple(want_o.shape)} like o_a and lse "
                f"{tuple(want_lse.shape)} like lse_a; got {tuple(o.shape)} and "
                f"{tuple(lse.shape)}"
            )
        o, lse = o.double(), lse.double()
        if not (torch.isfinite(o).all() and torch.isfinite(lse).all()):
            ck.fail(
                "o or lse holds inf or NaN where L is in the thousands: e^L overflows (and "
                "e^-L underflows to 0); weigh the halves relative to a maximum"
            )
        lse_ok = ((lse - want_lse).abs() <= 1e-9 * want_lse.abs().clamp(min=1)).all()
        o_ok = (o - want_o).abs().max() <= 1e-9 * want_o.abs().max()
        if not lse_ok:
            ck.fail(
                "lse is wrong: it is the log of the total mass of both halves, e^L_a + e^L_b "
                "(neither their maximum nor their sum)"
            )
        if not o_ok:
            ck.fail(
                "o is wrong although lse is right: each half's O is normalised by its own "
                "mass, so weigh it by that half's share of the total before adding"
            )
    ck.correct(f"{trials} fresh split-key problems with L up to ±3,000 merged to 1e-9")


# ----------------------------------------------------------------------------------------------
# Exercise ``ch3-bytes``: Predict the memory
# ----------------------------------------------------------------------------------------------
def check_peak_bytes(fn, thorough: bool = False) -> None:
    """Exercise ``ch3-bytes``: ``fn(b, h, n, d, itemsize) -> bytes`` predicts the peak bytes
    ``tiling.peak_live_bytes`` measures for ``reference.standard_attention``, within 15%.

    Fresh shapes with n at least 8 d (the regime where attention's memory matters)."""
    ck.need_function(fn, "peak_bytes")
    ck.forbid(fn, "ch3-bytes")
    rng = ck.fresh_rng()
    trials = 6 if thorough else 3
    for _ in range(trials):
        b, h = (int(x) for x in rng.integers(1, 4, 2))
        if b * h == 1:
            h = 2
        d = int(rng.choice([16, 32, 64]))
        n = int(rng.integers(8 * d, 12 * d))
        dtype = [torch.float32, torch.float64][int(rng.integers(0, 2))]
        q, k, v = (torch.randn(b, h, n, d, dtype=dtype) for _ in range(3))
        measured = tiling.peak_live_bytes(reference.standard_attention, q, k, v)
        itemsize = q.element_size()
        got = ck.call(fn, "peak_bytes", b, h, n, d, itemsize)
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            ck.fail(f"peak_bytes should return a number of bytes, got {type(got).__name__}")
        if abs(got - measured) > 0.15 * measured:
            way = "too low" if got < measured else "too high"
            ck.fail(
                f"the prediction for (b, h, n, d) = {(b, h, n, d)} with {itemsize}-byte "
                f"numbers is {way} by more than 15%: how many n x n matrices are alive at "
                "once, for how many heads, and how many bytes is each number?"
            )
    ck.correct(f"{trials} fresh shapes predicted within 15%")


# ----------------------------------------------------------------------------------------------
# Exercise ``ch3-causal-tiles``: Key tiles of a causal query tile
# ----------------------------------------------------------------------------------------------
def _key_tiles_expected(i: int, block_m: int, block_n: int, n: int) -> int:
    """Key tiles query tile ``i`` visits in the causal forward kernel (N_Q = N_K = n)."""
    hi = min((i + 1) * block_m, n)  # keys after the tile's last query are skipped
    return -(-hi // block_n)


def check_key_tiles(fn, thorough: bool = False) -> None:
    """Exercise ``ch3-causal-tiles``: ``fn(i, block_m, block_n, n) -> tiles``, the number of key
    tiles the causal forward kernel loads for query tile ``i`` (both stages). Fresh tile sizes and
    lengths."""
    ck.need_function(fn, "key_tiles")
    ck.forbid(fn, "ch3-causal-tiles")
    rng = ck.fresh_rng()
    trials = 400 if thorough else 40
    for trial in range(trials):
        block_m, block_n = (int(2**x) for x in rng.integers(4, 8, 2))
        n = int(rng.integers(1, 2000))
        i = int(rng.integers(0, -(-n // block_m)))
        if trial % 3 == 0:  # a partial last query tile reaching a whole key tile past n
            block_n = int(2 ** rng.integers(4, 6))
            block_m = block_n * int(2 ** rng.integers(1, 3))
            n = block_m * int(rng.integers(0, 15)) + int(rng.integers(1, block_m - block_n + 1))
            i = -(-n // block_m) - 1
        got = ck.call(fn, "key_tiles", i, block_m, block_n, n)
        if not _is_int(got):
            ck.fail(f"key_tiles should return an int, got {type(got).__name__}")
        want = _key_tiles_expected(i, block_m, block_n, n)
        if got != want:
            if got == want - 1:
                ck.fail(
                    "one tile short: the tile that holds the diagonal (and any partly "
                    "filled tile) must be loaded too"
                )
            if got == want + 1:
                ck.fail(
                    "one tile too many: a tile whose keys all come after the query tile's "
                    "last row is skipped"
                )
            if n % block_m and i == -(-n // block_m) - 1:
                ck.fail(
                    "wrong for the last query tile when n is not a multiple of block_m: "
                    "there are no keys beyond n"
                )
            ck.fail(
                "wrong count: which is the last key a row of query tile i may see, and in "
                "which key tile does it lie?"
            )
    ck.correct(f"{trials} fresh (tile, block sizes, length) cases")


# ----------------------------------------------------------------------------------------------
# Exercise ``ch4-dk``: Eq. (1) for dK
# ----------------------------------------------------------------------------------------------
def _dk_gap_expected(p, q, delta_lp, delta_hp, alpha):
    return alpha * p.transpose(-1, -2) @ ((delta_lp - delta_hp).unsqueeze(-1) * q)


def check_dk_gap(fn, thorough: bool = False) -> None:
    """Exercise ``ch4-dk``: ``fn(p, q, delta_lp, delta_hp, alpha) -> dK_hp - dK_lp`` (fp64).

    Fresh P (rows: queries, columns: keys, fewer keys than queries so that a transpose cannot be
    missed), Q, two δ's and α."""
    ck.need_function(fn, "dk_gap")
    ck.forbid(fn, "ch4-dk")
    gen, rng = ck.fresh_generator(), ck.fresh_rng()
    trials = 6 if thorough else 2
    for _ in range(trials):
        b, h = (int(x) for x in rng.integers(1, 3, 2))
        n_q = int(rng.integers(20, 60))
        n_k = int(rng.integers(5, n_q - 5))
        d = int(rng.choice([8, 16]))
        p = torch.softmax(
            torch.randn(b, h, n_q, n_k, generator=gen, dtype=torch.float64) * 2, dim=-1
        )
        q = torch.randn(b, h, n_q, d, generator=gen, dtype=torch.float64)
        delta_hp = torch.randn(b, h, n_q, generator=gen, dtype=torch.float64)
        delta_lp = delta_hp + 0.01 * torch.randn(b, h, n_q, generator=gen, dtype=torch.float64)
        alpha = 1 / math.sqrt(d)
        want = _dk_gap_expected(p, q, delta_lp, delta_hp, alpha)
        got = ck.call(fn, "dk_gap", p.clone(), q.clone(), delta_lp.clone(), delta_hp.clone(), alpha)
        ck.need_tensor(
            got,
            "dk_gap",
            want.shape,
            f"dK has one row per key: with {n_k} keys and {n_q} queries it is {tuple(want.shape)}",
        )
        got = got.double()
        scale = want.abs().max()

        def close(x):
            return bool((x - want).abs().max() <= 1e-9 * scale)

        if close(got):
            continue
        if close(-got):
            ck.fail(
                "the sign is flipped: the question asks for dK_hp - dK_lp, and "
                "dS_hp - dS_lp = P o (delta_lp - delta_hp)"
            )
        if close(got * alpha) or close(got / alpha):
            ck.fail("off by the factor alpha: where does the scale enter dK?")
        ck.fail(
            "not dK_hp - dK_lp: which rows of dS change when only δ changes, and which "
            "factor of dK = alpha dS^T Q do they multiply?"
        )
    ck.correct(f"{trials} fresh problems (rectangular P) agree to 1e-9")


# ----------------------------------------------------------------------------------------------
# Exercise ``ch4-which``: Which gradients does V touch?
# ----------------------------------------------------------------------------------------------
GRADIENTS = ("dQ", "dK", "dV")


def _changed_expected(gen=None) -> set[str]:
    """Run the book's forward and backward kernels twice on fresh inputs that differ only in V
    (the same Q, K and dO) and name the gradients that differ."""
    gen = gen or ck.fresh_generator()
    device = _device()
    q, k, v, other_v, d_out = (
        torch.randn(1, 2, 32, 16, generator=gen).to(device) for _ in range(5)
    )
    first = backward_pass(q, k, v, d_out, causal=True)
    second = backward_pass(q, k, other_v, d_out, causal=True)
    runs = {"dQ": (first.dq, second.dq), "dK": (first.dk, second.dk), "dV": (first.dv, second.dv)}
    return {name for name, (a, b) in runs.items() if not torch.equal(a, b)}


def check_changed(answer) -> None:
    """Exercise ``ch4-which``: the set of gradients (names from ``"dQ"``, ``"dK"``, ``"dV"``) that
    change when only V changes. The check runs the kernels twice on fresh inputs and compares
    bits."""
    given = ck.need_names(answer, "changed", GRADIENTS, '{"dQ"}')
    want = _changed_expected()
    if given == want:
        return ck.correct("exactly the gradients that change (fresh inputs, compared bit by bit)")
    if given - want:
        ck.fail("a gradient in your set does not change: which inputs does its formula read?")
    ck.fail("a gradient that changes is missing: which formulas read V, directly or not?")
