"""The practitioner's-step benchmark on a CPU at tiny sizes: it trains Hugging Face's GPT-2
through the book's attention (counted), each row gets its ratio to SDPA, and a loss that is not
finite stops it."""

import numpy as np
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
    kept = []
    rows = practitioner.measure(
        practitioner.TINY, "cpu", 2, 1, ("eager",), log=lambda _: None, keep=kept.append,
        loops=("Hugging Face",),
    )  # fmt: skip
    assert [len(k) for k in kept] == [2, 2] and kept[0] is rows  # saved after every row
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


def test_the_figure_and_the_glued_ratios_come_from_the_rows():
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng()
    rows = []
    for model in ("small", "large"):
        for mode in practitioner.MODES:
            sdpa = float(rng.uniform(10, 90))
            for implementation in practitioner.IMPLEMENTATIONS:
                speed = sdpa if implementation == "sdpa" else float(rng.uniform(5, 90))
                rows.append({"model": model, "mode": mode, "implementation": implementation,
                             "batch": 4, "context": 64, "steps_per_s": speed,
                             "ratio_to_sdpa": speed / sdpa})  # fmt: skip
    fig = practitioner.plot_steps(rows)
    bars = [p.get_height() for ax in fig.axes for p in ax.patches]
    assert sorted(bars) == sorted(r["steps_per_s"] for r in rows)
    numbers = practitioner.step_numbers(rows)
    compiled = [r["ratio_to_sdpa"] for r in rows[2:4] + rows[6:8] if r["implementation"] != "sdpa"]
    assert numbers["c10_step_compiled_lo"] == min(compiled)
    assert numbers["c10_step_compiled_hi"] == max(compiled)
    book = [r["ratio_to_sdpa"] for r in rows if r["implementation"] != "sdpa"]
    assert (numbers["c10_step_all_lo"], numbers["c10_step_all_hi"]) == (min(book), max(book))


def test_the_nanogpt_loop_calls_the_drop_in_in_every_layer(monkeypatch):
    calls = []
    real = hf_attention.flash_attention
    monkeypatch.setattr(
        hf_attention, "flash_attention", lambda *a, **k: calls.append(a[3]) or real(*a, **k)
    )
    rows = practitioner.measure(
        practitioner.TINY, "cpu", 1, 1, ("eager",), log=lambda _: None, loops=("nanoGPT",)
    )
    layers = practitioner.TINY["tiny GPT-2"][0]
    assert [r["loop"] for r in rows] == ["nanoGPT", "nanoGPT"]
    assert len(calls) == 2 * layers and all(opts.delta_source == "dp" for opts in calls)
    assert rows[0]["ratio_to_sdpa"] == 1.0 and rows[1]["ratio_to_sdpa"] > 0


def test_the_stored_command_runs_as_printed(monkeypatch, tmp_path):
    """A loop name with a space survives into the record's command quoted, so the command a
    chapter prints under the figure can be pasted into a shell."""
    import json
    import shlex

    monkeypatch.setattr(practitioner, "measure", lambda *a, keep, **k: keep([]))
    argv = ["--loops", "Hugging Face", "--eager-only", "--out", str(tmp_path)]
    assert practitioner.main(argv) == 0
    command = json.loads((tmp_path / "practitioner_step.json").read_text())["provenance"]["command"]
    assert shlex.split(command)[3:] == argv


def test_sdpa_drift_compares_the_same_setting_only():
    rng = np.random.default_rng()
    speeds = rng.uniform(10, 90, size=3)
    earlier = [{"model": "m", "mode": mode, "implementation": "sdpa", "steps_per_s": float(v)}
               for mode, v in zip(("eager", "compiled", "other"), speeds)]  # fmt: skip
    factor = float(rng.uniform(1.1, 1.5))
    rows = [dict(earlier[0], steps_per_s=earlier[0]["steps_per_s"] * factor),
            dict(earlier[1], implementation="book, δ from dP∘P", steps_per_s=1.0),
            dict(earlier[2], model="another", steps_per_s=1.0)]  # fmt: skip
    assert practitioner.sdpa_drift(rows, earlier) == pytest.approx(factor - 1)
    with pytest.raises(ValueError, match="share no SDPA setting"):
        practitioner.sdpa_drift(rows[1:], earlier)


def test_nanogpts_targets_are_the_next_tokens(monkeypatch):
    """nanoGPT's model does not shift its targets (Hugging Face's does): the loop must hand it
    the batch moved by one, or the model learns to copy its input and the loss falls to 0."""
    seen = []

    def step_fn(x, y):
        seen.append((x.clone(), y.clone()))
        return None, (x.float().sum() * 0).requires_grad_()

    vocab = int(np.random.default_rng().integers(5, 500))
    tokens = torch.randint(0, vocab, (3, 9))
    practitioner._loss(step_fn, tokens, "nanoGPT")
    ((x, y),) = seen
    assert torch.equal(x, tokens[:, :-1]) and torch.equal(y, tokens[:, 1:])


def test_a_nanogpt_row_learns_nothing_from_random_tokens():
    """On random tokens no model beats a uniform guess: the loss stays near ln(vocabulary)."""
    rows = practitioner.measure(
        practitioner.TINY, "cpu", 2, 1, ("eager",), log=lambda _: None, loops=("nanoGPT",)
    )
    vocab = practitioner.TINY["tiny GPT-2"][-1]
    for row in rows:
        assert abs(row["final_loss"] - np.log(vocab)) < 0.5, row


def test_each_loop_writes_its_own_record_and_both_are_read(monkeypatch, tmp_path):
    rng = np.random.default_rng()
    speeds = {}

    def measure(*args, keep, loops, **kwargs):
        speeds[loops] = float(rng.uniform(1, 99))
        keep([{"loop": loops[0], "steps_per_s": speeds[loops]}])

    monkeypatch.setattr(practitioner, "measure", measure)
    for loops in ("nanoGPT", "Hugging Face"):
        assert practitioner.main(["--loops", loops, "--out", str(tmp_path)]) == 0
    records = practitioner.stored_records(tmp_path)
    assert [r["data"]["rows"][0]["loop"] for r in records] == ["Hugging Face", "nanoGPT"]
    assert records[1]["data"]["rows"][0]["steps_per_s"] == speeds[("nanoGPT",)]
    assert practitioner.record_name(("nanoGPT", "Hugging Face")) == "practitioner_step"


def test_ratio_drift_and_the_target_count_read_the_books_rows():
    rng = np.random.default_rng()
    ratios = rng.uniform(0.5, 1.5, size=2)
    earlier = [{"model": "m", "mode": mode, "implementation": "book", "ratio_to_sdpa": float(r)}
               for mode, r in zip(("eager", "compiled"), ratios)]  # fmt: skip
    shift = float(rng.uniform(0.01, 0.3))
    rows = [dict(earlier[0], ratio_to_sdpa=ratios[0] + shift),
            dict(earlier[1], ratio_to_sdpa=ratios[1] - shift / 2),
            dict(earlier[0], implementation="sdpa", ratio_to_sdpa=1.0)]  # fmt: skip
    assert practitioner.ratio_drift(rows, earlier) == pytest.approx(shift)
    with pytest.raises(ValueError, match="share no setting"):
        practitioner.ratio_drift(rows[2:], earlier)
    met, count = practitioner.target_count(rows, target=float(np.median(ratios)))
    assert count == 2 and met == sum(r["ratio_to_sdpa"] >= np.median(ratios) for r in rows[:2])


def test_print_drift_prints_and_returns_the_glued_numbers(capsys):
    rng = np.random.default_rng()
    speeds, ratios = rng.uniform(10, 90, size=2), rng.uniform(0.3, 1.5, size=4)
    setting = {"model": "m", "mode": "eager"}
    earlier = [
        dict(setting, implementation="sdpa", steps_per_s=float(speeds[0])),
        dict(setting, implementation="book", ratio_to_sdpa=float(ratios[0])),
    ]
    rows = [dict(earlier[0], steps_per_s=float(speeds[1])),
            dict(earlier[1], ratio_to_sdpa=float(ratios[1]))]  # fmt: skip
    before = [{"model": "m", "mode": mode, "implementation": "book", "ratio_to_sdpa": float(r)}
              for mode, r in zip(("eager", "eager", "compiled", "compiled"), ratios)]  # fmt: skip
    numbers = practitioner.print_drift(rows, earlier, before)
    assert numbers["c10_sdpa_drift"] == pytest.approx(100 * abs(speeds[1] / speeds[0] - 1))
    assert numbers["c10_ratio_drift"] == pytest.approx(abs(ratios[1] - ratios[0]))
    lo, hi = sorted(ratios[2:])
    assert (numbers["c10_before_compiled_lo"], numbers["c10_before_compiled_hi"]) == (lo, hi)
    printed = capsys.readouterr().out
    assert f"{lo:.2f}–{hi:.2f} of SDPA's pace" in printed
    assert f"{numbers['c10_sdpa_drift']:.0f} %" in printed
    assert max(map(len, printed.splitlines())) <= 88


def test_compile_slowed_sdpa_matches_loop_and_model():
    """Only SDPA's own eager and compiled rows of one loop and model are compared; the book's
    rows and a setting without its eager twin are left out."""
    rng = np.random.default_rng()
    eager = rng.uniform(50, 100, size=3)
    slow = rng.uniform(0.05, 0.3)
    rows = []
    for (loop, model), speed, change in zip(
        (("nanoGPT", "small"), ("Hugging Face", "small"), ("nanoGPT", "big")),
        eager,
        (1 - slow, 1.2, 1.1),
    ):
        for mode, rate in (("eager", speed), ("compiled", speed * change)):
            rows.append({"loop": loop, "model": model, "mode": mode, "implementation": "sdpa",
                         "steps_per_s": float(rate)})  # fmt: skip
            rows.append({"loop": loop, "model": model, "mode": mode, "steps_per_s": 1.0,
                         "implementation": "book, δ from dP∘P"})  # fmt: skip
    rows.append({"loop": "nanoGPT", "model": "lone", "mode": "compiled", "implementation": "sdpa",
                 "steps_per_s": 1.0})  # fmt: skip
    numbers = practitioner.compile_slowed_sdpa(rows)
    assert numbers["c10_sdpa_slower"] == 1 and numbers["c10_sdpa_settings"] == 3
    assert numbers["c10_sdpa_slower_lo"] == pytest.approx(100 * slow)
    assert numbers["c10_sdpa_slower_hi"] == pytest.approx(100 * slow)
    assert numbers["c10_sdpa_slower_models"] == "small"
