"""Reading what students hand in, and writing what graders hand back.

:func:`chapter_of` says which chapter a submitted notebook belongs to (by its nbgrader cell ids,
the text of its locked cells, or its file name), :func:`explanation` finds a student's written
explanation for hand grading, :func:`feedback_page` is the page a student gets back, and
:func:`csv_writer` opens the CSV files that :func:`kernels.course_lab.batch.grade` fills a
student at a time.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from . import notebook


def cell_grade_id(cell) -> str:
    """nbgrader's id of a cell ("" for a cell without nbgrader's metadata)."""
    meta = cell.get("metadata") if isinstance(cell, dict) else None
    nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
    grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
    return grade_id if isinstance(grade_id, str) else ""


def explanation(nb: dict, plan, chapter=None) -> str:
    """The student's explanation for ``plan`` ("" if the cell is gone or still the prompt); in a
    notebook without nbgrader's metadata, the markdown written between the answer and the
    check (found by its text)."""
    cells = nb.get("cells", [])
    stub = notebook.TEXT_STUB.strip()
    for cell in cells:
        if cell_grade_id(cell) == f"{plan.grade_id}-explain":
            text = notebook.source(cell).strip()
            return "" if text == stub else text
    if chapter is None or any(cell_grade_id(c) for c in cells):
        return ""
    check = chapter.locked.get(f"{plan.grade_id}-check", "").strip()
    at = next(
        (
            i
            for i, c in enumerate(cells)
            if c.get("cell_type") == "code" and check and notebook.source(c).strip() == check
        ),
        None,
    )
    said = []
    for cell in reversed(cells[:at] if at is not None else []):
        if cell.get("cell_type") == "code":
            break
        text = notebook.source(cell).strip()
        if text and text != stub:
            said.insert(0, text)
    return "\n\n".join(said)


def chapter_of(path: Path, nb: dict, chapters: dict | None = None) -> int | None:
    """The chapter a submitted notebook belongs to: from its nbgrader cell ids
    (``ex2_ch2-grid-...``);
    else from the text of its locked cells (the exercise setup, the checks), which ``chapters``
    know; else from a two-digit number in its file name (``Copy of 03_flash_forward.ipynb``)."""
    cells = [c for c in nb.get("cells", []) if isinstance(c, dict)] if isinstance(nb, dict) else []
    for cell in cells:
        grade_id = cell_grade_id(cell)
        if (
            grade_id.startswith("ex")
            and "_" in grade_id
            and grade_id[2 : grade_id.index("_")].isdigit()
        ):
            return int(grade_id[2 : grade_id.index("_")])
    texts = {notebook.source(c).strip() for c in cells if c.get("cell_type") == "code"}
    matches = {
        n: len(texts & {t.strip() for t in ch.locked.values()} - {""})
        for n, ch in (chapters or {}).items()
    }
    if matches and max(matches.values()) >= 2:
        return max(matches, key=matches.get)
    found = re.search(r"(?<!\d)(\d\d)_", path.name)
    return int(found.group(1)) if found else None


def feedback_page(student: str, chapter, results, path: Path) -> str:
    """The page a student gets back for one chapter: score, then one line per exercise."""
    score, best = sum(r.score for r in results), sum(r.max_score for r in results)
    lines = [
        f"# {chapter.assignment}, {student}: {score:g} / {best:g}",
        "",
        f"Graded from `{path.name}`.",
        "",
    ]
    for r in results:
        verdict = "all checks pass" if all(r.passed) and not r.message else r.message
        name = f"Exercise {r.number} ({r.label})"
        lines.append(f"- {name}: {r.score:g} / {r.max_score:g}. {verdict}")
        if r.explanation is not None:
            said = "graded by hand" if r.explanation else "no explanation written: 0 points"
            lines.append(f"- {name}, explanation: {said} ({notebook.EXPLAIN_POINTS:g} point)")
    return "\n".join(lines) + "\n"


def csv_writer(path: Path, fields):
    """An open CSV file with its header written and flushed, and its DictWriter."""
    f = open(path, "w", newline="")
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    f.flush()
    return f, writer
