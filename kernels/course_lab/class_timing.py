"""How long grading a class takes: ``python -m kernels.course_lab.class_timing --students 60``.

Builds the kit for the chapters that run on a CPU (1, 2, 3 and 8 by default) into a temporary
folder, makes a fake class (every other student hands in the book's solutions, the others
blank notebooks), grades it with :func:`kernels.course_lab.batch.grade` as an instructor would,
and prints one JSON line: the class size, the chapters, the seconds taken in all and per
student, how many students scored full marks and zero, the isolation mode and the machine's
load. The instructor page's timing of a class comes from this command.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from . import batch, notebook
from .course import build
from .submissions import cell_grade_id


def solutions(course: Path) -> dict:
    """grade id: the book's solution, from the autograder's source notebooks."""
    found = {}
    for src in sorted((course / "source").glob("ch*/*.ipynb")):
        for cell in notebook.load(src)["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
                found[cell_grade_id(cell)] = notebook.source(cell)
    return found


def fake_class(out: Path, folder: Path, students: int) -> None:
    """``students`` folders under ``folder``: even ones solved, odd ones blank."""
    answers = solutions(out / "course")
    for i in range(students):
        for release in sorted((out / "course" / "release").glob("ch*/*.ipynb")):
            nb = notebook.load(release)
            if i % 2 == 0:
                for cell in nb["cells"]:
                    if cell_grade_id(cell) in answers:
                        cell["source"] = answers[cell_grade_id(cell)]
            target = folder / f"student{i:03d}" / release.name
            target.parent.mkdir(parents=True, exist_ok=True)
            notebook.write(target, nb)


def measure(students: int, chapters, out: Path) -> dict:
    if not (out / "course" / "source").is_dir():
        build(out, chapters=chapters, quiet=True)
    with tempfile.TemporaryDirectory(prefix="lab-class-") as tmp:
        folder = Path(tmp)
        fake_class(out, folder, students)
        started = time.perf_counter()
        rows = batch.grade(folder, out, quiet=True)
        seconds = time.perf_counter() - started
    scores: dict = {}
    for row in rows:
        total = scores.setdefault(row["student"], [0.0, 0.0])
        total[0] += row["score"]
        total[1] += row["max_score"]
    return {
        "students": students,
        "chapters": sorted({r["assignment"] for r in rows}),
        "seconds": round(seconds, 1),
        "seconds_per_student": round(seconds / students, 2),
        "full_marks": sum(s == m for s, m in scores.values()),
        "zero": sum(s == 0 for s, _ in scores.values()),
        "isolation": rows[0]["isolation"] if rows else "",
        "cpu_cores": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 1),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.course_lab.class_timing")
    parser.add_argument("--students", type=int, default=60)
    parser.add_argument("--chapters", nargs="*", default=["1", "2", "3", "8"])
    parser.add_argument("--out", help="a built kit to reuse (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.students < 2:
        parser.error("--students must be 2 or more (half solved, half blank)")
    if args.out:
        print(json.dumps(measure(args.students, args.chapters, Path(args.out))))
        return 0
    with tempfile.TemporaryDirectory(prefix="lab-kit-") as tmp:
        print(json.dumps(measure(args.students, args.chapters, Path(tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
