"""Grading submissions: every graded check in a fresh process, bad files skipped and named.

For each submitted notebook the grader finds the chapter (by its cells' nbgrader ids, or the
two-digit prefix of its file name) and, for each exercise of that chapter:

1. takes the **source** of the student's answer cell (and of any code cell the student added
   before it) from the submitted file: nothing else of the submission is used, so a deleted or
   edited check cell, or a deleted held-back test, changes nothing;
2. scans it (:func:`kernels.exercise_rules.scan`, the rule the notebook's checks use too): an
   answer that imports the grader, patches a module, calls a checks' function or a library
   call that does the exercise's work scores 0, and the feedback names the call;
3. runs it in a fresh worker process (:mod:`.isolate`) and runs the chapter's check and the
   held-back tests, from the autograder's copy of the chapter, in the grader's own process
   against it.

Exercises are keyed by their ``:label:`` (the grade ids are ``ex<chapter>_<label>-answer`` and
so on); the number ("2.2") is only shown beside it, counted from the exercise's position in the
autograder's copy of the chapter. An exercise is worth the points the autograder was built with
(``notebook.POINTS`` of its label, written into the cells' nbgrader metadata), split evenly
between its check and its held-back tests. ``grades.csv`` (one row per student and chapter) and
``exercises.csv`` (one row per student and exercise, by label and number, with the message of
the first failed check) are written by :mod:`.batch` once every worker is dead, merged with
earlier runs; ``explanations.csv`` collects the explanations that are graded by hand (cells
tagged ``explain``, rubric on the instructor page); ``feedback/<student>/chNN.md`` says what
passed and what did not.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import types
from pathlib import Path

from .. import exercise_rules as scan
from ..exercise_rules import WrongAnswer
from . import isolate, notebook
from .notebook import POINTS, points  # noqa: F401  (the weights, here too)
from .submissions import cell_grade_id, explanation


@dataclasses.dataclass
class Plan:
    """How one exercise is graded: its label (the key) and number (for display), the answer's
    variable, the check's name, and the calls (keyword arguments) it is graded with: the check's
    own, then the held-back tests'."""

    label: str
    number: str
    grade_id: str
    variable: str
    check: str
    parts: list
    points: float
    explain: bool = False


@dataclasses.dataclass
class Result:
    label: str  # the exercise's ``:label:``, its key
    number: str  # "2.2", for display
    score: float
    max_score: float
    passed: list
    message: str = ""
    explanation: str | None = None  # the text of the explanation cell, graded by hand


def _ex_call(text: str, where: str):
    """(check name, variable, keyword arguments) of the one ``ex.check_x(variable, ...)`` call in
    a check cell's code."""
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "ex"
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            return node.func.attr, node.args[0].id, kwargs
    raise ValueError(f"{where}: no call ex.check_...(answer) in the check cell")


def _built_points(nb: dict, grade_id: str, label: str) -> float:
    """The points the autograder was built with for an exercise (its check's and held-back
    tests' nbgrader points), so that a table changed since the build changes no grade; the
    table's (:func:`points` of the label) where the build wrote none."""
    parts = {f"{grade_id}-check", f"{grade_id}-hidden"}
    found = [
        c["metadata"]["nbgrader"].get("points") for c in nb["cells"] if cell_grade_id(c) in parts
    ]
    if found and all(isinstance(x, (int, float)) for x in found):
        return float(sum(found))
    return points(label)


def _hidden_code(text: str) -> str:
    start, end = text.find(notebook.BEGIN_HIDDEN), text.find(notebook.END_HIDDEN)
    return text[start + len(notebook.BEGIN_HIDDEN) : end]


def chapter_imports(cells) -> tuple[list[str], set[str]]:
    """What the chapter's code cells before its exercises import, as the student's kernel has
    it: (the import statements of other packages, to run before an answer; the names bound to
    the book's package, which answers may not use)."""
    statements, package = [], set()
    for cell in cells:
        if cell.get("cell_type") != "code" or "setup" in notebook.tags(cell):
            continue
        try:
            tree = ast.parse(notebook.source(cell))
        except SyntaxError:
            continue
        for node in tree.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            bound = {(a.asname or a.name).split(".")[0] for a in node.names}
            if any(n.split(".")[0] == "kernels" for n in names):
                package |= bound
            else:
                statements.append(ast.unparse(node))
    return statements, package


@dataclasses.dataclass
class Chapter:
    """A chapter of the autograder: its exercise setup (after the imports of its earlier
    cells), its plans, the ids of the release's cells (to tell the cells a student added), the
    checks' module, and the names an answer may not rebind or use."""

    assignment: str
    setup: str
    plans: list
    template_ids: set
    checks: types.ModuleType
    module_names: tuple
    preamble: str = ""
    package_names: tuple = ()
    locked: dict = dataclasses.field(default_factory=dict)  # grade id: the release's source
    answer_ids: dict = dataclasses.field(default_factory=dict)  # grade id: the release's cell id
    module_map: dict = dataclasses.field(default_factory=dict)  # name: the module it is bound to
    worker: dict = dataclasses.field(default_factory=dict)  # the setup as plain data (isolate)

    @classmethod
    def load(cls, source_path: Path, release_path: Path | None = None):
        """The chapter from the autograder's source notebook (its cells' nbgrader ids)."""
        nb = notebook.load(source_path)
        cells = {cell_grade_id(c): notebook.source(c) for c in nb["cells"] if cell_grade_id(c)}
        names = [gid[: -len("-answer")] for gid in cells if gid.endswith("-answer")]
        plans, chapter = [], notebook.chapter_number(source_path)
        for position, grade_id in enumerate(names, 1):
            label, number = notebook.label_of(grade_id), f"{chapter}.{position}"
            where = f"{source_path.name}: exercise {number} ({label})"
            check, variable, kwargs = _ex_call(cells[f"{grade_id}-check"], where)
            parts = [("check", kwargs)]
            if f"{grade_id}-hidden" in cells:
                hidden = _ex_call(_hidden_code(cells[f"{grade_id}-hidden"]), where)
                parts.append(("held-back tests", hidden[2]))
            plans.append(
                Plan(
                    label,
                    number,
                    grade_id,
                    variable,
                    check,
                    parts,
                    _built_points(nb, grade_id, label),
                    f"{grade_id}-explain" in cells,
                )
            )
        setup_code = cells["exercise-setup"]
        setup_at = next(
            i for i, c in enumerate(nb["cells"]) if cell_grade_id(c) == "exercise-setup"
        )
        statements, package = chapter_imports(nb["cells"][:setup_at])
        namespace = {"__name__": "__grader__"}
        exec(compile(setup_code, f"<{source_path.name} exercise setup>", "exec"), namespace)
        module_map = {
            k: v.__name__ for k, v in namespace.items() if isinstance(v, types.ModuleType)
        }
        for statement in statements:
            for node in ast.walk(ast.parse(statement)):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    module_map.update(scan.bindings(node))
        names = set(module_map)
        release = notebook.load(release_path) if release_path and release_path.is_file() else nb
        ids = {c.get("id") for c in release["cells"]}
        meta = [(c, c.get("metadata", {}).get("nbgrader", {})) for c in release["cells"]]
        locked = {m["grade_id"]: notebook.source(c) for c, m in meta if m.get("locked")}
        answer_ids = {
            m["grade_id"]: c.get("id") for c, m in meta if m.get("grade_id", "").endswith("-answer")
        }
        return cls(
            f"ch{notebook.chapter_number(source_path):02d}",
            setup_code,
            plans,
            ids,
            namespace["ex"],
            tuple(sorted(names)),
            "\n".join(statements),
            tuple(sorted(package - set(namespace))),
            locked,
            answer_ids,
            module_map,
            isolate.worker_setup(namespace),
        )


def answer_source(chapter: Chapter, nb: dict, plan: Plan) -> str | None:
    """The source of the student's answer to ``plan``: the code cells the student added since
    the previous answer cell (in order), then the answer cell; None if the answer cell is gone."""
    cells = nb.get("cells", [])
    answers = {
        cell_grade_id(c): i for i, c in enumerate(cells) if cell_grade_id(c).endswith("-answer")
    }
    at = answers.get(f"{plan.grade_id}-answer")
    if at is None and not answers:  # no nbgrader metadata at all (an app dropped it)
        wanted = chapter.answer_ids.get(f"{plan.grade_id}-answer")
        by_id = [i for i, c in enumerate(cells) if wanted and c.get("id") == wanted]
        if by_id:
            at = by_id[0]
        else:
            return _answer_by_its_check(chapter, cells, plan)
    if at is None:
        return None
    # the window: after the previous answer cell, or after the exercise setup (never the
    # chapter's own cells, even if a notebook app renamed their ids)
    marks = [i for gid, i in answers.items() if i < at]
    marks += [i for i, c in enumerate(cells[:at]) if cell_grade_id(c) == "exercise-setup"]
    start = max(marks) + 1 if marks else at
    added = [
        notebook.source(c)
        for c in cells[start:at]
        if c.get("cell_type") == "code"
        and c.get("id") not in chapter.template_ids
        and not cell_grade_id(c)
    ]
    return "\n\n".join([*added, notebook.source(cells[at])])


def _answer_by_its_check(chapter: Chapter, cells: list, plan: Plan) -> str | None:
    """The answer of a notebook without nbgrader's metadata: the code cells between the locked
    cell before it (the exercise setup, or the previous exercise's check or held-back test) and
    its own check cell, both found by their text."""
    check = chapter.locked.get(f"{plan.grade_id}-check", "").strip()
    locked = {text.strip() for text in chapter.locked.values()}
    code = [(i, notebook.source(c)) for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    at = next((i for i, text in code if check and text.strip() == check), None)
    if at is None:
        return None
    start = max([i for i, text in code if i < at and text.strip() in locked], default=at)
    window = [text for i, text in code if start < i < at and text.strip() not in locked]
    return "\n\n".join(window) if window else None


def _run_check(check, target, kwargs) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            check(target, **kwargs)
    except WrongAnswer as exc:
        return False, str(exc)
    except isolate.AnswerDied:
        raise
    except Exception as exc:  # noqa: BLE001  a broken answer
        return False, f"the check could not use the answer ({type(exc).__name__}: {exc})"
    text = out.getvalue()
    return text.startswith("correct"), text.strip().splitlines()[0] if text.strip() else ""


def grade_exercise(
    chapter: Chapter, plan: Plan, source: str | None, scanning: bool = True
) -> Result:
    """Score one answer: 0 with a note if it is missing or forbidden, else the share of
    ``plan.points`` that its checks pass, each run against the answer in a fresh process."""
    fail = Result(plan.label, plan.number, 0.0, plan.points, [False] * len(plan.parts))
    if source is None:
        fail.message = "the answer cell is missing from the notebook (deleted?): 0 points"
        return fail
    if scanning:
        try:
            scan.scan(source, plan.label, chapter.module_map, chapter.package_names)
        except scan.Forbidden as exc:
            fail.message = str(exc)
            return fail
    check = getattr(chapter.checks, plan.check)
    passed, messages = [], []
    try:
        with isolate.Answer(
            chapter.worker,
            source,
            plan.variable,
            isolate.GUARDS.get(plan.check),
            preamble=chapter.preamble,
        ) as answer:
            if answer.error is not None:
                fail.message = f"the answer cell raised {answer.error}"
                return fail
            target = answer.function if answer.function is not None else answer.value
            for label, kwargs in plan.parts:
                ok, message = _run_check(check, target, kwargs)
                passed.append(ok)
                if not ok:
                    messages.append(f"{label}: {message}")
    except isolate.AnswerDied as exc:
        passed += [False] * (len(plan.parts) - len(passed))
        messages.append(str(exc))
    except Exception as exc:  # noqa: BLE001  whatever the answer did
        passed += [False] * (len(plan.parts) - len(passed))
        messages.append(f"the answer could not be graded ({type(exc).__name__}: {exc})"[:300])
    score = plan.points * sum(passed) / len(plan.parts)
    message = messages[0] if messages else ""
    return Result(plan.label, plan.number, score, plan.points, passed, message)


def grade_notebook(chapter: Chapter, nb: dict, scanning: bool = True) -> list[Result]:
    results = []
    for plan in chapter.plans:
        result = grade_exercise(chapter, plan, answer_source(chapter, nb, plan), scanning)
        if plan.explain:
            result.explanation = explanation(nb, plan, chapter)
        results.append(result)
    return results
