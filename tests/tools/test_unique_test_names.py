"""pytest imports test files by their base name (tests/ has no packages), so two test files with one
name in different folders stop the whole run at collection. Catch that here with a clear message."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_names_are_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    repeated = sorted(name for name, count in names.items() if count > 1)
    assert not repeated, f"test files share a name across folders (rename one): {repeated}"
