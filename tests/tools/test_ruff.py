"""One formatter and linter (ruff, configured in pyproject.toml) for kernels/, tests/ and the
chapters' code cells: `ruff check` and `ruff format --check` find nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["kernels", "tests", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("book/*.ipynb"))]


def _ruff() -> list[str]:
    if shutil.which("ruff"):
        return ["ruff"]
    try:
        import ruff  # noqa: F401
    except ImportError:
        pytest.skip("ruff is not installed (pip install ruff)")
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_finds_nothing(command):
    done = subprocess.run([*_ruff(), *command, *TARGETS], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout[-6000:]}{done.stderr}"
