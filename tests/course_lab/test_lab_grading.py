"""End to end on the CPU: build the student notebooks and the autograder for chapters 1, 2, 3 and
8, then grade, as an instructor would, honest students (the book's solutions: full marks; blank:
zero; a plausible wrong answer: partial), students who cheat (calling the checks' private code,
patching the checks, replacing ``ex`` with a stub, patching ``fail``, library calls that do the
work) and students who tamper with their notebook (deleted held-back test and check cells, a
deleted answer cell), plus a truncated upload and a notebook of another course."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from course_lab_helpers import chapter_exercises, chapter_of_label

from kernels.course_lab import build, grade, grading, isolate, notebook
from kernels.course_lab.notebook import BEGIN_HIDDEN, BEGIN_SOLUTION

pytest.importorskip("nbgrader")

RELEASES = (
    "ch01/01_bf16_bits.ipynb",
    "ch02/02_triton_in_one_sitting.ipynb",
    "ch03/03_flash_forward.ipynb",
    "ch08/08_is_flash_attention_stable.ipynb",
)
FULL = {"ch01": 6.0, "ch02": 7.0, "ch03": 8.0, "ch08": 3.0}

# answers that pass the checks when nothing stops them, each in a way the grader forbids
ML_DTYPES = """import ml_dtypes
import numpy as np
def round_bits_to_bf16(bits32):
    x = np.array([bits32], dtype=np.uint32).view(np.float32)
    return int(x.astype(ml_dtypes.bfloat16).view(np.uint16)[0])"""
ROW_MAX_WITH_TORCH = """@triton.jit
def noop(x_ptr):
    pass
def row_max(x):
    noop[(1,)](x)
    return torch.aminmax(x, dim=1).max"""
SCIPY = """from scipy.stats import wasserstein_distance
def w1(a, b):
    return float(wasserstein_distance(a, b))"""
PRIVATE = """def launch_grid(n, block):
    return ex._launch_grid_expected(n, block)"""
KEY_TILES_PRIVATE = """def key_tiles(i, block_m, block_n, n):
    return ex._key_tiles_expected(i, block_m, block_n, n)"""
PATCH_CHECK = """ex.check_launch_grid = lambda *args, **kwargs: print("correct")
def launch_grid(n, block):
    return 0, 0"""
PATCH_FAIL = """import kernels.numerics.exercises as module
module.fail = lambda message: None
module.need_function = lambda fn, name: fn
def round_bits_to_bf16(bits32):
    return bits32 >> 16"""
PACKAGE = """def peak_bytes(b, h, n, d, itemsize):
    q = torch.zeros(b, h, n, d, dtype=torch.float64 if itemsize == 8 else torch.float32)
    return tiling.peak_live_bytes(reference.standard_attention, q, q, q)"""
# honest, with a module the chapter imported before its exercises (math), not the setup
CHAPTER_IMPORT = """def key_tiles(i, block_m, block_n, n):
    return math.ceil(min((i + 1) * block_m, n) / block_n)"""
STUB = """import types
def _ok(*args, **kwargs):
    print("correct")
ex = types.SimpleNamespace(check_merge=_ok, check_peak_bytes=_ok, check_key_tiles=_ok)
merge = None"""


def _nbgrader_id(cell):
    return cell["metadata"].get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    build(out, chapters=[1, 2, 3, 8], quiet=True)
    return out


@pytest.fixture(scope="module")
def solutions(kit):
    found = {}
    for src in (kit / "course" / "source").glob("ch*/*.ipynb"):
        for cell in json.loads(src.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("solution"):
                found[meta["grade_id"]] = cell["source"]
    return found


def test_build_makes_blank_student_notebooks_and_keeps_the_checks(kit):
    names = sorted(p.name for p in (kit / "student").glob("*.ipynb"))
    assert names == sorted(r.split("/")[1] for r in RELEASES)
    for path in (kit / "student").glob("*.ipynb"):
        text = path.read_text()
        nb = json.loads(text)
        for gone in (
            BEGIN_SOLUTION,
            BEGIN_HIDDEN,
            "solution-start",
            "thorough=True",
            'remove-from-student"',
            "return programs",
            "kept += 1",
            "reference solution",
            "{cite",
            "{note}",
        ):
            assert gone not in text, f"{path.name} still holds {gone!r}"
        ids = {_nbgrader_id(c) for c in nb["cells"]}
        first, second = chapter_exercises(path.name[:2])[3][:2]
        assert {f"{first.grade_id}-check", f"{second.grade_id}-check"} <= ids
        assert f"{second.grade_id}-hidden" in ids
        assert "".join(nb["cells"][0]["source"]).startswith("**Lab version**")
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert (kit / "course" / "gradebook.db").is_file()
    assert "Exercise 1.2" in (kit / "student" / "01_bf16_bits.ipynb").read_text()


def test_build_refuses_to_wipe_graded_work(tmp_path):
    (tmp_path / "course" / "autograded" / "someone").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="--force"):
        build(tmp_path, chapters=[1], quiet=True)


def _submission(kit, rel, answers, mutate=None):
    """The student notebook ``rel`` with the answer cells named in ``answers`` filled in."""
    nb = json.loads((kit / "course" / "release" / rel).read_text())
    for cell in nb["cells"]:
        if _nbgrader_id(cell) in answers:
            cell["source"] = answers[_nbgrader_id(cell)]
    if mutate:
        nb["cells"] = [c for c in nb["cells"] if mutate(c)]
    return nb


def _write(folder, name, nb):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(nb if isinstance(nb, str) else json.dumps(nb))


def test_grading_honest_cheating_and_tampering_students(kit, solutions, tmp_path, capsys):
    subs = tmp_path / "submissions"
    for rel in RELEASES:
        name = rel.split("/")[1]
        _write(subs / "reference", name, _submission(kit, rel, solutions))
        _write(subs / "blank", name, _submission(kit, rel, {}))
        # tampering: held-back tests and checks deleted, answers right
        _write(
            subs / "tamper",
            name,
            _submission(
                kit,
                rel,
                solutions,
                lambda c: not (_nbgrader_id(c) or "").endswith(("-hidden", "-check")),
            ),
        )
    wrong = {
        "ex1_ex-bf16-count-answer": "n_per_binade = 2**7",  # right
        "ex1_ex-bf16-round-bits-answer": "def round_bits_to_bf16(bits32):\n    return bits32 >> 16",
    }
    _write(
        subs / "truncates",
        "my_chapter_1.ipynb",  # any name: found by cells
        _submission(kit, RELEASES[0], wrong),
    )
    # an app that drops cell metadata and ids (the grader finds answers by the checks' text),
    # and a file name that only contains the chapter's number
    for rel in RELEASES[:3]:
        nb = _submission(kit, rel, solutions)
        for i, cell in enumerate(nb["cells"]):
            cell["metadata"], cell["id"] = {}, f"c{i}"
        _write(subs / "stripped", f"Copy of {rel.split('/')[1]}", nb)
    # an answer cell deleted: that exercise scores 0, with a note
    _write(
        subs / "deletes",
        "01.ipynb",
        _submission(
            kit, RELEASES[0], solutions, lambda c: _nbgrader_id(c) != "ex1_ex-bf16-which-up-answer"
        ),
    )
    cheats = {
        "ex1_ex-bf16-round-bits-answer": PATCH_FAIL,
        "ex2_ch2-grid-answer": PATCH_CHECK,
        "ex2_ch2-rowmax-answer": ROW_MAX_WITH_TORCH,
        "ex3_ch3-merge-answer": STUB,
        "ex8_ex-golden-w1-answer": SCIPY,
    }
    cheats_too = {
        "ex1_ex-bf16-round-bits-answer": ML_DTYPES,
        "ex2_ch2-grid-answer": PRIVATE,
        "ex3_ch3-bytes-answer": PACKAGE,
        "ex3_ch3-causal-tiles-answer": KEY_TILES_PRIVATE,
    }
    _write(
        subs / "honest",
        "03.ipynb",
        _submission(kit, RELEASES[2], {**solutions, "ex3_ch3-causal-tiles-answer": CHAPTER_IMPORT}),
    )
    for rel in RELEASES:
        _write(subs / "cheat", rel.split("/")[1], _submission(kit, rel, cheats))
        if rel.startswith(("ch01", "ch02", "ch03")):
            _write(subs / "cheat2", rel.split("/")[1], _submission(kit, rel, cheats_too))
    # bad files: a truncated upload, a notebook of another course, a stray file
    text = json.dumps(_submission(kit, RELEASES[1], solutions))
    _write(subs / "reference", "02_again_truncated.ipynb", text[: len(text) // 2])
    _write(subs / "reference", "99_other_course.ipynb", {"cells": [], "metadata": {}})
    _write(subs, "loose.ipynb", text)

    rows = grade(subs, kit, quiet=True)
    printed = capsys.readouterr().out
    assert "skipped reference/02_again_truncated.ipynb: not a readable notebook" in printed
    assert "skipped reference/99_other_course.ipynb: not a notebook of this lab" in printed
    assert "skipped loose.ipynb" in printed
    scores = {(r["student"], r["assignment"]): r["score"] for r in rows}
    for chapter, full in FULL.items():
        assert scores[("reference", chapter)] == full
        assert scores[("tamper", chapter)] == full  # checks and tests restored
        assert scores[("blank", chapter)] == 0.0
    assert scores[("truncates", "ch01")] == 1.0  # ex-bf16-count right; ex-bf16-round-bits wrong
    assert scores[("honest", "ch03")] == FULL["ch03"]
    for chapter in ("ch01", "ch02", "ch03"):
        assert scores[("stripped", chapter)] == FULL[chapter]
    assert scores[("deletes", "ch01")] == FULL["ch01"] - grading.points("ex-bf16-which-up")
    with open(kit / "exercises.csv") as f:
        per = {(r["student"], r["exercise"]): r for r in csv.DictReader(f)}
    assert "answer cell is missing" in per[("deletes", "ex-bf16-which-up")]["message"]
    for student, answers in (("cheat", cheats), ("cheat2", cheats_too)):
        for grade_id in answers:
            name = notebook.label_of(grade_id[: -len("-answer")])
            assert float(per[(student, name)]["score"]) == 0.0, (student, name)
    # every other exercise of the cheating students is blank: the stub in ch3-merge gave
    # ch3-bytes nothing
    assert scores[("cheat", "ch03")] == 0.0 and scores[("cheat", "ch01")] == 0.0
    assert "`import ml_dtypes`" in per[("cheat2", "ex-bf16-round-bits")]["message"]
    assert "`torch.aminmax`" in per[("cheat", "ch2-rowmax")]["message"]
    assert "`import scipy.stats`" in per[("cheat", "ex-golden-w1")]["message"]
    assert "`ex._launch_grid_expected`" in per[("cheat2", "ch2-grid")]["message"]
    assert "`tiling`" in per[("cheat2", "ch3-bytes")]["message"]
    with open(kit / "grades.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    with open(kit / "explanations.csv") as f:
        said = {(r["student"], r["exercise"]): r["explanation"] for r in csv.DictReader(f)}
    explained = {"ex-bf16-count", "ex-bf16-which-up", "ex-golden-growths"}
    assert {e for s, e in said if s == "reference"} == explained
    assert all(said[("reference", e)] for e in explained)
    assert not any(said[("blank", e)] for e in explained)
    which_up = "ex-bf16-which-up"
    assert said[("stripped", which_up)] == said[("reference", which_up)]  # found by position
    with open(kit / "exercises.csv") as f:  # the label is the key; the number is shown beside
        numbers = {r["exercise"]: r["number"] for r in csv.DictReader(f)}
    assert numbers["ex-bf16-count"] == "1.1" and numbers["ch2-rowmax"] == "2.2"
    assert "graded by hand" in (kit / "feedback" / "reference" / "ch01.md").read_text()
    feedback = (kit / "feedback" / "cheat" / "ch02.md").read_text()
    assert "Exercise 2.2 (ch2-rowmax): 0 / 5" in feedback and "torch.aminmax" in feedback
    shutil.rmtree(subs)


@pytest.mark.parametrize(
    "grade_id, source",
    [
        ("ex1_ex-bf16-round-bits-answer", PATCH_FAIL),
        ("ex2_ch2-grid-answer", PATCH_CHECK),
        ("ex3_ch3-merge-answer", STUB),
        ("ex1_ex-bf16-round-bits-answer", ML_DTYPES),
    ],
    ids=["patch fail", "patch check", "stub ex", "ml_dtypes"],
)
def test_without_the_scan_the_separate_processes_alone_stop_patching(kit, grade_id, source):
    """Patching reaches only the answer's own process: with the scan switched off, the patches
    still score 0, and a correct answer by a forbidden call scores full (the scan stops it)."""
    number = int(grade_id[2 : grade_id.index("_")])
    rel = next(r for r in RELEASES if r.startswith(f"ch{number:02d}"))
    chapter = grading.Chapter.load(
        kit / "course" / "source" / rel, kit / "course" / "release" / rel
    )
    plan = next(p for p in chapter.plans if p.grade_id == grade_id[: -len("-answer")])
    result = grading.grade_exercise(chapter, plan, source, scanning=False)
    assert result.score == (plan.points if source is ML_DTYPES else 0.0), result


def test_an_answer_that_breaks_the_exchange_scores_zero_and_grading_goes_on(kit):
    """A value that cannot cross as plain data, or an answer that ends its own process,
    scores 0 with a note; nothing of it reaches the grader."""
    rel = RELEASES[0]
    chapter = grading.Chapter.load(
        kit / "course" / "source" / rel, kit / "course" / "release" / rel
    )
    plans = {p.label: p for p in chapter.plans}
    huge = grading.grade_exercise(
        chapter, plans["ex-bf16-count"], "n_per_binade = 10**5000", scanning=False
    )
    assert huge.score == 0.0 and huge.message
    ends = grading.grade_exercise(
        chapter,
        plans["ex-bf16-round-bits"],
        "import os\ndef round_bits_to_bf16(bits32):\n    os._exit(3)",
        scanning=False,
    )
    assert ends.score == 0.0 and "ended the answer's process" in ends.message
    # a reply over the size cap (a 2.3 GB return in the review) is refused, not decoded
    big = f"import numpy as np\nn_per_binade = np.zeros({(isolate.REPLY_MB << 17) + 1})"
    large = grading.grade_exercise(chapter, plans["ex-bf16-count"], big, scanning=False)
    assert large.score == 0.0 and "MiB of data" in large.message, large


def test_build_finds_nbgrader_tools_without_the_environment_on_path(tmp_path):
    """nbgrader runs alembic for its gradebook: found next to this Python, even when PATH holds
    only the system's folders (a virtual environment that was not activated)."""
    import os
    import subprocess
    import sys

    from kernels.env import REPO_ROOT

    env = {**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernels.course_lab",
            "build",
            "--chapters",
            "5",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "course" / "gradebook.db").is_file()


ROW_MAX = """@triton.jit
def row_max_kernel(x_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * row_stride + cols, mask=cols < n_cols + EXTRA, other=OTHER)
    tl.store(out_ptr + row, tl.max(x, axis=0))
def row_max(x):
    out = torch.full((x.shape[0],), float("nan"), device=x.device)
    block = triton.next_power_of_2(x.shape[1] + EXTRA)
    row_max_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block)
    return out"""


@pytest.mark.parametrize(
    "extra, other, points",
    [(0, '-float("inf")', 5.0), (1, '-float("inf")', 0.0), (0, "0.0", 0.0)],
    ids=["right", "one lane past the row", "masked lanes read 0"],
)
def test_the_row_maximum_traps_work_across_processes(kit, extra, other, points):
    """Chapter 2's check puts a larger number just past each row's end and makes every entry
    negative: graded in a separate process, a mask one lane too wide and masked lanes that read
    0 still fail, and the right kernel passes."""
    rel = RELEASES[1]
    chapter = grading.Chapter.load(
        kit / "course" / "source" / rel, kit / "course" / "release" / rel
    )
    source = ROW_MAX.replace("EXTRA", str(extra)).replace("OTHER", other)
    result = grading.grade_exercise(chapter, chapter.plans[1], source)
    assert result.score == points, result


def test_without_the_scan_reaching_for_the_references_finds_nothing(kit, solutions, tmp_path):
    """The review's reach-arounds, with the scan switched off: the worker never imported the book
    and cannot (pkgutil, pydoc and a walk up the stack find no reference), and where the machine
    allows it, the autograder's solutions are not on any path it can read."""
    from kernels.course_lab import batch, sandbox

    source = kit / "course" / "source" / RELEASES[2]
    reach = {
        "ex2_ch2-grid-answer": "from pydoc import locate\n"
        "launch_grid = locate('kernels.triton_exercises._launch_grid_expected')",
        "ex3_ch3-causal-tiles-answer": "import pkgutil\n"
        "key_tiles = pkgutil.resolve_name('kernels.attention.exercises:_key_tiles_expected')",
        "ex3_ch3-merge-answer": "import sys\ndef merge(*args):\n    f = sys._getframe()\n"
        "    while f is not None:\n        if '_merge_expected' in f.f_globals:\n"
        "            return f.f_globals['_merge_expected'](*args)\n        f = f.f_back\n",
        "ex3_ch3-bytes-answer": "import json\n"
        f"cells = json.load(open({str(source)!r}))['cells']\n"
        "code = [''.join(c['source']) for c in cells\n"
        "        if 'ex3_ch3-bytes-answer' in str(c['metadata'])]\n"
        "exec(code[0])",
    }
    subs = tmp_path / "class"
    for rel in RELEASES[1:3]:
        _write(subs / "reacher", rel.split("/")[1], _submission(kit, rel, reach))
    # the file holds the solution: an answer that could read it would score full marks
    cells = json.loads(source.read_text())["cells"]
    assert "".join(solutions["ex3_ch3-bytes-answer"]) in ["".join(c["source"]) for c in cells]
    batch.grade(subs, kit, quiet=True, scanning=False)
    with open(kit / "exercises.csv") as f:
        per = {r["exercise"]: r for r in csv.DictReader(f) if r["student"] == "reacher"}
    for name in ("ch2-grid", "ch3-causal-tiles", "ch3-merge"):
        assert float(per[name]["score"]) == 0.0, per[name]
    hidden = sandbox.capabilities()[2]
    bytes_row = per["ch3-bytes"]
    assert float(bytes_row["score"]) == (0.0 if hidden else grading.points("ch3-bytes")), bytes_row
    shutil.rmtree(subs)


def test_the_reviews_cheats_score_zero_when_graded_and_the_rest_scores_full(
    kit, solutions, tmp_path
):
    """Rows of the cheat table (test_lab_cheats.py) handed in as one student's notebooks, next
    to the book's solutions for the other exercises: each cheat scores 0 with the call named,
    every honest answer of the same student keeps its points."""
    from test_lab_cheats import CHEATS

    wanted = {
        "ex-bf16-round-bits": "ml_dtypes from the chapter's cells",
        "ch2-grid": "pydoc.locate",
        "ch2-rowmax": "MaxPool1d",
        "ch3-merge": "match class pattern on __globals__",
        "ch3-causal-tiles": "stack walk: logging",
        "ex-golden-w1": "SciPy from the chapter's cells",
    }
    rows = {label: (ex, source, named) for label, ex, source, named in CHEATS}
    answers = dict(solutions)
    for name, label in wanted.items():  # a row of another exercise is refused here too
        answers[f"ex{int(chapter_of_label(name))}_{name}-answer"] = rows[label][1]
    subs = tmp_path / "class"
    for rel in RELEASES:
        _write(subs / "mallory", rel.split("/")[1], _submission(kit, rel, answers))
    graded = grade(subs, kit, quiet=True)
    with open(kit / "exercises.csv") as f:
        per = {r["exercise"]: r for r in csv.DictReader(f) if r["student"] == "mallory"}
    for name, label in wanted.items():
        assert float(per[name]["score"]) == 0.0 and f"`{rows[label][2]}`" in per[name]["message"]
    honest = [n for n in per if n not in wanted]
    assert honest and all(float(per[n]["score"]) == grading.points(n) for n in honest)
    assert sum(r["score"] for r in graded) == sum(grading.points(n) for n in honest)
    shutil.rmtree(subs)
