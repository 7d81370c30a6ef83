"""kernels.timing, the one timing module: FLOP counts, the CPU refusal, speed rows (and the row
of an implementation that cannot run), the run's budget."""

from __future__ import annotations

import pytest
import torch

import kernels  # noqa: F401
from kernels import timing
from kernels.attention import current_speedups, registry, speedups


def test_flops_follow_the_convention():
    assert timing.attention_flops(1, 1, 4, 2, causal=False) == 4.0 * 4 * 4 * 2
    assert timing.attention_flops(1, 1, 4, 2, causal=True) == 4.0 * 4 * 4 * 2 / 2
    assert timing.attention_flops(2, 3, 8, 4, mode="fwd+bwd") == pytest.approx(
        3.5 * timing.attention_flops(2, 3, 8, 4)
    )
    with pytest.raises(ValueError, match="mode"):
        timing.attention_flops(1, 1, 4, 2, mode="bwd")


def test_inputs_are_seeded_unless_asked_not_to_be():
    a, b = (
        timing.inputs((1, 2, 8, 4), torch.float32, "cpu"),
        timing.inputs((1, 2, 8, 4), torch.float32, "cpu"),
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == 4


@pytest.mark.skipif(timing.on_gpu(), reason="the refusal is for machines without a GPU")
def test_no_cpu_time_passes_for_a_gpu_figure():
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        timing.time_ms(lambda: None)
    assert timing.time_ms(lambda: None, cpu=True) >= 0


def test_speed_rows_time_or_say_why_not():
    shape = (1, 2, 32, 16)
    tensors = timing.inputs(shape, torch.bfloat16, "cpu")
    row = timing.speed_row(
        "book",
        registry.runner("triton", causal=True),
        tensors,
        shape,
        "bf16",
        True,
        "fwd+bwd",
        peak=100.0,
        cpu=True,
    )
    assert row["ms"] > 0 and row["fraction_of_peak"] == pytest.approx(row["tflops"] / 100.0)
    assert set(timing.row_of("x", shape, "bf16", True, "fwd")) <= set(row)

    def broken(q, k, v):
        raise RuntimeError("no kernel for this case\nsecond line")

    row = timing.speed_row("broken", broken, tensors, shape, "bf16", True, "fwd", cpu=True)
    assert row["ms"] is None and row["error"] == "RuntimeError: no kernel for this case"
    assert "fraction_of_peak" not in row


def test_speedups_are_restored_whatever_happens():
    before = current_speedups()
    with pytest.raises(ZeroDivisionError), speedups(direct_launch=False):
        assert current_speedups().direct_launch is False
        1 / 0  # noqa: B018
    assert current_speedups() is before
    with pytest.raises(ValueError, match="unknown speed-up"), speedups(warp_drive=True):
        pass


def test_budget_says_what_it_skipped():
    said = []
    budget = timing.Budget(10.0, log=said.append)
    assert budget.allows("small", 1.0) and not budget.allows("huge", 1e6)
    assert budget.skipped == [budget.skipped[0]] and budget.skipped[0].startswith("huge:")
    assert said and "SKIP huge" in said[0]
