"""The GPU script's logic at tiny sizes on the CPU (``--small``), and the chapter's
stored-result path on the files it writes (a temporary folder, never results/)."""

import json

import matplotlib
import pytest

import kernels  # noqa: F401
from kernels.golden import gpu, report

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden_results")
    gpu.main(["--small", "--out", str(out)])
    return out


def test_every_stage_writes_a_file_with_provenance(written):
    for stage in gpu.STAGES:
        record = json.loads((written / f"golden_{stage}.json").read_text())
        assert (
            record["provenance"]["command"]
            == f"python -m kernels.golden.gpu --small --out {written}"
        )
        assert record["data"]["small"] is True
    precision = json.loads((written / "golden_precision.json").read_text())["data"]
    impls = {r["impl"] for r in precision["records"]}
    assert {"baseline", "fa2", "paper", "fa1", "ideal", "triton"} <= impls
    training = json.loads((written / "golden_training.json").read_text())["data"]
    assert set(training) >= {"golden", "failure"}
    assert training["failure"]["pairs"][0]["label"] == "failing path vs its control"


def test_the_chapter_plots_the_stored_files(written, capsys):
    import matplotlib.pyplot as plt

    for stage in report.STAGE_FILES:
        assert getattr(report, f"show_stored_{stage}")(written) is True
        assert plt.get_fignums(), f"{stage}: nothing drawn"
        plt.close("all")
    out = capsys.readouterr().out
    assert "stored:" in out and "No stored GPU measurement" not in out


def test_the_chapter_says_when_nothing_is_stored(tmp_path, capsys):
    for stage in report.STAGE_FILES:
        assert getattr(report, f"show_stored_{stage}")(tmp_path) is False
    assert capsys.readouterr().out.count("python -m kernels.golden.gpu") == len(report.STAGE_FILES)


def test_one_stage_only(tmp_path):
    gpu.main(["--small", "--out", str(tmp_path), "--only", "tiles"])
    assert [p.name for p in tmp_path.iterdir()] == ["golden_tiles.json"]
