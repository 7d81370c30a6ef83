"""The package's docstrings and comments say what a thing is, not which issue asked for it: a
reader of ``kernels/`` has no issue tracker."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kernels"
ISSUE_NUMBER = re.compile(r"\bissues? \d+", re.IGNORECASE)


def issue_citations(text: str) -> list[str]:
    return ISSUE_NUMBER.findall(text)


def test_the_pattern_finds_a_citation():
    assert issue_citations("the targets of Issue 15 and issues 3") == ["Issue 15", "issues 3"]
    assert issue_citations("a tissue 3 cm wide; an issue with ties") == []


def test_no_module_cites_an_issue_number():
    found = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := issue_citations(path.read_text(encoding="utf-8")))
    }
    assert not found, f"issue numbers in kernels/ (say what the thing is instead): {found}"
