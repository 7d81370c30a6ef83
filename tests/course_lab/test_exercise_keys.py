"""Exercises are keyed by their ``:label:``, not by their number: the points table, the rules of
what an answer may not use, the wrong answers the tests try and the grader's ids all name labels
that exist in the chapters, every exercise of the chapters has its entries, and inserting an
exercise moves no other exercise's points, rule or grade id (only the displayed numbers)."""

from __future__ import annotations

import copy
import re

from course_lab_helpers import CHAPTERS, chapter_exercises, labels
from test_lab_exercises import WRONG

from kernels import exercise_rules
from kernels.course_lab import course, grading, notebook
from kernels.env import REPO_ROOT


def _book_labels() -> list[str]:
    return [ex.label for number in sorted(CHAPTERS) for ex in chapter_exercises(number)[3]]


def test_labels_are_unique_across_the_book():
    found = _book_labels()
    assert len(found) == len(set(found)) == len(labels())
    assert all(notebook.LABEL.fullmatch(label) for label in found)


def test_every_key_names_an_exercise_and_every_exercise_has_its_entries():
    book = set(_book_labels())
    for table, name in (
        (notebook.POINTS, "notebook.POINTS"),
        (WRONG, "test_lab_exercises.WRONG"),
        (exercise_rules.FORBIDDEN, "exercise_rules.FORBIDDEN"),
    ):
        unknown = sorted(set(table) - book)
        assert not unknown, f"{name} names labels that no chapter has: {unknown}"
    for table, name in ((notebook.POINTS, "notebook.POINTS"), (WRONG, "WRONG")):
        missing = sorted(book - set(table))
        assert not missing, f"exercises without an entry in {name}: {missing}"


def test_the_checks_forbid_by_label():
    """Every ``forbid(fn, key)`` in the checks' modules names a label of the book."""
    book = set(_book_labels())
    sources = [*REPO_ROOT.glob("kernels/*/exercises.py"), REPO_ROOT / "kernels/triton_exercises.py"]
    keys = {
        key for path in sources for key in re.findall(r'forbid\(fn, "([^"]+)"\)', path.read_text())
    }
    assert keys and keys <= book, sorted(keys - book)


def test_the_checks_cite_exercises_by_label_not_number():
    """A number in a docstring or comment goes stale when an exercise is inserted before it."""
    paths = [
        *REPO_ROOT.glob("kernels/*/exercises.py"),
        REPO_ROOT / "kernels/triton_exercises.py",
        REPO_ROOT / "kernels/reduction_guard.py",
        REPO_ROOT / "kernels/exercise_rules.py",
        *REPO_ROOT.glob("kernels/course_lab/*.py"),
    ]
    for path in paths:
        for line in path.read_text().splitlines():
            # a quoted example of a displayed number ("Exercise 2.2") is fine
            assert not re.search(r"[Ee]xercises? \d+\.\d+(?![\"\d])", line), f"{path}: {line}"


def _insert_exercise(nb: dict, path) -> dict:
    """Chapter 2 with a new exercise inserted before its first one."""
    nb = copy.deepcopy(nb)
    _, found = notebook.exercises(nb, path)
    new = [
        {
            "cell_type": "markdown",
            "metadata": {},
            "source": "```{exercise} A new first exercise\n:label: ex-inserted\n\nDo it.\n```",
        },
        {
            "cell_type": "code",
            "metadata": {"tags": ["answer"]},
            "execution_count": None,
            "outputs": [],
            "source": "### BEGIN SOLUTION\ninserted = None\n### END SOLUTION",
        },
        {
            "cell_type": "code",
            "metadata": {"tags": ["check"]},
            "execution_count": None,
            "outputs": [],
            "source": "ex.check_launch_grid(inserted)",
        },
    ]
    at = found[0].task
    nb["cells"][at:at] = new
    return nb


def _points_by_label(src: dict) -> dict:
    out = {}
    for cell in src["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        gid = meta.get("grade_id", "")
        if meta.get("grade") and gid.rsplit("-", 1)[-1] in ("check", "hidden"):
            label = notebook.label_of(gid.rsplit("-", 1)[0])
            out[label] = out.get(label, 0) + meta["points"]
    return out


def test_inserting_an_exercise_moves_no_other_exercises_points(tmp_path):
    path, nb, _, before = chapter_exercises("02")
    grown = _insert_exercise(nb, path)
    _, after = notebook.exercises(grown, path)
    assert [ex.label for ex in after] == ["ex-inserted", *(ex.label for ex in before)]
    # the displayed numbers move ...
    assert [ex.display for ex in after] == ["2.1", "2.2", "2.3"]
    # ... the keys do not: same grade ids, same points, in the source notebook and the grader
    setup = course.student_setup("https://example.org/b", "v1")
    old, new = notebook.student_source(nb, path, setup), notebook.student_source(grown, path, setup)
    old_points, new_points = _points_by_label(old), _points_by_label(new)
    assert old_points == {ex.label: notebook.points(ex.label) for ex in before}
    assert {k: new_points[k] for k in old_points} == old_points
    assert new_points["ex-inserted"] == notebook.DEFAULT_POINTS
    plans = {}
    for name, src in (("old", old), ("new", new)):
        target = tmp_path / name / path.name
        target.parent.mkdir()
        notebook.write(target, src)
        plans[name] = {p.label: p for p in grading.Chapter.load(target).plans}
    for ex in before:
        was, now = plans["old"][ex.label], plans["new"][ex.label]
        assert (was.grade_id, was.check, was.points) == (now.grade_id, now.check, now.points)
        assert now.points == notebook.points(ex.label)
    assert plans["new"]["ch2-rowmax"].number == "2.3" and plans["old"]["ch2-rowmax"].number == "2.2"
    # and the rule of what an answer may not use stays with its exercise
    assert (
        "ch2-rowmax" in exercise_rules.FORBIDDEN and "ex-inserted" not in exercise_rules.FORBIDDEN
    )


def test_a_duplicate_or_malformed_label_is_refused():
    path, nb, _, found = chapter_exercises("02")
    for label, message in ((found[0].label, "share the label"), ("2.2", "not letters")):
        broken = copy.deepcopy(nb)
        cell = broken["cells"][found[1].task]
        cell["source"] = notebook.source(cell).replace(
            f":label: {found[1].label}", f":label: {label}"
        )
        try:
            notebook.exercises(broken, path)
        except ValueError as err:
            assert message in str(err)
        else:
            raise AssertionError(f"label {label!r} was accepted")
