"""Answers run in a process that has never imported the book and cannot, and (where the
machine allows it) cannot see the book, the autograder or the submissions on disk."""

from __future__ import annotations

import secrets
from pathlib import Path

import torch

import kernels  # noqa: F401  (the Triton interpreter switch, before anything imports triton)
from kernels import reduction_guard, triton_exercises
from kernels.course_lab import isolate, sandbox, worker
from kernels.gpu import exercises as gpu_exercises

PROBE = """import sys
loaded = sorted(m for m in sys.modules if m == "kernels" or m.startswith("kernels."))
try:
    import kernels
    imported = "yes"
except ImportError as exc:
    imported = str(exc)
constants = sorted(n for n in dir(ex) if not n.startswith("__"))
def scaled(x):
    return x * K
"""


def _setup(checks) -> dict:
    namespace = {"ex": checks}
    exec("import torch\nimport numpy as np", namespace)
    return isolate.worker_setup(namespace)


def test_the_worker_has_never_imported_the_book_and_cannot():
    k = secrets.randbelow(1000) + 2
    setup = _setup(gpu_exercises)
    assert set(setup["modules"]) == {"torch", "np"}  # never the checks' module
    for variable in ("loaded", "imported", "constants"):
        with isolate.Answer(setup, f"K = {k}\n{PROBE}", variable) as answer:
            assert answer.error is None, answer.error
            if variable == "loaded":
                assert answer.value == []
            elif variable == "imported":
                assert "not available" in answer.value
            else:  # the checks' public upper-case constants only: no seeded inputs, no code
                public = sorted(n for n in dir(gpu_exercises) if n.isupper() and n[0] != "_")
                assert answer.value == public and "_SEEDED" not in answer.value
    with isolate.Answer(setup, f"K = {k}\n{PROBE}", "scaled") as answer:
        x = torch.randn(5, dtype=torch.float64)
        assert torch.equal(answer.function(x), x * k)


def test_the_worker_switches_off_the_reductions_the_check_switches_off():
    # one guard for both: the check imports it, the worker loads the same file by its path
    assert triton_exercises.triton_only is reduction_guard.triton_only
    assert '"reduction_guard.py"' in Path(worker.__file__).read_text()
    setup = _setup(triton_exercises)
    source = "def row_max(x):\n    return x.amax(dim=1)\n"
    with isolate.Answer(setup, source, "row_max", guard="triton") as answer:
        try:
            answer.function(torch.randn(3, 4))
            raised = ""
        except Exception as exc:  # noqa: BLE001  the worker's error, as the grader sees it
            raised = str(exc)
    assert "switched off" in raised


def test_the_workers_cannot_see_the_solutions_on_disk(tmp_path):
    secret = tmp_path / "course" / "source" / "ch03" / "03.ipynb"
    secret.parent.mkdir(parents=True)
    secret.write_text(f"solution {secrets.token_hex(8)}")
    source = f"""import os
try:
    seen = open({str(secret)!r}).read()
except OSError as exc:
    seen = type(exc).__name__
listing = os.listdir({str(tmp_path)!r})
"""
    hide = sandbox.capabilities()[2]
    saved = list(sandbox.HIDDEN)
    sandbox.HIDDEN[:] = [str(tmp_path)]
    try:
        with sandbox.student("eve", []):
            with isolate.Answer(_setup(gpu_exercises), source, "seen") as answer:
                seen = answer.value
            with isolate.Answer(_setup(gpu_exercises), source, "listing") as answer:
                listing = answer.value
    finally:
        sandbox.HIDDEN[:] = saved
    if hide:  # root with mount namespaces (CI): the folder is empty where the answer runs
        assert seen == "FileNotFoundError" and listing == []
        assert "hidden" in sandbox.mode()
    else:  # the machine allows no hiding, and the mode says so
        assert seen == secret.read_text() and listing == ["course"]
        assert "every readable file visible" in sandbox.mode()
