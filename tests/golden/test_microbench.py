"""Chapter 8's sweeps (kernels/golden/microbench.py) at small sizes: records, measures,
sink rows, rescaling counts, tiles."""

import math
import random

import pytest
import torch

import kernels  # noqa: F401
from kernels.golden import implementations as impl, microbench as mb


def fresh_seed():
    return random.SystemRandom().randrange(2**31)


def test_deviation_on_known_numbers():
    ref = torch.tensor([1.0, -2.0, 2.0, 0.0])
    out = torch.tensor([1.5, -2.0, 2.0, -0.5])
    d = mb.deviation(out, ref)
    assert d["max_abs"] == 0.5 and d["mean_abs"] == 0.25
    assert d["std_abs"] == pytest.approx(torch.tensor([0.5, 0, 0, 0.5]).double().std().item())
    assert d["rel_norm"] == pytest.approx(math.sqrt(0.5) / 3)


def test_precision_sweep_records_and_their_anchors():
    inputs = mb.gaussian_inputs(96, d=32, heads=1, seed=fresh_seed())
    records = mb.precision_sweep(inputs, block_n=32)
    assert len(records) == len(mb.FORMATS) * (len(impl.IMPLEMENTATIONS) + 1)
    for fmt in ("bf16", "fp16", "fp32"):
        best = mb.one(records, format=fmt, impl="ideal")
        low = impl.format_dtype(fmt)
        assert best["same_as_ideal"] == 1.0 and best["bias_beyond_ideal_ulps"] == 0.0
        # the ideal is within half an ulp of the golden value (ulp at 1: 2^-fraction
        # bits)
        assert best["vs_golden"]["max_abs"] <= 0.5 * torch.finfo(low).eps
    assert mb.one(records, format="fp64", impl="baseline")["vs_golden"]["max_abs"] == 0.0
    assert mb.one(records, format="fp64", impl="fa1")["bias_ulps"] is None
    fa2 = mb.one(records, format="bf16", impl="fa2")
    assert fa2["vs_baseline"]["max_abs"] > 0


def test_ratio_table_divides_flash_by_baseline():
    records = [
        {
            "inputs": "x",
            "format": "bf16",
            "impl": name,
            "vs_golden": {"max_abs": err, "rel_norm": 2 * err},
        }
        for name, err in (
            ("fa2", 1.0),
            ("paper", 4.0),
            ("fa1", 8.0),
            ("baseline", 2.0),
            ("baseline_fp32", 0.5),
            ("ideal", 0.5),
        )
    ]
    rows = mb.ratio_table(records, inputs="x")
    got = {(r["flash"], r["baseline"], r["measure"]): r["ratio"] for r in rows}
    assert got["fa1", "baseline", "max_abs"] == 4.0
    assert got["fa2", "baseline_fp32", "rel_norm"] == 2.0
    with pytest.raises(LookupError, match="records match"):
        mb.one(records, impl="nothing")


@pytest.mark.parametrize("setting", list(mb.SINK_SETTINGS))
def test_sink_rows_have_exactly_two_tied_maxima(setting):
    sink = mb.sink_inputs(256, setting, seed=fresh_seed(), batch=2, head_dim=16)
    scores = sink.q.double() @ sink.k.double().transpose(-1, -2)
    assert ((scores == scores.amax(-1, keepdim=True)).sum(-1) == 2).all()
    assert sink.scale == 1.0 and sink.name == f"sink: {setting}"


def test_sink_rows_fa2_is_the_ideal_and_the_all_low_path_is_biased():
    sink = mb.sink_inputs(512, "tied V 0, rest -1", seed=1, batch=4)
    records = mb.precision_sweep(sink, formats=("bf16",))
    assert mb.one(records, impl="fa2")["same_as_ideal"] > 0.999
    assert abs(mb.one(records, impl="paper")["bias_beyond_ideal_ulps"]) > 0.1


def test_seqlen_sweep_counts_rescalings_like_iid_records():
    # 8 heads: rows of one head share their keys, so their counts move together; with 2 heads
    # one draw in a few hundred missed by more than 0.15, with 8 the worst of 60 was 0.07
    records = mb.seqlen_sweep([256, 1024], heads=8, block_n=64, seed=fresh_seed())
    assert {r["impl"] for r in records} == {"ideal", "fa2", "paper", "fa1"}
    for r in mb.pick(records, impl="fa2"):
        assert r["tiles"] == r["n"] // 64
        assert r["rescalings_expected"] == pytest.approx(impl.expected_record_count(r["tiles"]))
        assert abs(r["rescalings_mean"] - r["rescalings_expected"]) < 0.15


def test_error_by_rescalings_groups_every_row():
    table = mb.error_by_rescalings(256, heads=2, block_n=32, seed=fresh_seed())
    assert set(table) == {"fa2", "paper", "fa1"}
    for groups in table.values():
        assert sum(rows for rows, _ in groups.values()) == 2 * 256
        assert all(err > 0 for _, err in groups.values())


def test_tile_sweep_block_m_changes_nothing_and_block_n_does():
    inputs = mb.gaussian_inputs(128, d=32, heads=1, seed=fresh_seed())
    records = mb.tile_sweep(inputs, [(16, 16), (64, 16), (16, 64)], formats=("bf16",))
    assert all(mb.block_m_identical(records).values())
    fa2 = mb.pick(records, impl="fa2")
    assert {r["block_m"] for r in fa2} == {None} and len(fa2) == 2
    with pytest.raises(ValueError, match="tile sizes"):
        mb.tile_sweep(inputs, [(0, 16)])


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="n, d and heads"):
        mb.gaussian_inputs(0)
    with pytest.raises(ValueError, match="setting"):
        mb.sink_inputs(64, "no such setting")
