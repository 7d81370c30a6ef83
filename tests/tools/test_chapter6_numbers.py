"""Chapter 6's bookkeeping (kernels/rounding_lab/chapter6_numbers.py): every number its prose
glues is produced by the chapter, each function returns what its sentence reads, and raises when
the measurements stop saying what the sentence says."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from kernels.rounding_lab import chapter6_numbers as c6
from kernels.rounding_lab.fixes import FIXES

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "book" / "06_fixes.ipynb"
CASES = ("−1 / 0", "−1 / −1", "0 / −1")
# |Σ(δ − δ_exact)| / Σ|δ_exact| per fix and case, as the chapter measured them (rounded)
SHARE = {
    "none": (1.2e-3, 3.1e-4, 2.8e-3),
    "beta_tile": (1.2e-3, 3.1e-4, 2.8e-3),
    "beta_cross": (6.3e-6, 2.6e-6, 4.9e-4),
    "beta_capped": (6.3e-6, 2.6e-6, 4.9e-4),
    "beta_ell_rounded": (3.2e-4, 6.1e-5, 9.8e-4),
    "delta_fp32": (1.5e-9, 4.5e-8, 3.9e-8),
    "delta_hilo": (8.3e-7, 3.3e-7, 4.6e-7),
    "delta_dp": (9.0e-9, 4.4e-9, 1.2e-9),
}


def _records(share=SHARE):
    records = []
    for key in FIXES:
        forward = bool(FIXES[key].forward)
        for case, s in zip(CASES, share[key]):
            out = dict(
                same_as_ideal=0.75 if forward else 0.995,
                rms=3.0 if forward and case == "0 / −1" else 0.3,
            )
            records.append(
                dict(
                    case=case,
                    fix=key,
                    out=out,
                    delta=dict(bias=-0.2, se=0.5, sum_error=s * 1000, sum_abs_exact=1000.0),
                    delta_ideal=dict(bias=-0.2),
                )
            )
    return records


def _prose_names() -> set[str]:
    cells = json.loads(CHAPTER.read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {m.split(":")[0] for m in re.findall(r"\{glue:text\}`([^`]+)`", text)}


def _glued_in_cells() -> set[str]:
    """Names the chapter's code cells glue one at a time: glue("name", ...)."""
    cells = json.loads(CHAPTER.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue":
            names.add(node.args[0].value)
    return names


def _returned_names() -> set[str]:
    """Names the chapter6_numbers functions return (on small inputs of the chapter's form)."""
    negative = {
        "ideal": [dict(rm=-1e-4, mean=0.2)],
        "fa2/cross": [
            dict(rm=-1e-4, mean=-0.2, same_as_ideal=0.6, se=0.01),
            dict(rm=-0.0032, mean=0.2, same_as_ideal=0.99, se=0.01),
            dict(rm=-0.1, mean=0.03, same_as_ideal=0.8, se=0.01),
        ],
    }
    predicted = [
        dict(rm=-1e-4, mean=-0.2, rounded_down=0.0, shift=0.0, same_as_ideal=0.6),
        dict(rm=-0.0032, mean=0.2, rounded_down=1.0, shift=0.1, same_as_ideal=0.99),
        dict(rm=-0.1, mean=0.03, rounded_down=0.5, shift=0.0, same_as_ideal=0.8),
    ]
    scan = [dict(rm=90.0, wrong=0.0, ell_zero=0.0), dict(rm=92.0, wrong=1.0, ell_zero=0.0)]
    scan.append(dict(rm=104.0, wrong=1.0, ell_zero=1.0))
    fixed = {
        "fa2": [dict(mean=-0.01, correctly_rounded=1.0), dict(mean=0.6, correctly_rounded=0.3)],
        "ideal": [dict(mean=-0.01), dict(mean=0.01)],
    }
    speeds = {"FA2 (book kernel)": 100.0, "β rule, offset capped": 101.0}
    table = {name: 90.0 for name in ("β rule per tile", "β rule across tiles")}
    table |= {"FA2 (book kernel)": 100.0, "β rule, offset capped": 93.0}
    table |= {"β rule, ℓ from rounded P̄": 90.0, "δ from rowsum(dP ∘ P)": 80.0}
    table |= {"δ from an fp32 O": 40.0}
    cell = {name: dict(bias=b, bad=0.5) for name, b in (("ideal", 0.2), ("fa2", 0.17), ("rule", 0))}
    gpu = {"provenance": {"gpu": "NVIDIA H200"}}
    worst = {f"triton/{k}": dict(worst=w) for k, w in (("none", 2.4), ("beta_cross", 1e5))}
    worst["triton/beta_ell_rounded"] = dict(worst=1e5)
    timed = dict(gpu_s=0.1, cpu_s=0.2, gpu_vs_cpu_largest_difference=1e-15)
    dicts = [
        c6.delta_numbers(_records()),
        c6.output_numbers(_records()),
        c6.worst_numbers(gpu, worst),
        c6.fp32_thresholds(),
        c6.clamp_numbers({rm: (1.0 if rm < 24 else 0.5) for rm in range(18, 42)}),
        c6.offset_numbers([0.0, 0.1], fixed, [0.0, -1.0]),
        c6.rule_scan_numbers({"always": scan, "tied": scan, "zero": scan}, 0.16, 8),
        c6.zero_rule_numbers(negative, 0.00196),
        c6.spike_numbers(negative, predicted),
        c6.cost_numbers(table),
        c6.gpt2_shape_numbers(speeds),
        c6.explorer_numbers({"bases": [{"rule": [0] * 3}] * 2}, cell, cell),
        c6.update_numbers(0.2, timed),
    ]
    return {name for d in dicts for name in d}


def test_every_number_the_prose_glues_is_produced_by_the_chapter():
    missing = _prose_names() - _glued_in_cells() - _returned_names()
    assert not missing, f"glued in the prose, produced by no cell: {sorted(missing)}"


def test_the_delta_numbers_read_the_table():
    n = c6.delta_numbers(_records())
    assert n["c6_sum_none_lo"] == pytest.approx(3.1e-4)
    assert n["c6_sum_delta_hi"] == pytest.approx(8.3e-7)
    assert n["c6_beta_gain_lo"] == 119  # 3.1e-4 / 2.6e-6 = 119.2: never rounded up to 120
    assert n["c6_beta_gain_near0"] == pytest.approx(2.8e-3 / 4.9e-4)
    assert n["c6_none_vs_ideal"] == 0
    assert n["c6_delta_near0_within"] == "zero within"


@pytest.mark.parametrize(
    "fix, values",
    [
        ("delta_hilo", (1e-2, 1e-7, 1e-7)),  # a δ fix no better than no fix
        ("beta_tile", (6.3e-6, 3.1e-4, 2.8e-3)),  # the per-tile rule changed something
        ("beta_ell_rounded", (1e-6, 6.1e-5, 9.8e-4)),  # ℓ from rounded P̄ beats the rule
    ],
)
def test_the_delta_numbers_refuse_records_that_contradict_the_prose(fix, values):
    with pytest.raises(ValueError, match="prose"):
        c6.delta_numbers(_records({**SHARE, fix: values}))


def test_the_output_numbers_and_their_check():
    n = c6.output_numbers(_records())
    assert n["c6_delta_same_min"] == 0.995
    assert n["c6_beta_moved_lo"] == n["c6_beta_moved_hi"] == pytest.approx(0.25)
    assert n["c6_beta_rms_ratio"] == pytest.approx(10)
    changed = _records()
    next(r for r in changed if r["fix"] == "delta_dp")["out"]["rms"] = 0.31
    with pytest.raises(ValueError, match="δ fixes leave O"):
        c6.output_numbers(changed)


def test_a_cost_range_that_reads_as_one_value_is_one_value():
    table = {"FA2 (book kernel)": 100.0, "β rule per tile": 93.4, "β rule across tiles": 92.8}
    table |= {"β rule, offset capped": 93.0, "β rule, ℓ from rounded P̄": 90.0}
    table |= {"δ from rowsum(dP ∘ P)": 81.0, "δ from an fp32 O": 40.0}
    assert c6.cost_numbers(table)["c6_cost_beta"] == "7%"
    table["β rule per tile"] = 98.0
    assert c6.cost_numbers(table)["c6_cost_beta"] == "2%–7%"


def test_the_gpt2_shape_check():
    with pytest.raises(ValueError, match="capped rule"):
        c6.gpt2_shape_numbers({"FA2 (book kernel)": 100.0, "β rule, offset capped": 90.0})


def test_the_fp32_thresholds():
    n = c6.fp32_thresholds()
    assert n["c6_subnormal_at"] == pytest.approx(126 * 0.6931471805599453)
    assert n["c6_zero_at"] == pytest.approx(150 * 0.6931471805599453)
