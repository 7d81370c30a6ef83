"""Honest habits are scored right. An answer that opens with the imports a
student types out of habit (``import torch``, ``import numpy as np``, ``import math``), and
uses Python's ``max`` for a block size, scores full marks (the book's 54 autograded points,
every chapter); the calls that do an exercise's work are still refused."""

from __future__ import annotations

import json

import pytest
from course_lab_helpers import CHAPTERS, chapter_exercises

from kernels.course_lab import build, grade, notebook
from kernels.exercise_rules import Forbidden, scan

pytest.importorskip("nbgrader")

HABITS = (
    "import math\nimport numpy as np\nimport torch\nimport triton\nimport triton.language as tl\n\n"
)
SETUP = {
    "ex": "kernels.x.exercises",
    "torch": "torch",
    "np": "numpy",
    "math": "math",
    "triton": "triton",
    "tl": "triton.language",
}


def habits(grade_id: str, text: str) -> str:
    """A solution as a student with habits writes it: imports on top, ``max`` where natural."""
    if notebook.label_of(grade_id).startswith("ch2-rowmax"):
        text = text.replace(
            "BLOCK=triton.next_power_of_2(x.shape[1])",
            "BLOCK=max(16, triton.next_power_of_2(x.shape[1]))",
        )
        assert "max(16" in text
    return HABITS + text


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_every_solution_written_with_habits_passes_the_graders_scan(number):
    path, nb, _, found = chapter_exercises(number)
    for ex in found:
        text = habits(ex.grade_id, notebook.source(nb["cells"][ex.answer]))
        scan(text, ex.label, SETUP)


@pytest.mark.parametrize(
    "exercise, source, named",
    [
        (
            "ex-bf16-round-bits",
            "import numpy as np\ndef f(b):\n    return int(np.float32(b))",
            "import numpy",
        ),
        (
            "ex-bf16-round-bits",
            "import numpy as xx\ndef f(b):\n    return int(xx.float32(b))",
            "import numpy",
        ),
        (
            "ch2-rowmax",
            "def row_max(x):\n    return torch.tensor([max(r) for r in x.tolist()])",
            "max",
        ),
        ("ch2-rowmax", "def row_max(x):\n    return max(*x)", "max"),
        ("ch2-rowmax", "from functools import reduce\nrow_max = reduce", "import functools"),
        ("ch2-rowmax", "m = max\nrow_max = m", "max"),
        ("ch3-merge", "import numpy as torch\nmerge = None", "import ... as torch"),
        ("ch3-merge", "import math as np\nmerge = None", "import ... as np"),
        (
            "ex-golden-w1",
            "import torch\ndef w1(a, b):\n    return torch.cdist(a, b)",
            "import torch",
        ),
        (
            "ex-golden-w1",
            "from scipy.stats import wasserstein_distance as w\nw1 = w",
            "import scipy",
        ),
    ],
)
def test_the_calls_that_do_the_work_are_still_refused(exercise, source, named):
    with pytest.raises(Forbidden, match=named.replace("(", r"\(").replace("*", r"\*")):
        scan(source, exercise, SETUP)


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    build(out, quiet=True)  # every chapter: the whole lab
    return out


def test_a_student_with_honest_habits_scores_full_marks(kit, tmp_path):
    folder = tmp_path / "submissions" / "habits"
    folder.mkdir(parents=True)
    for src in sorted((kit / "course" / "source").glob("ch*/*.ipynb")):
        solutions = {}
        for cell in json.loads(src.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("solution"):
                solutions[meta["grade_id"]] = habits(meta["grade_id"], "".join(cell["source"]))
        release = kit / "course" / "release" / src.parent.name / src.name
        nb = json.loads(release.read_text())
        for cell in nb["cells"]:
            gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if gid in solutions:
                cell["source"] = solutions[gid]
        (folder / src.name).write_text(json.dumps(nb))
    rows = grade(tmp_path / "submissions", kit, quiet=True)
    assert len(rows) == len(CHAPTERS)
    for row in rows:
        assert row["score"] == row["max_score"], row
    # every exercise of the ten chapters: the book's 54 autograded points
    assert sum(r["score"] for r in rows) == sum(notebook.POINTS.values()) == 54.0
    assert sum(notebook.POINTS.values()) == 54


def test_the_class_timing_grades_a_solved_and_a_blank_student(kit):
    from kernels.course_lab import class_timing

    row = class_timing.measure(2, None, kit)
    assert (row["students"], row["full_marks"], row["zero"]) == (2, 1, 1)
    assert row["chapters"] == [f"ch{n}" for n in sorted(CHAPTERS)] and row["seconds"] > 0
    assert row["isolation"].startswith("worker:")
