"""Stored GPU measurements as a chapter prints them (kernels.results)."""

from __future__ import annotations

from pathlib import Path

from kernels import results


def test_describe_leaves_out_where_the_machine_wrote_its_files():
    """A stored record's command is printed on the page without its output folder."""
    record = results.load("golden_tiles")
    assert "--out" in record["provenance"]["command"]
    text = results.describe(record)
    assert "python -m kernels.golden.gpu`" in text and "/root" not in text


def test_a_packed_record_reads_back_as_written(tmp_path):
    """``pack`` compresses a large record to .json.gz, removes the original, leaves small ones
    alone, and ``load`` and ``stored_names`` see the packed record by its name; the same text
    packs to the same bytes (no time stamp inside), so a re-pack changes nothing in git."""
    import random

    rows = [random.random() for _ in range(2_000)]  # fresh values: a lossy pack would show
    big = Path(results.save("gpt2_big", {"rows": rows}, "python -m x", directory=tmp_path))
    results.save("gpt2_small", {"rows": rows[:3]}, "python -m x", directory=tmp_path)
    text = big.read_text()
    expected = results.load("gpt2_big", tmp_path)
    assert results.pack(tmp_path, over=10_000) == ["gpt2_big"]
    assert not big.exists() and results.record_path("gpt2_big", tmp_path).name.endswith(".gz")
    assert results.load("gpt2_big", tmp_path) == expected
    assert results.load("gpt2_big", tmp_path)["data"]["rows"] == rows
    assert results.stored_names("gpt2_", tmp_path) == ["gpt2_big", "gpt2_small"]
    again = tmp_path / "again"
    again.mkdir()
    (again / "gpt2_big.json").write_text(text)
    results.pack(again, over=10_000)
    assert (again / "gpt2_big.json.gz").read_bytes() == (tmp_path / "gpt2_big.json.gz").read_bytes()


def test_a_missing_record_names_the_file_and_the_remedy(tmp_path):
    try:
        results.load("gpt2_nothing", tmp_path)
    except FileNotFoundError as error:
        assert "gpt2_nothing.json" in str(error) and "GPU script" in str(error)
    else:
        raise AssertionError("loading a record that is not there did not fail")


def test_the_stored_results_stay_small():
    """Every stored record over the pack size is compressed, so the repository stays small
    enough to clone quickly and to send to a GPU machine (64 MiB a call)."""
    stored = results.RESULTS_DIR.glob("*.json")
    large = [path.name for path in stored if path.stat().st_size > results.PACK_OVER]
    assert not large, f"run `python -m kernels.results pack`: {large}"
    total = sum(path.stat().st_size for path in results.RESULTS_DIR.iterdir())
    assert total < 40 << 20, f"results/ holds {total / 2**20:.1f} MiB"


def test_every_stored_command_names_a_module_that_exists_today():
    """The command a chapter prints under a stored result runs as printed: modules renamed since
    the record was made are given their current names (``current_command``)."""
    import importlib.util
    import re

    stems = results.stored_names("", results.RESULTS_DIR)
    assert len(stems) > 20
    missing = {}
    for stem in stems:
        command = results.load(stem)["provenance"]["command"]
        for module in re.findall(r"python -m (\S+)", results.current_command(command)):
            if importlib.util.find_spec(module) is None:
                missing[stem] = module
    assert missing == {}, f"stored commands naming modules that do not exist: {missing}"
    renamed = results.current_command("python -m kernels.lab.gpu")
    assert renamed == "python -m kernels.rounding_lab.gpu"
