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

An exercise is **keyed by its** ``:label:`` (``ch2-rowmax``): its points (:data:`POINTS`), the
rule of what its answer may not use (:data:`kernels.exercise_rules.FORBIDDEN`), its nbgrader cells
(``ex2_ch2-rowmax-answer``) and the grader's tables all use the label, so inserting an exercise
moves nothing else. Its **number** ("Exercise 2.2") is for display only, derived from its
position: per chapter, in the order of the ``{exercise}`` directives, the chapter number being
the notebook's two-digit prefix. The website uses the same rule
(``book/_ext/exercise_numbers.py``).
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
LABEL = re.compile(r"[A-Za-z][A-Za-z0-9-]*")  # a label, as it goes into nbgrader's ids
ROLES = ("exercise-setup", "answer", "check", "hidden-check", "explain")
REMOVE_TAG = "remove-from-student"
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"

# points per exercise, keyed by the exercise's ``:label:`` (never by its number, which moves when
# an exercise is inserted before it): what it takes, not how many checks it has (the Triton
# kernel of "A row maximum in Triton" is worth five times the unit conversion of "Tokens
# against time"). tests/course_lab/test_exercise_keys.py checks that every label here is an
# exercise of the book and every exercise of the book is here.
POINTS = {
    # 1 BF16 from the bits up
    "ex-bf16-count": 1,
    "ex-bf16-round-bits": 3,
    "ex-bf16-which-up": 2,
    # 2 Triton in one sitting
    "ch2-grid": 2,
    "ch2-rowmax": 5,
    # 3 FlashAttention: the forward pass
    "ch3-merge": 4,
    "ch3-bytes": 2,
    "ch3-causal-tiles": 2,
    # 4 The backward pass and δ
    "ch4-dk": 3,
    "ch4-which": 1,
    # 5 Where the bias comes from
    "ex-sources-mirror": 1,
    "ex-sources-midpoint": 3,
    # 6 The fixes and what they cost
    "ex-fixes-window": 2,
    "ex-fixes-delta": 2,
    "ex-fixes-offset": 3,
    # 7 A small GPT-2
    "ex-gpt2-tokens": 1,
    "ex-gpt2-ties": 2,
    "ex-gpt2-logit": 3,
    # 8 Is flash attention stable?
    "ex-golden-growths": 1,
    "ex-golden-w1": 2,
    # 9 A monitor for your own run
    "ex-monitor-cost": 2,
    "ex-monitor-ratio": 2,
    # 10 What makes attention fast
    "ch10-intensity": 2,
    "ch10-stream": 2,
    "ch10-bits": 1,
}
DEFAULT_POINTS = 2
EXPLAIN_POINTS = 1  # an explanation (a cell tagged ``explain``), graded by hand
CODE_STUB = "# your code here"
TEXT_STUB = (
    "**Your explanation** (a sentence or two, graded by hand): write it here, in place "
    "of this line."
)


def points(label: str) -> float:
    """The points the exercise labelled ``label`` (``"ch2-rowmax"``) is worth; its check and its
    held-back tests (if any) share them evenly. An exercise missing from :data:`POINTS` is worth
    :data:`DEFAULT_POINTS` (the book's tests refuse such an exercise)."""
    return float(POINTS.get(label, DEFAULT_POINTS))


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
    """One exercise of a chapter: its position, label (the key), title and its cells' indices."""

    chapter: int
    number: int  # its position in the chapter, from 1: for display only
    label: str
    title: str
    task: int  # the markdown cell with the {exercise} directive
    answer: int | None = None
    check: int | None = None
    hidden: int | None = None
    explain: int | None = None
    removed: list[int] = dataclasses.field(default_factory=list)

    @property
    def display(self) -> str:
        """The number shown to readers ("2.2"); it moves when an exercise is inserted before."""
        return f"{self.chapter}.{self.number}"

    @property
    def grade_id(self) -> str:
        """nbgrader's id stem of the exercise's cells: the chapter, then the label."""
        return grade_id(self.chapter, self.label)


def grade_id(chapter: int, label: str) -> str:
    """``ex2_ch2-rowmax``: the stem of the nbgrader ids of an exercise's cells (the chapter's
    number first, so that a submission's chapter can be read from any of its ids)."""
    return f"ex{chapter}_{label}"


def label_of(stem: str) -> str:
    """The label in a grade id stem (``ex2_ch2-rowmax`` gives ``ch2-rowmax``)."""
    return stem.split("_", 1)[1] if "_" in stem else stem


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
                        f"{Path(path).name}: exercise {found[-1].display} has two "
                        f"cells tagged {role!r}"
                    )
                setattr(found[-1], attr, i)
    for before, ex in zip(found, found[1:]):
        if before.task == ex.task:
            raise ValueError(
                f"{Path(path).name}: exercises {before.display} and {ex.display} share "
                "a cell; give each {exercise} directive a cell of its own"
            )
    labels = [ex.label for ex in found if ex.label]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        raise ValueError(f"{Path(path).name}: two exercises share the label {label!r}")
    for ex in found:
        where = f"{Path(path).name}: exercise {ex.display}"
        if not ex.label:
            raise ValueError(f"{where} has no :label:")
        if not LABEL.fullmatch(ex.label):
            raise ValueError(
                f"{where}: its label {ex.label!r} is not letters, digits and hyphens, "
                "starting with a letter"
            )
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
    title = f"### Exercise {ex.display}" + (f": {ex.title}" if ex.title else "")
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
        share = points(ex.label) / (2 if ex.hidden is not None else 1)
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
