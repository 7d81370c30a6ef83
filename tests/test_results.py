"""Stored GPU measurements as a chapter prints them (kernels.results)."""

from __future__ import annotations

from kernels import results


def test_describe_leaves_out_where_the_machine_wrote_its_files():
    """A stored record's command is printed on the page without its output folder."""
    record = results.load("golden_tiles")
    assert "--out" in record["provenance"]["command"]
    text = results.describe(record)
    assert "python -m kernels.golden.gpu`" in text and "/root" not in text
