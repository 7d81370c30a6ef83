"""Running a chapter's exercise cells outside Jupyter, as the lab's student would."""

from __future__ import annotations

import functools
import linecache
import re

from kernels.course_lab import notebook
from kernels.tools import booktools

# every chapter is a lab chapter (test_lab_notebooks checks that it tags its exercise cells)
CHAPTERS = {p.name[:2]: p for p in booktools.chapters()}


def run(source: str, namespace: dict, name: str) -> None:
    """Execute one cell; register its text so that inspect (and triton.jit) find the code."""
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


def chapter_exercises(number: str):
    path = CHAPTERS[number]
    nb = notebook.load(path)
    setup, found = notebook.exercises(nb, path)
    return path, nb, setup, found


@functools.cache
def labels() -> dict:
    """Every exercise label of the book: the two-digit number of its chapter."""
    return {ex.label: number for number in CHAPTERS for ex in chapter_exercises(number)[3]}


def chapter_of_label(label: str) -> str:
    """``"02"`` for ``"ch2-rowmax"``: the chapter whose exercise has that label."""
    return labels()[label]


def fresh_namespace(nb, setup, path) -> dict:
    """A namespace holding what the exercise section's setup cell imports (and nothing of the
    chapter's other cells: the exercises must stand on their own)."""
    import kernels  # noqa: F401  (the interpreter switch, before triton)

    namespace = {"__name__": "__main__"}
    run(notebook.source(nb["cells"][setup]), namespace, f"<{path.name} exercise setup>")
    return namespace


def hidden_tests(text: str) -> str:
    """The code between the hidden-test markers."""
    match = re.search(
        rf"{re.escape(notebook.BEGIN_HIDDEN)}\n(.*?)\n\s*"
        rf"{re.escape(notebook.END_HIDDEN)}",
        text,
        re.S,
    )
    assert match, "no hidden tests in the cell"
    return match.group(1)
