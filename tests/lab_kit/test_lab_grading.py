"""End to end on the CPU: build the student notebooks and the autograder for chapters 1 and 2,
then grade a reference submission (full marks), a blank one (zero) and one with a plausible
wrong answer (partial), by running nbgrader exactly as an instructor would."""
from __future__ import annotations

import json
import shutil

import pytest

from kernels.lab_kit import build, grade
from kernels.lab_kit.notebook import BEGIN_HIDDEN, BEGIN_SOLUTION

pytest.importorskip("nbgrader")


def _nbgrader_id(cell):
    return cell["metadata"].get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    build(out, chapters=[1, 2], quiet=True)
    return out


def test_build_makes_blank_student_notebooks_and_keeps_the_checks(kit):
    names = sorted(p.name for p in (kit / "student").glob("*.ipynb"))
    assert names == ["01_bf16_bits.ipynb", "02_triton_in_one_sitting.ipynb"]
    for path in (kit / "student").glob("*.ipynb"):
        text = path.read_text()
        nb = json.loads(text)
        for gone in (BEGIN_SOLUTION, BEGIN_HIDDEN, "solution-start", "thorough=True",
                     "remove-from-student\"", "return programs", "kept += 1"):
            assert gone not in text, f"{path.name} still holds {gone!r}"
        ids = {_nbgrader_id(c) for c in nb["cells"]}
        assert {"ex1_1-check", "ex1_2-check", "ex1_2-hidden"} <= ids or \
            {"ex2_1-check", "ex2_2-check", "ex2_2-hidden"} <= ids
        assert "".join(nb["cells"][0]["source"]).startswith("**Lab version**")
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert (kit / "course" / "gradebook.db").is_file()
    assert "Exercise 1.2" in (kit / "student" / "01_bf16_bits.ipynb").read_text()


def test_build_refuses_to_wipe_graded_work(tmp_path):
    (tmp_path / "course" / "autograded" / "someone").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="--force"):
        build(tmp_path, chapters=[1], quiet=True)


def _submission(kit, rel, answers):
    """The student notebook ``rel`` with the answer cells named in ``answers`` filled in."""
    nb = json.loads((kit / "course" / "release" / rel).read_text())
    for cell in nb["cells"]:
        if _nbgrader_id(cell) in answers:
            cell["source"] = answers[_nbgrader_id(cell)]
    return nb


def test_grading_gives_full_marks_zero_and_partial_credit(kit, tmp_path):
    solutions = {}
    for src in (kit / "course" / "source").glob("ch*/*.ipynb"):
        for cell in json.loads(src.read_text())["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("solution"):
                solutions[meta["grade_id"]] = cell["source"]
    subs = tmp_path / "submissions"
    wrong = {"ex1_1-answer": "n_per_binade = 2**7",                       # right
             "ex1_2-answer": "def round_bits_to_bf16(bits32):\n    return bits32 >> 16"}
    for rel in ("ch01/01_bf16_bits.ipynb", "ch02/02_triton_in_one_sitting.ipynb"):
        for student, answers in (("reference", solutions), ("blank", {})):
            (subs / student).mkdir(parents=True, exist_ok=True)
            nb = _submission(kit, rel, answers)
            (subs / student / rel.split("/")[1]).write_text(json.dumps(nb))
    (subs / "truncates").mkdir()
    (subs / "truncates" / "my_chapter_1.ipynb").write_text(        # any name: found by content
        json.dumps(_submission(kit, "ch01/01_bf16_bits.ipynb", wrong)))
    rows = grade(subs, kit, quiet=True)
    scores = {(r["student"], r["assignment"]): (r["score"], r["max_score"]) for r in rows}
    assert scores[("reference", "ch01")] == (4.0, 4.0)
    assert scores[("reference", "ch02")] == (4.0, 4.0)
    assert scores[("blank", "ch01")] == (0.0, 4.0)
    assert scores[("blank", "ch02")] == (0.0, 4.0)
    assert scores[("truncates", "ch01")] == (1.0, 4.0)       # 1.1 right; 1.2 fails both tests
    assert (kit / "grades.csv").read_text().startswith("student,assignment,score,max_score")
    shutil.rmtree(subs)
