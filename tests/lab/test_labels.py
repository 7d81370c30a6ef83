"""Labelling helpers of the chapters' printed tables and figures."""

from kernels.lab import fix_figures as ff, source_figures as sf


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
