"""Imported once by the grader's worker server (:mod:`.isolate`) before it forks workers: runs
the import statements of the chapters' cells (``LAB_PRELOAD``, one a line), so that no worker
repeats a slow import (``from transformers import ...`` takes seconds)."""

import os

for _statement in os.environ.get("LAB_PRELOAD", "").splitlines():
    try:
        exec(_statement, {})
    except Exception:  # noqa: BLE001, S110  (not installed on this machine: the answer will say)
        pass
