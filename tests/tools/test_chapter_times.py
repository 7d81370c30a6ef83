"""The instructor page's time table comes from the stored chapter_times records."""

import importlib.util
import json

import numpy as np

from kernels.gpu import chapters
from kernels.tools.booktools import REPO_ROOT


def _record(path, gpu, date, rows):
    made = {"gpu": gpu, "date": date, "command": "python -m kernels.gpu.chapters"}
    path.write_text(json.dumps({"provenance": made, "data": {"chapters": rows}}))


def test_the_newest_clean_gpu_run_of_each_chapter_is_kept(tmp_path):
    rng = np.random.default_rng()
    old, new, failed = (float(round(x, 1)) for x in rng.uniform(1, 170, 3))
    _record(tmp_path / "chapter_times_a.json", "GPU one", "2026-01-01T00:00:00",
            [{"chapter": "01_x.ipynb", "status": "ran", "seconds": old},
             {"chapter": "02_y.ipynb", "status": "ran", "seconds": old}])  # fmt: skip
    _record(tmp_path / "chapter_times_b.json", "GPU two", "2026-02-01T00:00:00",
            [{"chapter": "01_x.ipynb", "status": "ran", "seconds": new},
             {"chapter": "02_y.ipynb", "status": "failed", "seconds": failed}])  # fmt: skip
    _record(tmp_path / "chapter_times_cpu.json", None, "2026-03-01T00:00:00",
            [{"chapter": "01_x.ipynb", "status": "ran", "seconds": failed}])  # fmt: skip
    rows = {r["chapter"]: r for r in chapters.stored_times(tmp_path)}
    assert rows["01_x.ipynb"]["seconds"] == new and rows["01_x.ipynb"]["gpu"] == "GPU two"
    assert rows["02_y.ipynb"]["seconds"] == old and rows["02_y.ipynb"]["gpu"] == "GPU one"


def test_the_directive_has_one_row_per_stored_chapter_with_its_gpu():
    spec = importlib.util.spec_from_file_location(
        "chapter_times", REPO_ROOT / "book" / "_ext" / "chapter_times.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.table_rows()
    stored = chapters.stored_times()
    assert len(rows) == len(stored) >= 10
    for (title, seconds, gpu, day), record in zip(rows, stored):
        assert title == chapters.chapter_title(record["chapter"]) and not title.endswith(".ipynb")
        assert float(seconds) == round(record["seconds"]) and gpu == record["gpu"]
        assert day == record["date"][:10]
