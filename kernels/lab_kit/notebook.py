"""Reading a chapter's exercise section, and turning the chapter into an nbgrader source notebook.

A chapter marks its exercise cells with tags; nothing else is needed to make a lab of it:

``exercise-setup``       the imports of the exercise section (locked in the lab version)
``answer``               the answer cell: the reference solution between ``### BEGIN SOLUTION``
                         and ``### END SOLUTION`` (nbgrader's markers), blank in the lab version
``check``                the check the student runs (autograded, 1 point)
``hidden-check``         tests held back for grading between ``### BEGIN HIDDEN TESTS`` and
                         ``### END HIDDEN TESTS`` (autograded, 1 point; removed from the site
                         with ``remove-cell``)
``explain``              a markdown cell for the reader's explanation, graded by hand
                         (:data:`EXPLAIN_POINTS`); in the book it holds the rubric and is
                         removed from the site with ``remove-cell``; blank in the lab version
``remove-from-student``  the folded solution's prose, its fences and demonstration cells

Exercises are numbered per chapter ("Exercise 2.1"), in the order of their ``{exercise}``
directives; the chapter number is the notebook's two-digit prefix. The website uses the same
rule (``book/_ext/exercise_numbers.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

from . import text as text_module

DIRECTIVE = re.compile(r"```\{exercise\}(?P<title>[^\n]*)\n(?P<body>.*?)\n```", re.S)
OPTION = re.compile(r"^:(\w+):\s*(.*)$")
ROLES = ("exercise-setup", "answer", "check", "hidden-check", "explain")
REMOVE_TAG = "remove-from-student"
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

# points per exercise: what it takes, not how many checks it has (the Triton kernel of 2.2 is
# worth five times the unit conversion of 7.1)
POINTS = {
    "1.1": 1,
    "1.2": 3,
    "1.3": 2,
    "2.1": 2,
    "2.2": 5,
    "3.1": 4,
    "3.2": 2,
    "3.3": 2,
    "4.1": 3,
    "4.2": 1,
    "5.1": 1,
    "5.2": 3,
    "6.1": 2,
    "6.2": 2,
    "6.3": 3,
    "7.1": 1,
    "7.2": 2,
    "7.3": 3,
    "8.1": 1,
    "8.2": 2,
    "9.1": 2,
    "9.2": 2,
    "10.1": 2,
    "10.2": 2,
    "10.3": 1,
}
DEFAULT_POINTS = 2
EXPLAIN_POINTS = 1  # an explanation (a cell tagged ``explain``), graded by hand
CODE_STUB = "# your code here"
TEXT_STUB = (
    "**Your explanation** (a sentence or two, graded by hand): write it here, in place "
    "of this line."
)


def points(name: str) -> float:
    """The points exercise ``name`` ("2.2") is worth; its check and its held-back tests (if
    any) share them evenly."""
    return float(POINTS.get(name, DEFAULT_POINTS))


def source(cell) -> str:
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def chapter_number(path) -> int:
    """1 for ``01_bf16_bits.ipynb``: the two-digit prefix of the file name."""
    match = re.match(r"(\d\d)_", Path(path).name)
    if not match:
        raise ValueError(
            f"{Path(path).name}: a chapter's file name starts with two digits "
            "and an underscore, such as 01_bf16_bits.ipynb"
        )
    return int(match.group(1))


@dataclasses.dataclass
class Exercise:
    """One exercise of a chapter: its number, label, title and the indices of its cells."""

    chapter: int
    number: int
    label: str
    title: str
    task: int  # the markdown cell with the {exercise} directive
    answer: int | None = None
    check: int | None = None
    hidden: int | None = None
    explain: int | None = None
    removed: list[int] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.chapter}.{self.number}"

    @property
    def grade_id(self) -> str:
        return f"ex{self.chapter}_{self.number}"


def exercises(nb: dict, path) -> tuple[int | None, list[Exercise]]:
    """(index of the ``exercise-setup`` cell, the chapter's exercises in order).

    Raises ValueError naming the chapter and exercise when a cell is missing or out of place."""
    chapter = chapter_number(path)
    setup, found = None, []
    for i, cell in enumerate(nb["cells"]):
        t, text = tags(cell), source(cell)
        if cell["cell_type"] == "markdown":
            for match in DIRECTIVE.finditer(text):
                options = dict(
                    m.groups() for m in map(OPTION.match, match["body"].splitlines()) if m
                )
                found.append(
                    Exercise(
                        chapter, len(found) + 1, options.get("label", ""), match["title"].strip(), i
                    )
                )
        if "exercise-setup" in t:
            setup = i
        if REMOVE_TAG in t and found:
            found[-1].removed.append(i)
        for role, attr in (
            ("answer", "answer"),
            ("check", "check"),
            ("hidden-check", "hidden"),
            ("explain", "explain"),
        ):
            if role in t:
                if not found:
                    raise ValueError(
                        f"{Path(path).name}: cell {i} is tagged {role!r} before "
                        "any {exercise} directive"
                    )
                if getattr(found[-1], attr) is not None:
                    raise ValueError(
                        f"{Path(path).name}: exercise {found[-1].name} has two "
                        f"cells tagged {role!r}"
                    )
                setattr(found[-1], attr, i)
    for before, ex in zip(found, found[1:]):
        if before.task == ex.task:
            raise ValueError(
                f"{Path(path).name}: exercises {before.name} and {ex.name} share "
                "a cell; give each {exercise} directive a cell of its own"
            )
    for ex in found:
        where = f"{Path(path).name}: exercise {ex.name}"
        if not ex.label:
            raise ValueError(f"{where} has no :label:")
        if ex.answer is None or ex.check is None:
            raise ValueError(f"{where} needs a cell tagged 'answer' and one tagged 'check'")
        if not ex.task < ex.answer < ex.check:
            raise ValueError(
                f"{where}: the answer cell must follow the exercise and precede its check"
            )
        answer = source(nb["cells"][ex.answer])
        if BEGIN_SOLUTION not in answer or END_SOLUTION not in answer:
            raise ValueError(
                f"{where}: the answer cell marks its solution with "
                f"{BEGIN_SOLUTION!r} and {END_SOLUTION!r}"
            )
        if ex.explain is not None and (
            nb["cells"][ex.explain]["cell_type"] != "markdown" or not ex.answer < ex.explain
        ):
            raise ValueError(
                f"{where}: the cell tagged 'explain' is a markdown cell after the answer cell"
            )
        if ex.hidden is not None:
            hidden = source(nb["cells"][ex.hidden])
            if BEGIN_HIDDEN not in hidden or END_HIDDEN not in hidden:
                raise ValueError(
                    f"{where}: the hidden-check cell marks its tests with "
                    f"{BEGIN_HIDDEN!r} and {END_HIDDEN!r}"
                )
    if found and setup is None:
        raise ValueError(
            f"{Path(path).name}: the exercise section needs a cell tagged "
            "'exercise-setup' (its imports)"
        )
    if found and setup > found[0].task:
        raise ValueError(
            f"{Path(path).name}: the 'exercise-setup' cell must come before the first exercise"
        )
    return setup, found


def in_lab_format(nb: dict) -> bool:
    """True if the notebook tags its exercise cells for the lab (any cell tagged with a role)."""
    return any(set(ROLES) & set(tags(c)) for c in nb["cells"])


def clear_solution(text: str, stub: str = "# your code here") -> str:
    """``text`` with every solution region replaced by ``stub`` (what nbgrader does; used by the
    tests to make a blank answer without running nbgrader)."""
    out, inside = [], False
    for line in text.split("\n"):
        if BEGIN_SOLUTION in line:
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + s for s in stub.split("\n"))
        elif END_SOLUTION in line:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def _nbgrader(grade_id: str, *, solution=False, grade=False, locked=False, points=None) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": 3,
        "solution": solution,
        "task": False,
    }
    if grade:
        meta["points"] = points
    return meta


def _heading(ex: Exercise, body: str) -> str:
    """The {exercise} directive as plain Markdown, numbered: Jupyter and Colab do not run MyST."""
    lines = [line for line in body.splitlines() if not OPTION.match(line)]
    title = f"### Exercise {ex.name}" + (f": {ex.title}" if ex.title else "")
    return title + "\n\n" + "\n".join(lines).strip("\n")


def student_source(nb: dict, path, setup_cell: str) -> dict:
    """The nbgrader *source* notebook of a chapter: the chapter itself with nbgrader's metadata
    derived from the tags, the lab's setup cell, and numbered exercise headings.

    Nothing is removed here: nbgrader (``generate_assignment``) blanks the answers and holds
    back the hidden tests, and nbconvert's ``TagRemovePreprocessor`` drops the cells tagged
    ``remove-from-student``, when the student version is made from this notebook."""
    out = copy.deepcopy(nb)
    cells = out["cells"]
    for cell in cells:
        cell.setdefault("metadata", {})
        if isinstance(cell["source"], list):
            cell["source"] = "".join(cell["source"])
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    first_code = next(c for c in cells if c["cell_type"] == "code")
    if "setup" not in tags(first_code):
        raise ValueError(f"{Path(path).name}: the first code cell is not the setup cell")
    first_code["source"] = setup_cell
    first_code["metadata"]["nbgrader"] = _nbgrader("setup", locked=True)
    setup, found = exercises(out, path)
    if setup is not None:
        cells[setup]["metadata"]["nbgrader"] = _nbgrader("exercise-setup", locked=True)
    tasks = {ex.task for ex in found}
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            cell["source"] = text_module.for_students(cell["source"], exercise=i in tasks)
    for ex in found:
        task = cells[ex.task]
        task["source"] = DIRECTIVE.sub(lambda m: _heading(ex, m["body"]), task["source"], count=1)
        cells[ex.answer]["metadata"]["nbgrader"] = _nbgrader(f"{ex.grade_id}-answer", solution=True)
        share = points(ex.name) / (2 if ex.hidden is not None else 1)
        cells[ex.check]["metadata"]["nbgrader"] = _nbgrader(
            f"{ex.grade_id}-check", grade=True, locked=True, points=share
        )
        if ex.hidden is not None:
            cells[ex.hidden]["metadata"]["nbgrader"] = _nbgrader(
                f"{ex.grade_id}-hidden", grade=True, locked=True, points=share
            )
        if ex.explain is not None:
            cells[ex.explain]["metadata"]["nbgrader"] = _nbgrader(
                f"{ex.grade_id}-explain", solution=True, grade=True, points=EXPLAIN_POINTS
            )
    return out


def load(path) -> dict:
    return json.loads(Path(path).read_text())


def write(path, nb: dict) -> None:
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


COURSE_INTRO = (
    "In this course's version of the book the solutions are not shown: write your "
    "answers in the lab notebooks."
)


def without_solutions(nb: dict) -> dict:
    """The chapter for a course website without solutions: every cell tagged
    ``remove-from-student``, ``answer`` or ``explain`` also gets ``remove-cell``, so MyST-NB
    leaves it off the page while the notebook still executes (each check still prints
    ``correct``); the Exercises intro no longer speaks of folded solutions."""
    out = copy.deepcopy(nb)
    for cell in out["cells"]:
        cell_tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if {REMOVE_TAG, "answer", "explain"} & set(cell_tags) and "remove-cell" not in cell_tags:
            cell_tags.append("remove-cell")
        if cell["cell_type"] == "markdown":
            text = source(cell)
            changed = text_module.BOOK_INTRO.sub(COURSE_INTRO, text)
            if changed != text:
                cell["source"] = changed
    return out
