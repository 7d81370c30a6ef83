"""Chapter 10's exercise checks (kernels.gpu.exercises): a blank and a plausible wrong answer
fail, the solution passes."""

from __future__ import annotations

import pytest

import kernels  # noqa: F401
from kernels.gpu import exercises as ex
from kernels.gpu.roofline import intensity


def test_exercise_checks_accept_only_the_solution():
    from kernels.exercise_rules import WrongAnswer

    for check in (ex.check_flop_per_byte, ex.check_stream_tflops, ex.check_bit_changes):
        with pytest.raises(WrongAnswer, match="no answer yet"):
            check(None)
    with pytest.raises(WrongAnswer, match="no answer yet"):
        ex.check_flop_per_byte(lambda n, d, s, g: None)  # a blank body
    model = lambda n, d, s, g: 4 * n * n * d * g / ((2 * g + 2) * n * d * s)  # noqa: E731
    ex.check_flop_per_byte(model, thorough=True)
    assert model(4096, 64, 2, 1) == intensity(4096, 64, "fused", 2)  # one group: section 1
    with pytest.raises(WrongAnswer, match="values, not bytes"):
        ex.check_flop_per_byte(lambda n, d, s, g: model(n, d, 1, g) if g > 1 else n / s)
    with pytest.raises(WrongAnswer, match="once for the whole group"):
        ex.check_flop_per_byte(lambda n, d, s, g: intensity(n, d, "fused", s))
    with pytest.raises(WrongAnswer, match="its own two matmuls"):
        ex.check_flop_per_byte(lambda n, d, s, g: model(n, d, s, g) / g if g > 1 else n / s)
    ex.check_stream_tflops(lambda f, h, k: f / max(h, k) * 1e-6, thorough=True)
    ex.check_stream_tflops(lambda f, h, k: f / max(h, k) / 1e6)
    with pytest.raises(WrongAnswer, match="CPU wait"):
        ex.check_stream_tflops(lambda f, h, k: f / (h + k) * 1e-6)
    with pytest.raises(WrongAnswer, match="power of ten"):
        ex.check_stream_tflops(lambda f, h, k: f / max(h, k))
    with pytest.raises(WrongAnswer):
        ex.check_stream_tflops(lambda f, h, k: f / k * 1e-6)


def test_which_changes_move_bits():
    """On fresh draws, wider key tiles and reversed keys move bits of O; another query tile, a
    batch around the sequence and a causal prefix do not."""
    assert ex._bit_changes_expected() == {"key tile", "key order"}
    ex.check_bit_changes({"key tile", "key order"})
    ex.check_bit_changes(["key order", "key tile"])
    from kernels.exercise_rules import WrongAnswer

    for wrong in (
        {"key order"},
        set(ex.CHANGES),
        set(),
        "key tile",
        {"key tile", "key order", "prefix"},
    ):
        with pytest.raises(WrongAnswer):
            ex.check_bit_changes(wrong)
    with pytest.raises(WrongAnswer, match="use only the names"):
        ex.check_bit_changes({"tiles"})


def test_of_the_chapters_speedups_only_exp2_moves_bits():
    """Chapter 10, section 3: direct launches, the causal split and the max-first row maximum
    leave every bit of O alone at a given tile shape; the exp2 rewrite moves a few (about one
    bf16 output in three thousand, hence 65,536 outputs)."""
    import torch

    from kernels.attention import flash_attention, speedups
    from kernels.timing import on_gpu

    device = "cuda" if on_gpu() else "cpu"
    q, k, v = (torch.randn(1, 4, 256, 64).bfloat16().to(device) for _ in range(3))

    def run(**switches):
        with speedups(**switches):
            return flash_attention(q, k, v, causal=True, block_m=64, block_n=32)

    base = run()
    for switch in ("direct_launch", "causal_split", "max_first"):
        assert torch.equal(run(**{switch: False}), base), switch
    assert not torch.equal(run(exp2=False), run(exp2=True))
