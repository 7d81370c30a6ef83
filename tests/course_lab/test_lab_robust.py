"""On chapter 1: a class graded as a reviewer graded it. Broken and oddly filed notebooks,
duplicates, wrong notebooks and late batches; answers that reach for the grades, their later
notebooks, the autograder, the workers, the clock or the memory."""

from __future__ import annotations

import csv
import json
import os
import time

import pytest

from kernels.course_lab import batch, build, grade, isolate

pytest.importorskip("nbgrader")

REL = "ch01/01_bf16_bits.ipynb"


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    build(out, chapters=[1], quiet=True)
    return out


def _gid(cell):
    return (cell.get("metadata") or {}).get("nbgrader", {}).get("grade_id")


def _nb(kit, answers=None, solved=True):
    src = json.loads((kit / "course" / "source" / REL).read_text())
    solutions = {
        _gid(c): "".join(c["source"])
        for c in src["cells"]
        if c["metadata"].get("nbgrader", {}).get("solution") and solved
    }
    solutions.update(answers or {})
    nb = json.loads((kit / "course" / "release" / REL).read_text())
    for cell in nb["cells"]:
        if _gid(cell) in solutions:
            cell["source"] = solutions[_gid(cell)]
    return nb


def _put(path, nb, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))
    if mtime:
        os.utime(path, (mtime, mtime))


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_broken_nested_duplicate_and_wrong_files_and_late_batches(kit, tmp_path, capsys):
    subs = tmp_path / "batch1"
    broken = _nb(kit)
    broken["cells"][3]["metadata"] = None  # an app wrote null
    _put(subs / "anna" / "01_bf16_bits.ipynb", broken)
    _put(subs / "bob" / "01_bf16_bits.ipynb", _nb(kit))  # graded after anna
    _put(subs / "carl" / "submission" / "attempt1" / "01_bf16_bits.ipynb", _nb(kit))  # an LMS
    now = time.time()
    _put(subs / "dora" / "01_bf16_bits.ipynb", _nb(kit, solved=False), now - 60)  # blank
    _put(subs / "dora" / "01_bf16_bits_final.ipynb", _nb(kit), now - 3600)  # answered
    other = {"cells": [{"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": []}]}
    _put(subs / "emil" / "01_bf16_bits.ipynb", other)  # named like chapter 1, it is not
    rows = grade(subs, kit, quiet=True)
    printed = capsys.readouterr().out
    scores = {r["student"]: r["score"] for r in rows}
    assert scores == {"anna": 6.0, "bob": 6.0, "carl": 6.0, "dora": 6.0}, printed
    assert "emil/01_bf16_bits.ipynb: named like chapter 1" in printed
    assert "dora/01_bf16_bits.ipynb: a duplicate of dora/01_bf16_bits_final.ipynb" in printed
    by = {r["student"]: r for r in _rows(kit / "grades.csv")}
    assert by["dora"]["duplicates"] == "01_bf16_bits.ipynb"
    assert by["carl"]["file"] == "submission/attempt1/01_bf16_bits.ipynb"
    assert "duplicates" in (kit / "feedback" / "dora" / "ch01.md").read_text()
    # a second batch: late work of one student, a regrade of another; the rest kept
    late = tmp_path / "batch2"
    _put(late / "fred" / "01_bf16_bits.ipynb", _nb(kit))
    _put(late / "bob" / "01_bf16_bits.ipynb", _nb(kit, solved=False))
    grade(late, kit, quiet=True)
    after = {r["student"]: float(r["score"]) for r in _rows(kit / "grades.csv")}
    assert after == {"anna": 6.0, "bob": 0.0, "carl": 6.0, "dora": 6.0, "fred": 6.0}
    per = [(r["student"], r["exercise"]) for r in _rows(kit / "exercises.csv")]
    assert len(per) == len(set(per)) == 5 * 3


def test_answers_cannot_reach_the_grades_the_files_or_the_other_workers(kit, tmp_path, monkeypatch):
    subs = tmp_path / "class"
    out_csv = kit / "grades.csv"
    later = subs / "mallory" / "zz_later" / "01_bf16_bits.ipynb"
    source = kit / "course" / "source" / REL
    targets = [str(out_csv), str(later), str(source), str(kit / "backdoor.py")]
    attack = f"""import os, signal, time
for p in {targets!r}:
    try:
        with open(p, "a") as f:
            f.write("# planted")
    except OSError:
        pass
if os.fork() == 0:  # outlives the worker, and writes after the grader is done
    os.setsid()
    time.sleep(4)
    for p in {targets!r}:
        try:
            with open(p, "w") as f:
                f.write("student,assignment,score\\nmallory,ch01,1000\\n")
        except OSError:
            pass
    os._exit(0)
try:
    os.kill(os.getppid(), signal.SIGKILL)  # the server that forks the workers
except OSError:
    pass
n_per_binade = 2**7
"""
    hog = "blob = bytearray(64 << 30)\nn_per_binade = 2**7"
    stop = "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\nn_per_binade = 2**7"
    _put(subs / "mallory" / "01_bf16_bits.ipynb", _nb(kit, {"ex1_ex-bf16-count-answer": attack}))
    _put(later, _nb(kit, solved=False))
    _put(subs / "nina" / "01_bf16_bits.ipynb", _nb(kit))  # honest, after mallory
    _put(subs / "oscar" / "01_bf16_bits.ipynb", _nb(kit, {"ex1_ex-bf16-count-answer": hog}))
    _put(subs / "paula" / "01_bf16_bits.ipynb", _nb(kit, {"ex1_ex-bf16-count-answer": stop}))
    before = {p: open(p, "rb").read() for p in (later, source)}
    monkeypatch.setattr(isolate, "START_TIMEOUT", 8.0)
    started = time.monotonic()
    rows = batch.grade(subs, kit, quiet=True, scanning=False)
    assert time.monotonic() - started < 300
    time.sleep(6)  # mallory's child would write now
    assert {p: open(p, "rb").read() for p in (later, source)} == before
    assert not (kit / "backdoor.py").exists()
    scores = {r["student"]: r["score"] for r in rows}
    assert scores["nina"] == 6.0  # the killed server cost the honest student nothing
    assert scores["oscar"] == 5.0 and scores["paula"] == 5.0  # ex-bf16-count alone lost
    by = {r["student"]: r for r in _rows(out_csv)}
    assert set(by) >= {"mallory", "nina", "oscar", "paula"} and "1000" not in out_csv.read_text()
    assert by["nina"]["isolation"].startswith("worker:")
    msg = {(r["student"], r["exercise"]): r["message"] for r in _rows(kit / "exercises.csv")}
    assert "time budget" in msg[("paula", "ex-bf16-count")]
    assert "MemoryError" in msg[("oscar", "ex-bf16-count")]
