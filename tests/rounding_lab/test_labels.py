"""Labelling helpers of the chapters' printed tables and figures."""

import matplotlib

from kernels.rounding_lab import fix_figures as ff, source_figures as sf

matplotlib.use("Agg")


def test_pad_counts_combining_marks_as_zero_width():
    label = "β rule, ℓ from rounded P̄"  # P + combining macron
    assert len(label) == ff.display_width(label) + 1
    padded = ff.pad(label, 30)
    assert ff.display_width(padded) == 30 and padded.startswith(label)
    assert ff.pad("ab", 5, ">") == "   ab"
    assert ff.pad("too long", 3) == "too long"


def test_chapter_names_of_the_bias_sources():
    assert sf.NAMES["triton/none"] == "book kernel"
    assert sf.NAMES["emulator/paper-untiled"] == "paper's all-BF16 path (one tile)"
    assert "FA2" not in sf.NAMES["emulator/paper-untiled"]
    assert set(sf.KERNEL_LABELS) == set(sf.NAMES)


def test_rule_scan_draws_the_prediction_in_both_panels_and_lists_it_last():
    import matplotlib.pyplot as plt

    rows = [
        {"rm": -x, "mean": 0.1, "se": 0.01, "same_as_ideal": 0.5, "wrong": 0.0}
        for x in (0.001, 0.01)
    ]
    predicted = [{"rm": r["rm"], "mean": -0.2, "same_as_ideal": 0.25} for r in rows]
    fig = ff.plot_rule_scan({"fa2/cross": rows}, "t", xscale="log", predicted=predicted)
    mean_ax, same_ax = fig.axes[:2]
    crosses = [line for line in mean_ax.lines if line.get_marker() == "x"]
    assert [list(c.get_ydata()) for c in crosses] == [[-0.2, -0.2]]
    assert [list(c.get_ydata()) for c in same_ax.lines if c.get_marker() == "x"] == [[25, 25]]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[-1].startswith("predicted") and len(labels) == 2
    plt.close(fig)


def test_largest_excess_takes_the_ideal_out_cell_by_cell():
    import numpy as np
    import pytest

    from kernels.rounding_lab import source_figures as sf

    rng = np.random.default_rng()
    cells = range(int(rng.integers(3, 9)))
    ideal = {c: float(rng.normal()) for c in cells}
    added = {c: float(rng.normal(0, 0.05)) for c in cells}
    records = [{"cell": c, "impl": "ideal", "mean": ideal[c]} for c in cells]
    records += [{"cell": c, "impl": "k", "mean": ideal[c] + added[c]} for c in cells]
    records.append({"cell": 99, "impl": "k", "mean": 50.0})  # no ideal here: left out
    assert sf.largest_excess(records, "k") == pytest.approx(max(abs(a) for a in added.values()))
    with pytest.raises(ValueError, match="no cell"):
        sf.largest_excess(records, "other")
