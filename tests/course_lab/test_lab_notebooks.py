"""The chapters' exercise sections have the shape the lab kit reads, and the kit turns a chapter
into an nbgrader source notebook (numbered headings, metadata from tags, the lab's setup cell)."""

from __future__ import annotations

import copy

import pytest
from course_lab_helpers import CHAPTERS, chapter_exercises

from kernels.course_lab import course, notebook


def test_every_chapter_is_a_lab_chapter():
    assert {f"{n:02d}" for n in range(1, 11)} <= set(CHAPTERS)
    for number in ("01", "07"):
        assert notebook.in_lab_format(notebook.load(CHAPTERS[number]))


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_every_chapter_ends_with_two_to_four_exercises(number):
    path, nb, setup, found = chapter_exercises(number)
    assert 2 <= len(found) <= 4, f"{path.name}: {len(found)} exercises"
    assert [ex.number for ex in found] == list(range(1, len(found) + 1))
    assert all(ex.chapter == int(number) for ex in found)
    assert len({ex.label for ex in found}) == len(found)
    # at least one exercise asks for a function or kernel, one has hidden tests
    answers = [notebook.source(nb["cells"][ex.answer]) for ex in found]
    assert any("def " in a for a in answers) and any(ex.hidden is not None for ex in found)
    # an exercise answered with a value, not a function, asks for an explanation too
    for ex, answer in zip(found, answers):
        if "def " not in answer:
            assert ex.explain is not None, f"{path.name}: exercise {ex.label} has no explain cell"
            assert "remove-cell" in notebook.tags(nb["cells"][ex.explain])
    # everything after the exercises' setup belongs to the exercise section: no stray cells
    last = max(
        max(i for i in (ex.answer, ex.check, ex.hidden, *ex.removed) if i is not None)
        for ex in found
    )
    assert setup < found[0].task and last >= found[-1].check


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_blank_answer_cells_still_compile(number):
    path, nb, _, found = chapter_exercises(number)
    for ex in found:
        blank = notebook.clear_solution(notebook.source(nb["cells"][ex.answer]))
        assert "BEGIN SOLUTION" not in blank and "# your code here" in blank
        compile(blank, f"<{path.name} {ex.label} blank>", "exec")


def test_student_source_numbers_exercises_and_derives_nbgrader_metadata():
    path, nb, setup, found = chapter_exercises("02")
    src = notebook.student_source(nb, path, course.student_setup("https://example.org/b", "v1"))
    cells = src["cells"]
    first_code = next(c for c in cells if c["cell_type"] == "code")
    assert 'pip", "install", "-q", "--no-deps"' in first_code["source"]
    assert "torch" not in first_code["source"].split("import kernels")[0].replace(
        "torch and Triton already installed", ""
    )  # never installs torch
    assert first_code["metadata"]["nbgrader"]["locked"]
    assert cells[found[0].task]["source"].startswith("### Exercise 2.1: ")
    assert cells[found[1].task]["source"].startswith("### Exercise 2.2: ")
    meta = {
        c["metadata"]["nbgrader"]["grade_id"]: c["metadata"]["nbgrader"]
        for c in cells
        if "nbgrader" in c["metadata"]
    }
    assert meta["ex2_ch2-grid-answer"]["solution"] and not meta["ex2_ch2-grid-answer"]["grade"]
    assert meta["ex2_ch2-grid-check"]["grade"] and meta["ex2_ch2-grid-check"]["points"] == 1
    assert meta["ex2_ch2-rowmax-hidden"]["grade"] and meta["exercise-setup"]["locked"]
    assert meta["ex2_ch2-grid-check"]["points"] + meta["ex2_ch2-grid-hidden"]["points"] == 2
    # the book's notebook itself is untouched
    assert notebook.load(path) == nb


def _broken(mutate):
    path, nb, _, found = chapter_exercises("01")
    nb = copy.deepcopy(nb)
    mutate(nb["cells"], found)
    return path, nb


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda cells, f: cells[f[0].answer]["metadata"].update(tags=[]), "tagged 'answer'"),
        (lambda cells, f: cells[f[0].check]["metadata"].update(tags=["answer"]), "two cells"),
        (lambda cells, f: cells[f[0].answer].update(source="x = 1"), "BEGIN SOLUTION"),
        (
            lambda cells, f: cells[f[0].task].update(
                source=notebook.source(cells[f[0].task]).replace(":label:", ":class:")
            ),
            "no :label:",
        ),
    ],
)
def test_a_malformed_exercise_section_is_refused_with_a_clear_error(mutate, message):
    path, nb = _broken(mutate)
    with pytest.raises(ValueError, match=message):
        notebook.exercises(nb, path)


def test_chapter_numbers_come_from_the_file_name():
    assert notebook.chapter_number("book/07_gpt2_failure.ipynb") == 7
    with pytest.raises(ValueError, match="two digits"):
        notebook.chapter_number("book/appendix_gpt2_search.ipynb")


def test_a_failed_check_shows_one_line_in_jupyter_and_still_fails_the_cell():
    """In a Jupyter kernel a WrongAnswer prints its message alone, no traceback into the checks'
    code, and the cell still counts as failed (a notebook run stops there)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from kernels.env import REPO_ROOT

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r})\n"
            "from kernels.numerics import exercises as ex"
        ),
        nbformat.v4.new_code_cell("ex.check_binade_count(None)"),
        nbformat.v4.new_code_cell("1 / 0"),
    ]
    nbclient.NotebookClient(nb, timeout=120, allow_errors=True).execute()
    [error] = nb.cells[1].outputs
    assert error["ename"] == "WrongAnswer" and len(error["traceback"]) == 1
    assert error["traceback"][0].startswith("WrongAnswer: no answer yet")
    assert len(nb.cells[2].outputs[0]["traceback"]) > 1  # other errors: as before
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="no answer yet"):
        nbclient.NotebookClient(nb, timeout=120).execute()
