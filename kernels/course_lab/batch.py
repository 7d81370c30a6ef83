"""Grading a folder of submissions: what is found, what is graded, what is merged.

* **Found**: every ``*.ipynb`` under a student's folder, nested folders included (an LMS
  export's ``alice/submission/03.ipynb``); ``.ipynb_checkpoints`` and hidden folders are
  ignored. All of a student's files are read into memory **before** any of their code runs.
* **Robust**: a file that cannot be read, is no notebook, or breaks the grader (a cell whose
  ``"metadata"`` is ``null`` is repaired first) is skipped, naming the student and the file;
  the other files and students are graded.
* **Which chapter**: by the notebook's nbgrader ids or the text of its locked cells. A file
  *named* like a chapter that holds none of that chapter's exercise cells is skipped, with the
  reason ("named like chapter 3, but none of its exercise cells are in it").
* **Duplicates**: of two or more copies of one chapter, the one graded is the copy with the
  most answered exercises (answer cells no longer holding ``# your code here``); among equals
  the most recently modified file, then the last by name. The others are named as duplicates
  in the feedback page, the ``duplicates`` column of ``grades.csv``, and the grader's output.
* **Merged**: ``grades.csv``, ``exercises.csv`` and ``explanations.csv`` keep the rows of
  earlier runs; a (student, assignment) graded now replaces its earlier rows. The CSVs are
  written once, by the grader's process, after every worker has been killed.
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from ..env import REPO_ROOT
from . import isolate, notebook, sandbox
from .grading import Chapter, answer_source, grade_notebook
from .submissions import cell_grade_id, chapter_of, feedback_page

GRADES = [
    "student",
    "assignment",
    "score",
    "max_score",
    "by_hand_max",
    "file",
    "duplicates",
    "isolation",
]
# ``exercise`` is the exercise's ``:label:`` (its key); ``number`` ("2.2") is for display
EXERCISES = ["student", "assignment", "exercise", "number", "score", "max_score", "message"]
EXPLANATIONS = ["student", "assignment", "exercise", "number", "max_score", "explanation"]


def student_files(folder: Path) -> list[tuple[Path, bytes, float]]:
    """(path, contents, modification time) of every notebook under ``folder``, read now."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") for p in parts[:-1]) or not path.is_file():
            continue
        try:
            found.append((path, path.read_bytes(), path.stat().st_mtime))
        except OSError:
            found.append((path, b"", 0.0))
    return found


def parse(raw: bytes) -> dict:
    """The notebook in ``raw``, its cells repaired where an app wrote null for a dict."""
    nb = json.loads(raw.decode("utf-8"))
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("no cells")
    cells = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict):
            continue
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"] = {}
        if not isinstance(cell.get("source"), (str, list)):
            cell["source"] = ""
        cells.append(cell)
    nb["cells"] = cells
    return nb


def is_that_chapter(nb: dict, chapter: Chapter, number: int) -> bool:
    """Whether ``nb`` holds chapter ``number``'s exercise cells (nbgrader ids, or the text of
    two or more of its locked cells)."""
    if any(cell_grade_id(c).startswith(f"ex{number}_") for c in nb["cells"]):
        return True
    texts = {notebook.source(c).strip() for c in nb["cells"] if c.get("cell_type") == "code"}
    return len(texts & ({t.strip() for t in chapter.locked.values()} - {""})) >= 2


def answered(chapter: Chapter, nb: dict) -> int:
    """How many of the chapter's exercises hold an answer (no ``# your code here`` left)."""
    count = 0
    for plan in chapter.plans:
        text = answer_source(chapter, nb, plan)
        count += bool(text and text.strip() and notebook.CODE_STUB not in text)
    return count


def _read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write_csv(path: Path, fields, rows) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def merge(path: Path, fields, new_rows, graded: set) -> int:
    """Write ``path`` with the earlier rows whose (student, assignment) was not graded now,
    then ``new_rows``; returns how many earlier rows were kept."""
    kept = [r for r in _read_csv(path) if (r.get("student"), r.get("assignment")) not in graded]
    _write_csv(path, fields, kept + list(new_rows))
    return len(kept)


def _choose(chapter, copies):
    """The copy to grade, by the rule in the module's docstring; the others."""
    ranked = sorted(copies, key=lambda c: (answered(chapter, c[1]), c[2], c[0].name))
    return ranked[-1], ranked[:-1]


def grade(submissions, out, quiet: bool = False, scanning: bool = True) -> list[dict]:
    """Grade every notebook under ``submissions/<student>/`` against the autograder in
    ``out/course``; returns the rows of ``grades.csv`` graded in this run."""
    out, submissions = Path(out).resolve(), Path(submissions).resolve()
    course = out / "course"
    sources = {int(p.parent.name[2:]): p for p in (course / "source").glob("ch*/*.ipynb")}
    if not sources:
        raise FileNotFoundError(
            f"no autograder in {course}: run python -m kernels.course_lab build first"
        )
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of <student>/<notebook> files")
    say = (lambda *a: None) if quiet else print
    chapters = {
        n: Chapter.load(p, course / "release" / p.parent.name / p.name) for n, p in sources.items()
    }
    isolate.preload(line for c in chapters.values() for line in c.preamble.splitlines())
    sandbox.HIDDEN[:] = [str(REPO_ROOT), str(out), str(submissions)]  # where workers cannot look
    mode = sandbox.mode()
    say(f"isolation: {mode}")
    rows, per_exercise, explained, skipped, graded = [], [], [], [], set()
    for stray in sorted(p for p in submissions.iterdir() if p.is_file()):
        skipped.append((stray, "not in a <student>/ folder"))
    for folder in sorted(p for p in submissions.iterdir() if p.is_dir()):
        student, started = folder.name, time.perf_counter()
        files = student_files(folder)  # all of them, before any of the student's code runs
        by_chapter: dict = {}
        for path, raw, mtime in files:
            try:
                nb = parse(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                why = f"not a readable notebook ({type(exc).__name__}; a truncated upload?)"
                skipped.append((path, why))
                continue
            try:
                number = chapter_of(path, nb, chapters)
                if number not in sources:
                    why = f"not a notebook of this lab (chapters {sorted(sources)})"
                    skipped.append((path, why))
                elif not is_that_chapter(nb, chapters[number], number):
                    why = f"named like chapter {number}, but none of its exercise cells are in it"
                    skipped.append((path, why))
                else:
                    by_chapter.setdefault(number, []).append((path, nb, mtime))
            except Exception as exc:  # noqa: BLE001  a malformed notebook
                skipped.append((path, f"could not be read ({type(exc).__name__}: {exc})"))
        student_rows = []
        with sandbox.student(student, files):
            for number, copies in sorted(by_chapter.items()):
                chapter = chapters[number]
                (path, nb, _), others = _choose(chapter, copies)
                for other in others:
                    skipped.append((other[0], f"a duplicate of {path.relative_to(submissions)}"))
                try:
                    results = grade_notebook(chapter, nb, scanning)
                except Exception as exc:  # noqa: BLE001  whatever a file did to the grader
                    why = f"could not be graded ({type(exc).__name__}: {exc})"[:300]
                    skipped.append((path, why))
                    continue
                duplicates = " ".join(str(o[0].relative_to(folder)) for o in others)
                student_rows.append(
                    {
                        "student": student,
                        "assignment": chapter.assignment,
                        "score": sum(r.score for r in results),
                        "max_score": sum(r.max_score for r in results),
                        "by_hand_max": notebook.EXPLAIN_POINTS
                        * sum(r.explanation is not None for r in results),
                        "file": str(path.relative_to(folder)),
                        "duplicates": duplicates,
                        "isolation": mode,
                    }
                )
                graded.add((student, chapter.assignment))
                for r in results:
                    base = {"student": student, "assignment": chapter.assignment}
                    per_exercise.append(
                        {
                            **base,
                            "exercise": r.label,
                            "number": r.number,
                            "score": r.score,
                            "max_score": r.max_score,
                            "message": r.message,
                        }
                    )
                    if r.explanation is not None:
                        explained.append(
                            {
                                **base,
                                "exercise": r.label,
                                "number": r.number,
                                "max_score": notebook.EXPLAIN_POINTS,
                                "explanation": r.explanation,
                            }
                        )
                page = feedback_page(student, chapter, results, path)
                if duplicates:
                    page += f"\nAlso handed in, not graded (duplicates): {duplicates}\n"
                feedback = out / "feedback" / student / f"{chapter.assignment}.md"
                feedback.parent.mkdir(parents=True, exist_ok=True)
                feedback.write_text(page)
        rows += student_rows
        for r in student_rows:
            say(f"{student:20s} {r['assignment']}: {r['score']:g} / {r['max_score']:g}")
        if student_rows:
            say(f"{student:20s} graded in {time.perf_counter() - started:.1f} s")
    # every worker is dead here: the CSVs are written by this process alone
    kept = merge(out / "grades.csv", GRADES, rows, graded)
    merge(out / "exercises.csv", EXERCISES, per_exercise, graded)
    merge(out / "explanations.csv", EXPLANATIONS, explained, graded)
    for path, why in skipped:
        where = path.relative_to(submissions)
        owner = f" (student {where.parts[0]})" if len(where.parts) > 1 else ""
        print(f"skipped {where}: {why}{owner}")
    if not rows and not skipped:
        raise FileNotFoundError(f"no notebooks found as {submissions}/<student>/*.ipynb")
    if kept:
        say(
            f"merged: {kept} earlier rows of grades.csv kept (students and chapters not graded now)"
        )
    say(
        f"grades: {out / 'grades.csv'}; per exercise: {out / 'exercises.csv'}; to grade by "
        f"hand: {out / 'explanations.csv'}; feedback: {out / 'feedback'}"
    )
    return rows
