"""The implementations of chapter 8 (kernels/golden/implementations.py): fp64 agreement
with the golden value, the baseline against torch, FA1's structure (one tile = the
paper's path, B_r changes no bit), and the emulator's rescaling counter. Fresh random
inputs each run."""

import random

import pytest
import torch

import kernels  # noqa: F401
from kernels.attention import emulator, reference
from kernels.golden import implementations as impl


def fresh_seed():
    return random.SystemRandom().randrange(2**31)


def inputs(n=96, d=32, heads=2, seed=None):
    gen = torch.Generator().manual_seed(fresh_seed() if seed is None else seed)
    return [torch.randn(1, heads, n, d, generator=gen) for _ in range(3)]


@pytest.mark.parametrize("name", impl.IMPLEMENTATIONS)
def test_every_implementation_is_exact_in_fp64(name):
    q, k, v = inputs()
    gold = impl.golden(q, k, v, torch.float64)
    out = impl.run_in_format(name, q, k, v, "fp64", block_n=16)
    assert out.dtype == torch.float64
    assert (out - gold).abs().max() < 1e-13


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("name", impl.IMPLEMENTATIONS)
def test_outputs_are_values_of_the_format_and_close_to_golden(name, fmt):
    low = impl.format_dtype(fmt)
    q, k, v = inputs()
    out = impl.run_in_format(name, q, k, v, low, block_n=32)
    assert out.dtype == torch.float32
    assert torch.equal(out.to(low).float(), out)  # representable in the format
    gold = impl.golden(q, k, v, low)
    tol = {"bf16": 0.1, "fp16": 0.02, "fp32": 1e-4}[fmt]
    assert (out.double() - gold).abs().max() < tol


def test_baseline_is_torch_math_attention_on_bf16_tensors():
    q, k, v = inputs(n=128, d=64)
    ours = impl.baseline(q, k, v, torch.bfloat16)
    torch_math = reference.standard_attention(*(t.bfloat16() for t in (q, k, v)))
    assert (ours == torch_math.float()).double().mean() > 0.99


def test_baseline_fp32_is_the_ideal_up_to_fp32_rounding():
    q, k, v = inputs()
    gold = impl.golden(q, k, v, torch.bfloat16)
    got = impl.baseline_fp32(q, k, v, torch.bfloat16)
    assert (got == impl.ideal(gold, torch.bfloat16)).double().mean() > 0.99


def test_fa1_with_one_tile_is_the_papers_untiled_path():
    q, k, v = inputs(n=80)
    fa1 = impl.fa1(q, k, v, torch.bfloat16, block_n=80)
    paper = emulator.flash_forward(q, k, v, numerics="paper", block_n=80).out.float()
    assert torch.equal(fa1, paper)


@pytest.mark.parametrize("block_n", [16, 48])
def test_fa1_query_block_changes_no_bit(block_n):
    q, k, v = inputs(n=96)
    whole = impl.fa1(q, k, v, torch.bfloat16, block_n=block_n)
    for block_m in (1, 16, 40):
        assert torch.equal(
            impl.fa1(q, k, v, torch.bfloat16, block_m=block_m, block_n=block_n), whole
        )


def test_fa1_counts_equal_the_emulators_in_fp32():
    q, k, v = inputs(n=256)
    _, fa1_counts = impl.fa1(q, k, v, torch.float32, block_n=32, with_counts=True)
    with impl.count_offset_changes() as counter:
        emulator.flash_forward(q, k, v, low=torch.float32, block_n=32)
    assert torch.equal(fa1_counts, counter.total(dim=-2))


def test_counter_counts_each_growth_and_leaves_the_emulator_unchanged():
    # q = e1 makes S = the first column of K: tile maxima 1, 2, 3, 4 (growths: 3) in row
    # 0
    n, d, bn = 64, 16, 16
    k = torch.zeros(1, 1, n, d)
    k[0, 0, :, 0] = torch.arange(n) / bn  # rising scores: every tile raises m
    q = torch.zeros(1, 1, 2, d)
    q[0, 0, 0, 0] = 1.0
    q[0, 0, 1, 0] = -1.0  # falling scores: the first tile holds m
    v = torch.randn(1, 1, n, d)
    plain = emulator.flash_forward(q, k, v, scale=1.0, block_n=bn).out
    with impl.count_offset_changes() as counter:
        counted = emulator.flash_forward(q, k, v, scale=1.0, block_n=bn).out
    assert torch.equal(plain, counted)
    assert counter.total().flatten().tolist() == [3.0, 0.0]
    assert emulator.offset_update is not None and "counting" not in emulator.offset_update.__name__


def test_expected_record_count():
    assert impl.expected_record_count(1) == 0
    assert impl.expected_record_count(2) == pytest.approx(0.5)
    assert impl.expected_record_count(4) == pytest.approx(1 / 2 + 1 / 3 + 1 / 4)
    with pytest.raises(ValueError, match="tiles"):
        impl.expected_record_count(0)


def test_bad_input_names_what_is_wrong():
    q, k, v = inputs(n=8, d=16)
    with pytest.raises(ValueError, match="format"):
        impl.format_dtype("bf8")
    with pytest.raises(ValueError, match="implementation"):
        impl.run_in_format("fa3", q, k, v)
    with pytest.raises(ValueError, match="block"):
        impl.fa1(q, k, v, block_n=0)
    with pytest.raises(RuntimeError, match="no emulator call"):
        impl.OffsetCounter().total()
