"""The Triton forward kernel (kernels.attention.flash_fwd).

* accuracy against the fp64 golden output for every dtype, head dim, causal/non-causal and
  sequence lengths that are not multiples of the tile;
* the numerics contract: the kernel against the emulator (kernels.attention.emulator) in both
  numerics modes and all three offset rules;
* the offset fix: the stabilised output stays close to the plain one, and the largest P̄ of a
  row with tied maxima is < 1 — also when the tie is split across two key tiles ("cross"),
  where the paper's per-tile rule ("tile") misses it and max P̄ stays exactly 1;
* every output element written (buffers are NaN-poisoned before launch), strided inputs.

Inputs are fresh random numbers on every run. On the CPU the kernel runs in the Triton
interpreter at small sizes; kernels.gpu.check runs this file natively on a GPU at larger ones.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernels  # noqa: F401
from kernels.attention import emulator as emulate, speedups, tma_usable
from kernels.attention.flash_fwd import flash_forward
from kernels.attention.options import (
    KERNEL_STABLE,
    KERNEL_STABLE_MODES,
    LOW_FP32,
    OFFSET_RULES,
    STABLE_OFF_ON,
    SUPPORTED_HEAD_DIMS,
)
from kernels.attention.reference import attention_fp64, lse_fp64, relative_error
from kernels.attention.tile_ops import offset_update
from kernels.env import native_bf16
from kernels.numerics.rounding import ulp_distance

ON_GPU = native_bf16()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
# ‖out − ref‖/‖ref‖ allowed: a few units of each format's rounding error (2^-9 for bf16).
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 2e-5, torch.float64: 1e-12}
# Fixed tiles: several key tiles even at CPU sizes, and on a GPU no autotuning per test case
# (the autotuned default is exercised by kernels.gpu.check).
BLOCKS = dict(block_m=64, block_n=32) if ON_GPU else dict(block_m=32, block_n=32)
# tensor descriptors (TMA) are read on sm_90+ GPUs and in the interpreter
TMA_HERE = not ON_GPU or torch.cuda.get_device_capability()[0] >= 9


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def qkv(batch, heads, n, d, dtype, n_k=None):
    n_k = n if n_k is None else n_k
    return (
        randn(batch, heads, n, d, dtype=dtype),
        randn(batch, heads, n_k, d, dtype=dtype),
        randn(batch, heads, n_k, d, dtype=dtype),
    )


# Every dtype meets every head dim once, causal and not; lengths are not multiples of 32.
ACCURACY_CASES = [
    (dtype, d, causal, n)
    for i, dtype in enumerate(DTYPES)
    for j, d in enumerate(SUPPORTED_HEAD_DIMS)
    for causal, n in ((False, 37 + 8 * ((i + j) % 3)), (True, 61))
    if (i + j) % 2 == 0 or d in (16, 32)
]
ACCURACY_CASES += [
    (dtype, d, causal, 61)
    for dtype in DTYPES
    for d in (64, 128)
    for causal in (False, True)
    if (dtype, d, causal, 61) not in ACCURACY_CASES
    and not any(c[:3] == (dtype, d, causal) for c in ACCURACY_CASES)
]


@pytest.mark.parametrize(
    "dtype,head_dim,causal,n",
    ACCURACY_CASES,
    ids=[f"{str(c[0])[6:]}-d{c[1]}-{'causal' if c[2] else 'full'}-n{c[3]}" for c in ACCURACY_CASES],
)
def test_forward_matches_fp64(dtype, head_dim, causal, n):
    n = n * 5 if ON_GPU else n
    q, k, v = qkv(1, 2, n, head_dim, dtype)
    out, lse, _ = flash_forward(q, k, v, causal=causal, **BLOCKS)
    assert out.dtype == dtype and out.shape == q.shape
    assert not torch.isnan(out).any(), "an output element was never written"
    assert not torch.isnan(lse).any(), "an L entry was never written"
    err = relative_error(out, attention_fp64(q, k, v, causal))
    assert err < TOLERANCE[dtype], f"relative error {err:.3g}"
    lse_err = (lse.double() - lse_fp64(q, k, causal)).abs().max().item()
    assert lse_err < (1e-12 if dtype == torch.float64 else 1e-4)


def test_all_dtypes_and_head_dims_are_covered():
    # the parametrisation above must keep meeting the brief when someone edits it
    for dtype in DTYPES:
        for causal in (False, True):
            assert any(c[0] == dtype and c[2] == causal for c in ACCURACY_CASES)
    for d in SUPPORTED_HEAD_DIMS:
        for causal in (False, True):
            assert any(c[1] == d and c[2] == causal for c in ACCURACY_CASES)
    assert any(c[3] % 32 for c in ACCURACY_CASES)


def test_different_query_and_key_lengths():
    q, k, v = qkv(2, 1, 19, 32, torch.float32, n_k=45)
    for causal in (False, True):
        out, _, _ = flash_forward(q, k, v, causal=causal, block_m=16, block_n=16)
        assert relative_error(out, attention_fp64(q, k, v, causal)) < 2e-5


def test_block_sizes_do_not_change_the_math():
    q, k, v = qkv(1, 1, 50, 16, torch.float32)
    ref = attention_fp64(q, k, v, True)
    for bm, bn in ((16, 16), (16, 32), (32, 16), (64, 64)):
        out, _, _ = flash_forward(q, k, v, causal=True, block_m=bm, block_n=bn)
        assert relative_error(out, ref) < 2e-5, (bm, bn)


# --- the numerics contract --------------------------------------------------------------
def compare_with_emulator(q, k, v, *, causal, numerics, stable, block_n, block_m=32, beta=2.0):
    out, lse, offset = flash_forward(
        q,
        k,
        v,
        causal=causal,
        numerics=numerics,
        stable=stable,
        beta=beta,
        block_m=block_m,
        block_n=block_n,
        return_offset=True,
    )
    emu = emulate.flash_forward(
        q,
        k,
        v,
        causal=causal,
        numerics=numerics,
        stable=stable,
        beta=beta,
        low=q.dtype,
        block_n=block_n,
    )
    return out, lse, offset, emu


def rows_that_agree(lse, offset, emu, max_moved=0.005):
    """The rows whose L and offset m equal the emulator's (to 1e-5); at least all but
    ``max_moved`` of them must (see test_kernel_follows_the_emulator for why a row can move)."""
    agree = ((lse - emu.lse).abs() < 1e-5) & ((offset - emu.row_offset).abs() < 1e-5)
    moved = 1.0 - agree.float().mean().item()
    assert moved <= max_moved, f"{moved:.2%} of the rows have another L or offset m"
    return agree


def assert_close_to_emulator(out, emu_out, min_identical, paper):
    """Bit-identical on >= ``min_identical`` of the entries; beyond 1 ulp only by what flipped
    roundings explain: one ulp of the row's largest output (2^-7 relative for bf16, 2^-10 for
    fp16), three in the paper's numerics where the accumulator itself is rounded every tile
    (flips there add up over the tiles: 2.2 ulps seen once in 4,600 GPU runs)."""
    mantissa = 7 if out.dtype == torch.bfloat16 else 10
    ulps = ulp_distance(out, emu_out)
    identical = (ulps == 0).float().mean().item()
    assert identical >= min_identical, f"only {identical:.4f} of the outputs are bit-identical"
    row_scale = emu_out.float().abs().amax(-1, keepdim=True)
    gap = (out.float() - emu_out.float()).abs()
    allowed = (3.0 if paper else 1.0) * 2.0**-mantissa * row_scale
    explained = (ulps <= 1) | (gap <= allowed)
    worst = (gap / row_scale).max().item()
    assert explained.all(), (
        f"{(~explained).sum().item()} entries differ by more; worst "
        f"|diff| = {worst:.3g} of the row's largest output"
    )
    return ulps


@pytest.mark.parametrize("numerics", ["fa2", "paper"])
@pytest.mark.parametrize("stable", KERNEL_STABLE_MODES)
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_follows_the_emulator(numerics, stable, causal):
    """Same operations, same rounding points: the outputs agree bit for bit except for rare
    flips. Those come from fp32 values that differ in their last bit before a rounding point
    (the kernel's tl.dot and tl.sum add in a different order than torch's matmul and sum, and
    tl.exp is not torch.exp bit for bit) and happen to straddle a bf16 rounding boundary. A flip
    of the output's own rounding is 1 ulp. A flip of one rounded P̄ entry moves the output by
    about 2^-8·P̄·v/ℓ: at most 1 ulp of the row's largest output, but many ulps of an output that
    is tiny because its terms cancel. Rarer flips move a whole row (about one run in 150 on a
    GPU, measured over 7,000): in the paper's numerics the row's largest score, rounded to bf16,
    is the offset m, so a flip of its rounding moves m, L and every P̄ of the row; with an offset
    rule a score at the edge of the tie window (rm − ε) can count as a tie or not, and m moves
    by (β − 1)·rm. Such rows must be rare (:func:`rows_that_agree`), the others close."""
    n = 300 if ON_GPU else 70
    q, k, v = qkv(2, 2, n, 32, torch.bfloat16)
    if causal and stable == "tile":
        # The emulator counts a tile that is fully masked for a row as a tie at rm = -inf and
        # then moves that row's offset to 0 (kernel: masked keys are never ties). A positive
        # score on the diagonal (k_i = q_i) keeps every row maximum > 0, where that is a no-op.
        k = q.clone()
    out, lse, offset, emu = compare_with_emulator(
        q, k, v, causal=causal, numerics=numerics, stable=stable, block_n=16
    )
    agree = rows_that_agree(lse, offset, emu)
    assert_close_to_emulator(out[agree], emu.out[agree], 0.99, numerics == "paper")


@pytest.mark.parametrize("numerics", ["fa2", "paper"])
def test_kernel_follows_the_emulator_fp16(numerics):
    q, k, v = qkv(1, 2, 45, 64, torch.float16)
    out, lse, offset, emu = compare_with_emulator(
        q, k, v, causal=True, numerics=numerics, stable="cross", block_n=32
    )
    agree = rows_that_agree(lse, offset, emu, max_moved=0.025)  # 2 of its 90 rows
    assert_close_to_emulator(out[agree], emu.out[agree], 0.98, numerics == "paper")


def test_tile_rule_ignores_fully_masked_tiles():
    # Row 0 of a causal problem sees one key. If its score is negative, the plain max is the
    # right offset; the kernel must not treat the masked keys of later tiles as a tie.
    q, k, v = qkv(1, 1, 40, 16, torch.bfloat16)
    k[0, 0, 0] = -q[0, 0, 0]
    _, _, offset = flash_forward(
        q, k, v, causal=True, stable="tile", block_m=16, block_n=16, return_offset=True
    )
    s00 = (q[0, 0, 0].float() @ k[0, 0, 0].float()).item() * 0.25
    assert s00 < 0 and offset[0, 0, 0].item() == pytest.approx(s00, rel=1e-6)


# --- the offset fix ---------------------------------------------------------------------
def tied_problem(first, second, n=64, d=32):
    """Integer-valued q, k (every dot product exact in fp32; the tests pass the dyadic scale
    1/8) where every query row's largest score is reached by exactly two keys, at columns
    ``first`` and ``second``."""
    q = torch.randint(-1, 2, (1, 1, n, d), device=DEVICE).float()
    q[..., 0] = 1.0
    k = torch.randint(-1, 2, (1, 1, n, d), device=DEVICE).float()
    v = torch.randn(1, 1, n, d, device=DEVICE)
    q[0, 0, :] = q[0, 0, :1]  # one query direction for every row ...
    k[0, 0, first] = 2 * q[0, 0, 0]  # ... and two identical keys twice as long: the maxima
    k[0, 0, second] = 2 * q[0, 0, 0]
    return (t.to(torch.bfloat16) for t in (q, k, v))


def max_p_bar(q, k, offset, scale):
    """max_j exp(S_ij − m_i) per row, with S exact (integer dot products, dyadic scale)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    return torch.exp(scores.amax(-1) - offset)


@pytest.mark.parametrize("where", ["same tile", "two tiles"])
def test_offset_fix_pushes_max_p_bar_below_one(where):
    first, second = (3, 9) if where == "same tile" else (15, 16)  # block_n = 16
    q, k, v = tied_problem(first, second)
    scale = 0.125
    plain, _, off_plain = flash_forward(
        q, k, v, scale=scale, block_m=16, block_n=16, return_offset=True
    )
    assert (max_p_bar(q, k, off_plain, scale) == 1).all()  # plain FA2: the max is 1
    cross, _, off_cross = flash_forward(
        q, k, v, scale=scale, stable="cross", block_m=16, block_n=16, return_offset=True
    )
    tile, _, off_tile = flash_forward(
        q, k, v, scale=scale, stable="tile", block_m=16, block_n=16, return_offset=True
    )
    assert (max_p_bar(q, k, off_cross, scale) < 1).all()  # cross always sees the tie
    if where == "same tile":
        assert (max_p_bar(q, k, off_tile, scale) < 1).all()
    else:
        # the paper's per-tile rule sees one maximum per tile: no tie, P̄ max stays exactly 1
        assert (max_p_bar(q, k, off_tile, scale) == 1).all()
    ref = attention_fp64(q, k, v, scale=scale)
    for out in (plain, cross, tile):
        assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    assert relative_error(cross, plain) < 1e-2


@pytest.mark.parametrize("stable", OFFSET_RULES)
@pytest.mark.parametrize("causal", [False, True])
def test_stabilised_forward_stays_close_to_plain(stable, causal):
    q, k, v = qkv(1, 2, 53, 64, torch.bfloat16)
    plain, lse_plain, _ = flash_forward(q, k, v, causal=causal, **BLOCKS)
    fixed, lse_fixed, _ = flash_forward(q, k, v, causal=causal, stable=stable, beta=4.0, **BLOCKS)
    ref = attention_fp64(q, k, v, causal)
    assert relative_error(fixed, ref) < TOLERANCE[torch.bfloat16]
    assert relative_error(fixed, plain) < 1e-2
    # L = m + log ℓ is the true log-sum-exp whatever offset m was used
    assert (lse_fixed - lse_plain).abs().max().item() < 1e-4


# --- every element written, any strides ----------------------------------------------------
@pytest.mark.parametrize("n,block", [(1, 16), (17, 16), (33, 32), (100, 64)])
def test_every_element_is_written(n, block):
    # flash_forward fills O, L and the offsets with NaN before the launch
    q, k, v = qkv(2, 1, n, 16, torch.bfloat16)
    for causal in (False, True):
        out, lse, offset = flash_forward(
            q, k, v, causal=causal, block_m=block, block_n=16, return_offset=True, stable="cross"
        )
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()
        assert not torch.isnan(offset).any()


def test_strided_inputs_give_the_same_result():
    # (batch, seq, heads, dim) storage seen as (batch, heads, seq, dim), and a sliced head dim
    q = randn(1, 41, 2, 32).transpose(1, 2)
    k = randn(1, 2, 41, 64)[..., ::2]
    v = randn(1, 41, 2, 32).permute(0, 2, 1, 3)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    for causal in (False, True):
        strided, _, _ = flash_forward(q, k, v, causal=causal, block_m=32, block_n=16)
        dense, _, _ = flash_forward(
            q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, block_m=32, block_n=16
        )
        assert torch.equal(strided, dense)


@pytest.mark.parametrize("dtype", DTYPES)
def test_descriptor_loads_equal_pointer_loads(dtype):
    """K and V read through tensor descriptors (the TMA engine on sm_90+; the interpreter
    reads descriptors too) give the same bits as pointer loads: ragged last tile, a causal
    mask, more keys than queries, both offset rules."""
    n_q, n_k = 45 + int(torch.randint(0, 20, ())), 70 + int(torch.randint(0, 20, ()))
    q, k, v = qkv(2, 3, n_q, 32, dtype, n_k=n_k)
    with speedups(tma_narrow=True):  # head dim 32: descriptors only when asked
        assert tma_usable(k, v) == TMA_HERE
    assert not tma_usable(k, v)
    for causal, stable in ((True, "cross"), (False, "tile"), (True, None)):
        runs = []
        for tma in (True, False):
            with speedups(tma=tma, tma_narrow=tma):
                runs.append(flash_forward(q, k, v, causal=causal, stable=stable, **BLOCKS))
        (o_tma, lse_tma, _), (o_ptr, lse_ptr, _) = runs
        assert not o_tma.isnan().any()
        assert torch.equal(o_tma, o_ptr), f"{dtype} causal={causal} stable={stable}: O differs"
        assert torch.equal(lse_tma, lse_ptr), f"{dtype} causal={causal} stable={stable}: L differs"


def test_descriptors_only_where_the_layout_allows():
    """TMA needs unit stride along the head dim and 16-byte aligned strides and addresses;
    tensors that break a rule take the pointer path (and still give the right answer)."""
    q, k, v = qkv(1, 2, 40, 128, torch.bfloat16)
    assert tma_usable(k, v) == TMA_HERE  # head dim 128: descriptors by default
    shifted = randn(1, 2, 40, 129)[..., 1:]  # address 2 bytes past an aligned one
    transposed = randn(1, 2, 128, 40).transpose(-1, -2)  # head dim not contiguous
    assert not tma_usable(shifted, v)
    assert not tma_usable(k, transposed)
    with speedups(tma=False):
        assert not tma_usable(k, v)
    ref = attention_fp64(q, shifted, transposed)
    out, _, _ = flash_forward(q, shifted, transposed, **BLOCKS)
    assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]


def test_scale_is_used():
    q, k, v = qkv(1, 1, 20, 16, torch.float64)
    out, _, _ = flash_forward(q, k, v, scale=0.3)
    assert relative_error(out, attention_fp64(q, k, v, scale=0.3)) < 1e-12
    assert relative_error(out, attention_fp64(q, k, v)) > 1e-3  # default 1/sqrt(16) differs


@pytest.mark.parametrize("stable", STABLE_OFF_ON)
def test_base_two_moves_only_last_bits(stable):
    """the "exp2" speed-up: P̄ = 2^(S·log₂e − m·log₂e) instead of e^(S − m), the same numbers up to
    fp32 rounding. The offsets m (natural units either way) are the same bit for bit, L agrees
    to 1e-5, and O agrees as the kernel agrees with the emulator: bit for bit but for rare
    flips of a rounding."""
    q, k, v = qkv(2, 2, 300 if ON_GPU else 90, 64, torch.bfloat16)
    runs = {}
    for on in (False, True):
        with speedups(exp2=on):
            runs[on] = flash_forward(
                q, k, v, causal=True, stable=stable, return_offset=True, **BLOCKS
            )
    (o_e, lse_e, m_e), (o_2, lse_2, m_2) = runs[False], runs[True]
    assert (lse_2 - lse_e).abs().max().item() < 1e-5
    assert torch.equal(m_2, m_e), "exp2 moved an offset m"
    assert_close_to_emulator(o_2, o_e, 0.99, paper=False)
    assert relative_error(o_2, attention_fp64(q, k, v, True)) < 1e-2


@pytest.mark.parametrize("dtype,numerics", [(torch.bfloat16, "paper"), (torch.float32, "fa2")])
def test_base_two_only_where_it_is_the_same_arithmetic(dtype, numerics):
    """The paper's numerics round S and S − m to bf16 (other roundings in base 2) and fp32
    inputs are the references: neither takes the exp2 rewrite, so the switch moves no bit."""
    q, k, v = qkv(1, 2, 70, 32, dtype)
    outs = []
    for on in (False, True):
        with speedups(exp2=on):
            outs.append(flash_forward(q, k, v, causal=True, numerics=numerics, **BLOCKS))
    for a, b in zip(*outs):
        if a is not None:
            assert torch.equal(a, b), f"{dtype} {numerics}: the exp2 switch changed a bit"


@triton.jit
def _offset_of_one_tile(QK, M, STABLE: tl.constexpr, LOW: tl.constexpr):
    """The offset :func:`~kernels.attention.tile_ops.offset_update` gives a 16×16 tile of fp32
    scores, from a row that has seen nothing yet (β = 1, ε = 0, no cap)."""
    rows, cols = tl.arange(0, 16), tl.arange(0, 16)
    qk = tl.load(QK + rows[:, None] * 16 + cols[None, :])
    start = tl.full([16], float("-inf"), tl.float32)
    m, _, _ = offset_update(
        qk,
        1.0,
        start,
        start,
        tl.zeros([16], tl.float32),
        1.0,
        0.0,
        0.0,
        STABLE,
        False,
        False,
        LOW,
        False,
        True,
    )
    tl.store(M + rows, m)


def test_offset_update_refuses_a_rule_it_does_not_name():
    """Every rule the kernels name compiles (off: the row maximum); any other code is refused
    when the kernel is compiled instead of quietly taking the running-maximum path."""
    qk = torch.randn(16, 16, device=DEVICE)
    for name in KERNEL_STABLE_MODES:
        m = torch.empty(16, device=DEVICE)
        _offset_of_one_tile[(1,)](qk, m, KERNEL_STABLE[name], LOW_FP32)
        if name == "off":
            assert torch.equal(m, qk.max(1).values)
    unnamed = max(KERNEL_STABLE.values()) + 1
    with pytest.raises(Exception) as refused:
        _offset_of_one_tile[(1,)](qk, torch.empty(16, device=DEVICE), unnamed, LOW_FP32)
    # compiled natively, Triton raises its error at the call site with the helper's
    # static_assert as the cause; the interpreter raises the assertion itself
    messages, error = [], refused.value
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("unknown offset rule" in message for message in messages), messages
