"""The practitioner's-step benchmark on a CPU at tiny sizes: it trains Hugging Face's GPT-2
through the book's attention (counted), each row gets its ratio to SDPA, and a loss that is not
finite stops it."""

import pytest
import torch

from kernels.attention import hf_attention
from kernels.gpu import practitioner


def test_each_row_trains_its_implementation_and_gets_its_ratio(monkeypatch):
    calls = []
    real = hf_attention.flash_attention
    monkeypatch.setattr(
        hf_attention, "flash_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    layers = practitioner.TINY["tiny GPT-2"][0]
    rows = practitioner.measure(practitioner.TINY, "cpu", 2, 1, ("eager",), log=lambda _: None)
    by_name = {row["implementation"]: row for row in rows}
    assert set(by_name) == set(practitioner.IMPLEMENTATIONS)
    assert len(calls) == 3 * layers  # warm-up and timed steps, every layer, book rows only
    assert by_name["sdpa"]["ratio_to_sdpa"] == 1.0
    book = by_name["book, δ from dP∘P"]
    assert book["ratio_to_sdpa"] == pytest.approx(
        book["steps_per_s"] / by_name["sdpa"]["steps_per_s"]
    )
    assert all(row["steps_per_s"] > 0 and row["seconds"] > 0 for row in rows)


def test_a_loss_that_is_not_finite_stops_the_benchmark(monkeypatch):
    real = practitioner.train_steps

    def poisoned(*args, **kwargs):
        return real(*args, **kwargs)[:-1] + [torch.tensor(float("nan"))]

    monkeypatch.setattr(practitioner, "train_steps", poisoned)
    with pytest.raises(FloatingPointError, match="not finite"):
        practitioner.measure(practitioner.TINY, "cpu", 1, 1, ("eager",), log=lambda _: None)
