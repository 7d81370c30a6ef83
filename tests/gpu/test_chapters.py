"""The chapter runner records what happened to each chapter: ran, failed (with the error), or
timed out, and names the ones over budget."""

import json
import random

from kernels.gpu.chapters import main, over_budget, run_chapter


def _notebook(path, *cells):
    cells = [{"cell_type": "code", "metadata": {}, "source": src, "outputs": []} for src in cells]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4}))
    return path


def test_a_chapter_that_runs_fails_or_hangs_is_recorded_as_such(tmp_path):
    token = f"{random.getrandbits(48):x}"  # fresh each run: the output really comes back
    good = _notebook(tmp_path / "good.ipynb", f"x = '{token}'", "print(x)")
    bad = _notebook(tmp_path / "bad.ipynb", f"raise ValueError('broke {token}')")
    slow = _notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(60)")
    rows = [run_chapter(good, 60), run_chapter(bad, 60), run_chapter(slow, 8)]
    assert [row["status"] for row in rows] == ["ran", "failed", "timed out"]
    assert token in rows[0]["tail"] and f"ValueError: broke {token}" in rows[1]["tail"]
    assert 8 <= rows[2]["seconds"] < 30
    assert over_budget(rows, budget_s=1000) == ["bad.ipynb: failed", "slow.ipynb: timed out"]
    assert over_budget(rows[:1], budget_s=0.001)[0].startswith("good.ipynb: ")


def test_the_record_is_written_with_provenance(tmp_path):
    good = _notebook(tmp_path / "good.ipynb", "y = 1 + 1")
    assert main([str(good), "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "chapter_times.json").read_text())
    assert {"gpu", "torch", "date", "command"} <= set(record["provenance"])
    assert record["data"]["chapters"][0]["status"] == "ran"
    assert record["data"]["over_budget"] == []


def test_a_call_stopped_midway_keeps_the_chapters_it_finished(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    good = _notebook(tmp_path / "good.ipynb", "z = 2 * 3")
    slow = _notebook(tmp_path / "slow.ipynb", "import time\ntime.sleep(120)")
    command = [sys.executable, "-m", "kernels.gpu.chapters", str(good), str(slow)]
    runner = subprocess.Popen(
        command + ["--out", str(tmp_path)], stdout=subprocess.DEVNULL, start_new_session=True
    )
    record_path = tmp_path / "chapter_times.json"
    try:
        deadline = time.monotonic() + 90
        while not record_path.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)  # as a device call's time limit would
        runner.wait()
    record = json.loads(record_path.read_text())
    assert [row["chapter"] for row in record["data"]["chapters"]] == ["good.ipynb"]
    assert record["data"]["chapters"][0]["status"] == "ran"
