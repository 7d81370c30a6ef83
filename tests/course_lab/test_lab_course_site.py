"""A course website without solutions: ``python -m kernels.course_lab hide-solutions`` tags the
folded solutions, answer cells and rubrics of every chapter ``remove-cell``. Chapter 1, rendered
with MyST-NB and sphinx-exercise (execution off), shows its exercises and checks but none of
its solutions; the book's own chapter shows them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from kernels.course_lab import course, notebook
from kernels.env import REPO_ROOT

pytest.importorskip("myst_nb")
pytest.importorskip("sphinx_exercise")

SOLUTIONS = (
    "Every number in",
    "n_per_binade = 2**7",
    "kept += 1",
    "rounds_away = {1, 3}",
    "Rubric",
)
KEPT = (
    "One binade",
    "Round to nearest even with integers",
    "check_binade_count",
    "check_round_bits",
)


def _render(folder, nb) -> str:
    folder.mkdir()
    notebook.write(folder / "ch.ipynb", nb)
    (folder / "conf.py").write_text(
        "extensions = ['myst_nb', 'sphinx_exercise']\nnb_execution_mode = 'off'\n"
        "myst_enable_extensions = ['dollarmath', 'amsmath']\nsuppress_warnings = ['*']\n"
    )
    (folder / "index.md").write_text("# Book\n\n```{toctree}\nch\n```\n")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(folder), str(folder / "_build")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return re.sub(r"<[^>]+>", "", (folder / "_build" / "ch.html").read_text())


def test_a_course_site_shows_the_exercises_but_no_solutions(tmp_path):
    path = REPO_ROOT / "book" / "01_bf16_bits.ipynb"
    book = _render(tmp_path / "book", notebook.load(path))
    assert all(s in book for s in SOLUTIONS[:4]) and all(k in book for k in KEPT)
    copy = tmp_path / "clone"
    copy.mkdir()
    shutil.copy(path, copy / path.name)
    assert course.hide_solutions(copy, quiet=True) == [copy / path.name]
    site = _render(tmp_path / "course", notebook.load(copy / path.name))
    assert not [s for s in SOLUTIONS if s in site]
    assert all(k in site for k in KEPT) and "the solutions are not shown" in site
    assert course.hide_solutions(copy, quiet=True) == []  # once is enough
