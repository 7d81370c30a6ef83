"""The lab as an nbgrader course: build the student notebooks and the autograder, grade.

``build`` writes, under ``_build/lab/`` (git-ignored, regenerated on every build):

* ``course/``   an nbgrader course directory: ``nbgrader_config.py``, ``source/chNN/`` (the
  chapter with nbgrader's metadata: solutions and hidden tests in place), ``release/chNN/``
  (the student version made by ``nbgrader generate_assignment``) and ``gradebook.db`` (holds
  the hidden tests and the points). Together these are the autograder.
* ``student/``  the student notebooks, one per chapter, ready to hand out.

``grade`` (:mod:`.grading`) takes the answer cells' source from each submitted notebook, runs
every answer in a fresh process of its own and the chapter's checks and held-back tests, from
the autograder's copy of the chapter, against it; it writes ``grades.csv``, ``exercises.csv``
and a feedback page per student and chapter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..env import REPO_ROOT
from ..tools import booktools
from . import batch, grading, notebook

DEFAULT_OUT = REPO_ROOT / "_build" / "lab"
COURSE_ID = "lowprec-flash-attention-lab"
CODE_STUB, TEXT_STUB = notebook.CODE_STUB, notebook.TEXT_STUB

CONFIG = """\
# Made by `python -m kernels.course_lab build`; regenerated on every build, do not edit.
from nbconvert.preprocessors import TagRemovePreprocessor
from nbgrader.converters.generate_assignment import GenerateAssignment

c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
# the book's answer cells mark their solutions with nbgrader's default delimiters
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
# an explanation cell (graded by hand) holds the rubric in the book: the student sees a prompt
c.ClearSolutions.text_stub = {text_stub!r}
# the folded solution's prose and demonstrations leave with nbconvert's tag remover
c.TagRemovePreprocessor.enabled = True
c.TagRemovePreprocessor.remove_cell_tags = {{"remove-from-student"}}
c.GenerateAssignment.preprocessors = [TagRemovePreprocessor,
                                      *GenerateAssignment.preprocessors.default()]
c.IncludeHeaderFooter.header = "header.ipynb"
# chapters run whole when graded; the GPT-2 chapter trains a small model (about a minute on CPU)
c.Execute.timeout = 1800
"""

HEADER = """\
**Lab version** of a chapter of *Why low-precision flash attention fails*, made by
`python -m kernels.course_lab build` from the book's notebook{commit}.
The answer cells under the exercises are blank: write your answer there, then run the check
cell below it, which says what is wrong until the answer is right. When your notebook is
graded, only your answer cells (with any code cells you add above them) are read: each answer
runs on its own, in a fresh Python process, against the checks and further tests held back for
grading, on fresh random inputs. So an answer must stand on its own; it may use the checks'
module `ex` only for its upper-case constants, and patching anything scores 0."""


def repo_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def student_setup(url: str, ref: str) -> str:
    """The first code cell of every student notebook."""
    return f'''# Setup of the lab version (made by python -m kernels.course_lab build).
# Finds the book's package `kernels` in a folder above this notebook (a clone of the book),
# or installed; otherwise (Colab, a bare copy) clones the book and installs its package with
# pip --no-deps, so the torch and Triton already installed are never replaced.
import importlib.util, pathlib, subprocess, sys
REPO_URL, REF = "{url}", "{ref}"
here = pathlib.Path.cwd().resolve()
clone = next((p for p in (here, *here.parents) if (p / "kernels" / "__init__.py").is_file()),
             None)
if clone is None and importlib.util.find_spec("kernels") is None:
    clone = pathlib.Path.home() / "book-src"
    if not clone.is_dir():
        subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", REF, REPO_URL,
                        str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e",
                    str(clone)], check=False)
if clone is not None:
    sys.path.insert(0, str(clone))
import kernels
ENV = kernels.setup(seed=0)  # prints what this notebook runs on (GPU or CPU) and how'''


def _header_notebook(commit: str) -> dict:
    text = HEADER.format(commit=f" (commit {commit})" if commit else "")
    return {
        "cells": [{"cell_type": "markdown", "id": "lab-header", "metadata": {}, "source": text}],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def assignment(path) -> str:
    return f"ch{notebook.chapter_number(path):02d}"


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    """Run an nbgrader command in the course directory, with the book's package importable."""
    env = dict(os.environ)
    # nbgrader runs tools of its own (alembic, for the gradebook) found on PATH: the ones next
    # to this Python come first, so a virtual environment need not be activated
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 or "Exception while loading config" in result.stderr:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def _chapters(chapters) -> list[Path]:
    everything = booktools.chapters()
    if not chapters:
        return everything
    wanted = {f"{int(c):02d}" for c in chapters}
    picked = [p for p in everything if p.name[:2] in wanted]
    missing = wanted - {p.name[:2] for p in picked}
    if missing:
        raise ValueError(
            f"no chapter {sorted(missing)} in book/; the chapters are "
            f"{[p.name[:2] for p in everything]}"
        )
    return picked


def build(
    out=DEFAULT_OUT, chapters=None, ref: str | None = None, force: bool = False, quiet: bool = False
) -> Path:
    """Make the student notebooks and the autograder for ``chapters`` (default: every chapter
    with exercises) under ``out``. ``ref``: the branch or tag of the book that the student
    notebooks clone on Colab (default: the branch in _config.yml). Refuses to overwrite a
    course that holds graded submissions unless ``force``."""
    out = Path(out).resolve()
    course, student = out / "course", out / "student"
    if (course / "autograded").is_dir() and any((course / "autograded").iterdir()) and not force:
        raise FileExistsError(
            f"{course} holds graded submissions; pass --force to rebuild "
            "(the gradebook is made anew) or choose another --out"
        )
    for stale in (course, student):
        shutil.rmtree(stale, ignore_errors=True)
    (course / "source").mkdir(parents=True)
    student.mkdir(parents=True)
    url, branch = booktools.repository()
    setup = student_setup(url, ref or branch)
    course.joinpath("nbgrader_config.py").write_text(
        CONFIG.format(root=str(course), course_id=COURSE_ID, stub=CODE_STUB, text_stub=TEXT_STUB)
    )
    commit = repo_commit()
    notebook.write(course / "header.ipynb", _header_notebook(commit))
    built = []
    for path in _chapters(chapters):
        nb = notebook.load(path)
        if not notebook.in_lab_format(nb):
            if not quiet:
                print(
                    f"{path.name}: no cells tagged for the lab ({', '.join(notebook.ROLES)}): "
                    "skipped"
                )
            continue
        _, found = notebook.exercises(nb, path)
        name = assignment(path)
        target = course / "source" / name / path.name
        target.parent.mkdir(parents=True)
        notebook.write(target, notebook.student_source(nb, path, setup))
        _nbgrader(course, "generate_assignment", name, "--force")
        released = course / "release" / name / path.name
        shutil.copy2(released, student / path.name)
        built.append(
            (
                path.name,
                len(found),
                sum(grading.points(e.label) for e in found),
                notebook.EXPLAIN_POINTS * sum(e.explain is not None for e in found),
            )
        )
    (out / "README.md").write_text(_readme(built, commit))
    if not quiet:
        for name, n_ex, points, by_hand in built:
            print(f"{name}: {n_ex} exercises, {points:g} points autograded, {by_hand:g} by hand")
        print(f"student notebooks: {student}\nautograder (nbgrader course): {course}")
    return out


def _readme(built, commit: str) -> str:
    rows = "\n".join(f"| {name} | {n} | {p:g} | {h:g} |" for name, n, p, h in built)
    made = f" at commit {commit}" if commit else ""
    return f"""# The lab kit (generated; do not edit, do not commit)

Made by `python -m kernels.course_lab build` from the book's chapters{made}.

* `student/`: the notebooks to hand out (answers blank, checks kept, hidden tests held back).
* `course/`: the autograder, an nbgrader course directory (`source/` holds the solutions,
  `gradebook.db` the hidden tests and points).

Grade a folder of submissions (`<folder>/<student>/<chapter notebook>.ipynb`) with
`python -m kernels.course_lab grade <folder>`; it writes `grades.csv`, `exercises.csv`,
`explanations.csv` (to grade by hand) and `feedback/` here.

| notebook | exercises | points autograded | points graded by hand |
|---|---|---|---|
{rows}
"""


def grade(submissions, out=DEFAULT_OUT, quiet: bool = False) -> list[dict]:
    """Grade every notebook under ``submissions/<student>/`` (see :mod:`.grading`); returns one
    row per (student, chapter) with the score and the maximum, as written to ``grades.csv``."""
    return batch.grade(submissions, out, quiet=quiet)


def hide_solutions(book=REPO_ROOT / "book", quiet: bool = False) -> list[Path]:
    """Edit the chapters in ``book`` in place for a course website without solutions
    (:func:`notebook.without_solutions`); run it in a clone made for the course, then build the
    site there. Returns the chapters changed."""
    changed = []
    for path in sorted(Path(book).glob("[0-9][0-9]_*.ipynb")):
        nb = notebook.load(path)
        if not notebook.in_lab_format(nb):
            continue
        new = notebook.without_solutions(nb)
        if new != nb:
            notebook.write(path, new)
            changed.append(path)
    if not quiet:
        print(
            f"{len(changed)} chapters now hide their solutions; build the site with "
            "jupyter-book build ."
        )
    return changed
