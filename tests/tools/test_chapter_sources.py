"""Rules every chapter's source obeys, checked without executing anything (the site test checks
the rendered pages): code that fits the column, progress bars that print text, plain words."""

from __future__ import annotations

import json
import re

import pytest

from kernels.env import REPO_ROOT

CHAPTERS = sorted((REPO_ROOT / "book").glob("*.ipynb"))
MAX_CODE_LINE = 88
INTERNAL = re.compile(r"GUIDE|seed paper|\[local\]|\bTODO\b|FIXME")


def cells(path, kind):
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == kind:
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            yield index, source


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_lines_fit_the_column(path):
    long = [
        (i, line)
        for i, src in cells(path, "code")
        for line in src.splitlines()
        if len(line) > MAX_CODE_LINE and not src.startswith("# Setup")
    ]
    assert long == [], f"{path.name}: code lines over {MAX_CODE_LINE} characters: {long[:3]}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_progress_bars_print_text(path):
    """tqdm.auto draws a Jupyter widget: on the static site (and in CI) an empty box."""
    offending = [
        i for i, src in cells(path, "code") if "tqdm.auto" in src or "tqdm.notebook" in src
    ]
    assert offending == [], f"{path.name}: cells {offending} import a widget progress bar"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_internal_words(path):
    hits = [
        (i, m.group(0))
        for kind in ("markdown", "code")
        for i, src in cells(path, kind)
        for m in INTERNAL.finditer(src)
    ]
    assert hits == [], f"{path.name}: internal words {hits}"


def test_the_rule_catches_what_it_should():
    assert INTERNAL.search("see GUIDE §1") and INTERNAL.search("[local] run")
    assert not INTERNAL.search("a random seed of 3")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapters_are_stored_without_outputs(path):
    """Outputs are made where a chapter runs (the site build, nbmake, Colab); stored ones go stale
    and would contradict the text beside them on GitHub and in Colab before the first run."""
    nb = json.loads(path.read_text())
    executed = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert executed == [], f"{path.name}: code cells stored with outputs: {executed[:5]}"
