"""Tests of the chapter-5 lab (kernels/rounding_lab/). Fresh random inputs each run."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from kernels import rounding_lab as lab
from kernels.attention import registry
from kernels.numerics.rounding import error_in_ulps, next_below, round_to_dtype, ulp_in_dtype
from kernels.numerics.stats import NEGLIGIBLE_ULP, bias_summary, is_biased, mean_ci


def to_bf16(x):
    return round_to_dtype(x, torch.bfloat16)


def fresh_seed():
    return random.SystemRandom().randrange(2**31)


def small_case(**kw):
    base = lab.Case(n_keys=256, block_n=32, head_dim=16, batch=4)
    return replace(base, **kw)


# ------------------------------------------------------------------ construction
@pytest.mark.parametrize("placement", ["same", "split", "any"])
@pytest.mark.parametrize("ties", [1, 2, 5])
def test_exactly_k_tied_maxima_at_requested_positions(placement, ties):
    case = small_case(ties=ties, placement=placement, gap=float(random.uniform(0, 20)))
    built = lab.build(case, fresh_seed())
    s = built.scores
    rm = s.amax(-1, keepdim=True)
    is_max = s == rm
    assert (is_max.sum(-1) == ties).all()
    for b in range(case.batch):
        where = torch.nonzero(is_max[b, 0]).flatten()
        assert torch.equal(where, built.tie_pos[b])
        assert (is_max[b] == is_max[b, 0]).all()  # every row of a sequence: same keys
        tiles = built.tie_pos[b] // case.block_n
        if placement == "same":
            assert (tiles == tiles[0]).all()
        if placement == "split":
            assert tiles.unique().numel() == ties


def test_scores_are_exact_through_the_identity_query():
    built = lab.build(small_case(), fresh_seed())
    s = built.q.double() @ built.k.double().transpose(-1, -2)
    assert torch.equal(s, built.scores.double())
    assert torch.equal(to_bf16(built.scores), built.scores)  # bf16 values
    assert torch.equal(to_bf16(built.v), built.v)


@pytest.mark.parametrize("gap", [0.5, 4.0, 15.6])
def test_gap_and_rest_spread(gap):
    case = small_case(gap=gap, rest_spread=0.0, row_max_jitter=0.0, row_max=2.0)
    built = lab.build(case, fresh_seed())
    s = built.scores.double()
    rm = s.amax(-1, keepdim=True)
    rest = s[s < rm]
    want = to_bf16(torch.tensor(2.0 - gap, dtype=torch.float64))
    assert torch.all(rest == want)
    spread_case = replace(case, rest_spread=1.0)
    s2 = lab.build(spread_case, fresh_seed()).scores.double()
    rest2 = (s2.amax(-1, keepdim=True) - s2)[s2 < s2.amax(-1, keepdim=True)]
    ulp = float(ulp_in_dtype(torch.tensor(2.0 - gap)))
    assert rest2.min() >= gap - ulp
    assert abs(float((rest2 - gap).mean()) - math.sqrt(2 / math.pi)) < 0.05  # E|z| = √(2/π)


@pytest.mark.parametrize("family", lab.V_FAMILIES)
def test_v_distributions_separately_for_tied_and_rest(family):
    mean_t, sd_t = random.uniform(-2, 2), random.uniform(0.2, 0.5)
    mean_r, sd_r = random.uniform(-2, 2), random.uniform(0.2, 0.5)
    case = lab.Case(
        n_keys=2048,
        head_dim=32,
        batch=4,
        ties=8,
        block_n=64,
        v_tied=lab.VDist(family, mean_t, sd_t),
        v_rest=lab.VDist(family, mean_r, sd_r),
    )
    built = lab.build(case, fresh_seed())
    b, n, d = built.v.shape
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask.scatter_(1, built.tie_pos, True)
    tied, rest = built.v[mask].double(), built.v[~mask].double()
    if family == "one-signed":
        assert (torch.sign(tied) == (-1 if mean_t < 0 else 1)).all()
        assert (torch.sign(rest[rest != 0]) == (-1 if mean_r < 0 else 1)).all()
        return
    assert abs(float(tied.mean()) - mean_t) < 0.1
    assert abs(float(rest.mean()) - mean_r) < 0.02
    assert abs(float(rest.std()) - sd_r) < 0.03


def test_impossible_placements_are_value_errors():
    with pytest.raises(ValueError, match="different tiles"):
        lab.build(small_case(ties=9, block_n=32, n_keys=256, placement="split"))
    with pytest.raises(ValueError, match="one tile"):
        lab.build(small_case(ties=33, block_n=32, placement="same"))
    with pytest.raises(ValueError, match="family"):
        lab.VDist("cauchy")
    with pytest.raises(ValueError, match="implementation"):
        lab.run_case("nope", lab.build(small_case()))


# ------------------------------------------------------------------ units and statistics
def test_ulp_definition_and_next_below():
    x = torch.tensor([1.0, 1.5, 0.75, -3.0, 2.0**-130])
    want = torch.tensor([2.0**-7, 2.0**-7, 2.0**-8, 2.0**-6, 2.0**-133], dtype=torch.float64)
    assert torch.equal(ulp_in_dtype(x), want)
    vals = to_bf16(torch.randn(5000) * 10.0 ** torch.randint(-3, 4, (5000,)))
    vals = torch.cat([vals, torch.tensor([0.0, -0.0, 1.0, -1.0])])
    below = next_below(vals)
    assert (below < vals).all()
    mid = (below.double() + vals.double()) / 2  # nothing in bf16 strictly between them
    r = mid.to(torch.bfloat16).double()
    assert ((r == below.double()) | (r == vals.double())).all()


def test_error_in_ulps_known_values():
    o_hp = torch.tensor([1.0 + 2.0**-9, -1.0, 0.0, 3.0], dtype=torch.float64)
    o_lp = torch.tensor([1.0, -1.0 - 2.0**-7, 0.0, math.nan])
    err = error_in_ulps(o_lp, o_hp)
    assert err[0] == -0.25 and err[1] == -1.0 and err[2] == 0.0 and torch.isnan(err[3])


def test_mean_ci_and_bias_summary_on_known_inputs():
    st = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert st["mean"] == 2.5 and st["n"] == 4
    assert st["se"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1) / 2)
    assert st["lo"] == pytest.approx(2.5 - 1.96 * st["se"])
    const = bias_summary(torch.full((10, 8), 0.25))
    assert const["mean"] == 0.25 and const["se"] == 0 and is_biased(const)
    assert "biased" in const["verdict"]
    noise = torch.randn(400, 64, dtype=torch.float64)
    st = bias_summary(noise)
    assert st["lo"] < 0 < st["hi"] or abs(st["mean"]) < 4 * st["se"]
    shifted = bias_summary(noise + 0.2)
    assert is_biased(shifted) and shifted["mean"] > 0 and "upward" in shifted["verdict"]
    zero = bias_summary(torch.zeros(5, 5))
    assert zero["verdict"] == "no error at all" and not is_biased(zero)
    # rows are the independent units: the per-row spread, not the per-element one, sets se
    rows = torch.randn(50, 1, dtype=torch.float64).expand(50, 100)
    st = bias_summary(rows)
    assert st["se"] == pytest.approx(float(rows[:, 0].std() / math.sqrt(50)))
    nan = bias_summary(torch.tensor([[math.nan, 1.0], [2.0, 3.0]]))
    assert nan["nonfinite"] == 1 and nan["n_elements"] == 3


# ------------------------------------------------------------- bias measurements with known answers
@pytest.mark.parametrize(
    "label", ["ideal", "fa2/off", "fa2/cross", "paper/off", "paper/tile", "paper-untiled/off"]
)
def test_single_max_with_vanishing_rest_is_exact(label):
    """k = 1, other scores 120 below: exp underflows to 0 for the rest, O = V of the max exactly.
    (rm = 110 keeps every score above -100: see the chapter's boundary case on the cross rule.)"""
    case = small_case(ties=1, gap=120.0, row_max=110.0)
    impl, stable = registry.split(label)
    st = lab.measure(case, impl, stable, seed=fresh_seed())
    assert st["mean"] == 0.0 and st["se"] == 0.0 and st["correctly_rounded"] == 1.0


def test_two_ties_without_rest_round_half_to_even_unbiased():
    """k = 2 and nothing else: O = (V_a + V_b)/2, an exact tie half the time -> RNE, no bias."""
    case = replace(small_case(ties=2, gap=120.0, row_max=110.0), batch=32, head_dim=32)
    # One draw's standard error understates the spread between draws (the outputs of one
    # draw share its V), so one draw in ~20 looks biased at 0.02-0.03 ulp. Judge the mean
    # over 8 fresh draws instead: their spread is ~0.008 ulp per draw, 0.003 for the mean.
    runs = [lab.measure(case, "fa2", "off", seed=fresh_seed()) for _ in range(8)]
    means = np.array([st["mean"] for st in runs])
    assert all(st["correctly_rounded"] == 1.0 for st in runs)
    assert abs(means.mean()) < NEGLIGIBLE_ULP, means


def test_fa2_output_is_correctly_rounded_and_large_gap_ties_bias_it():
    """The FA2 path rounds once: it equals bf16(O_exact); with k=2, negative tied V and a tiny
    positive-leaning rest, the exact O sits just above half the halfway points: upward bias."""
    case = replace(lab.Case(), batch=8)
    seed = fresh_seed()
    fa2 = lab.measure(case, "fa2", "off", seed=seed)
    ideal = lab.measure(case, "ideal", "off", seed=seed)
    assert fa2["correctly_rounded"] > 0.999
    assert fa2["mean"] > 0.1 and is_biased(fa2)
    assert abs(fa2["mean"] - ideal["mean"]) < 0.01
    crossed = lab.measure(case, "fa2", "cross", seed=seed)
    assert abs(crossed["mean"]) < fa2["mean"] / 2


def test_tile_rule_misses_split_ties_cross_rule_sees_them():
    seed = fresh_seed()
    for placement, tile_sees in (("split", False), ("same", True)):
        built = lab.build(small_case(placement=placement, ties=2), seed)
        rm = built.row_max  # in [1, 3]: beta * rm when seen
        tile = lab.run_case("fa2", built, stable="tile", block_n=32)
        cross = lab.run_case("fa2", built, stable="cross", block_n=32)
        assert torch.equal(tile.row_offset, 2 * rm if tile_sees else rm)
        assert torch.equal(cross.row_offset, 2 * rm) and cross.ties_seen.all()


def test_rounds_to_one_threshold_matches_brute_force():
    for beta in (1.0001, 1.01, 2.0, 8.0):
        thr = lab.largest_rm_rounding_to_one(beta)
        below = torch.tensor([thr * 0.999])
        above = torch.tensor([thr * 1.001])
        assert lab.p_bar_of_tied(below, beta, "fa2").item() == 1.0
        assert lab.p_bar_of_tied(above, beta, "fa2").item() < 1.0
    with pytest.raises(ValueError):
        lab.largest_rm_rounding_to_one(1.0)


def test_running_error_definitions():
    rng = np.random.default_rng(fresh_seed())
    s = to_bf16(torch.tensor(rng.normal(0, 3, 300))).numpy()
    v = to_bf16(torch.tensor(rng.normal(-1, 0.5, 300))).numpy()
    m = float(s.max())
    r = lab.running_error(s, v, m, "paper")
    p = to_bf16(torch.exp(to_bf16(torch.tensor(s - m).float()))).double().numpy()
    acc32 = np.float32(0)
    for t in range(300):  # Eq. (5), one term at a time
        acc32 = np.float32(acc32 + np.float32(p[t] * v[t]))
        lp = float(to_bf16(torch.tensor(float(acc32))))
        assert r["error"][t] == pytest.approx(lp - np.sum(p[: t + 1] * v[: t + 1]), abs=1e-12)
    assert set(r["p_is_one"]) == set(np.flatnonzero(s == m))
    r2 = lab.running_error(s, v, m, "fa2")
    assert np.all(np.abs(r2["error"]) < 0.01)  # fp32 accumulator: tiny errors
    ideal = to_bf16(torch.tensor(np.cumsum(p * v))).numpy() - np.cumsum(p * v)
    assert np.array_equal(r["ideal"], ideal)
    cols = np.stack([v, -v, 2 * v], -1)  # several columns at once: the same, column by column
    r3 = lab.running_error(s, cols, m, "paper")
    for c in range(3):
        one = lab.running_error(s, cols[:, c], m, "paper")
        assert np.array_equal(r3["error"][:, c], one["error"])
        assert np.array_equal(r3["ideal"][:, c], one["ideal"])


def test_sum_errors_is_eq5_at_the_last_key_in_ulps():
    built = lab.build(small_case(ties=2, gap=15.6, batch=2), fresh_seed())
    sums = lab.sum_errors(built, "paper")
    b, r, c = 1, 3, 5
    row = built.scores[b, r]
    one = lab.running_error(row.numpy(), built.v[b, :, c].numpy(), float(row.max()), "paper")
    unit = float(ulp_in_dtype(torch.tensor(one["hp"][-1])))
    assert sums["error"][b, r, c] == pytest.approx(one["error"][-1] / unit, abs=1e-12)
    assert sums["ideal"].shape == built.scores.shape[:2] + (built.v.shape[-1],)
    assert np.all(np.abs(sums["ideal"]) <= 0.5)  # a correctly rounded sum
    # an exact Ō near a BF16 midpoint is one whose ideal error is near half an ulp in size
    near = lab.near_midpoint(sums, within=0.1)
    assert np.array_equal(near, np.abs(sums["ideal"]) > 0.4)


def test_sum_errors_finds_an_exact_sum_on_a_bf16_midpoint():
    """Two tied keys (P̄ = 1) whose V add up to a point halfway between two BF16 numbers, every
    other V exactly 0: the exact Ō is that midpoint, and it rounds to even."""
    built = lab.build(small_case(ties=2, gap=15.6, batch=1), fresh_seed())
    row = built.scores[0, 0]
    tied = torch.nonzero(row == row.max()).flatten()
    v = torch.zeros_like(built.v)
    v[0, tied[0], 0], v[0, tied[1], 0] = 1.0, 2.0**-8  # 1 + 2^-8: midway between 1 and 1 + 2^-7
    sums = lab.sum_errors(replace(built, v=v), "paper")
    assert lab.near_midpoint(sums, within=1e-12)[0, 0, 0] and sums["ideal"][0, 0, 0] == -0.5


def test_offset_rounding_is_the_bf16_rounding_of_exp_minus_c():
    offsets = np.array([0.0, random.uniform(0.01, 5.0)])
    got = lab.offset_rounding(offsets)
    assert got[0] == 0.0  # e^0 = 1 is a BF16 number
    p = math.exp(-offsets[1])
    want = float(to_bf16(torch.tensor(p, dtype=torch.float32)).double()) / p - 1
    assert got[1] == pytest.approx(want, rel=1e-6) and abs(got[1]) <= 2.0**-8


def test_fixed_offset_leaves_the_ideal_and_zero_offset_is_fa2():
    case = small_case(ties=2, gap=8.0, batch=2)
    fixed = lab.fixed_offset_bias([0.0, 0.25], case, numerics=("ideal", "fa2"))
    assert fixed["ideal"][0]["mean"] == fixed["ideal"][1]["mean"]  # O_exact ignores the offset
    plain = lab.measure(case, "fa2", "off")
    assert fixed["fa2"][0]["mean"] == plain["mean"]
    assert fixed["fa2"][1]["correctly_rounded"] < 1.0  # e^-0.25 rounds: O moves off the ideal


def test_row_max_scan_finds_the_underflow_thresholds():
    scan = lab.row_max_scan([60.0, 110.0], ["fa2/always", "ideal"], ties=1)
    low, high = scan["fa2/always"]
    assert low["wrong"] == 0.0 and low["ell_zero"] == 0.0
    assert high["wrong"] == 1.0 and high["ell_zero"] == 1.0  # e^-110 is 0 in fp32: ℓ = 0, NaN
    assert all(r["same_as_ideal"] == 1.0 and r["ell_zero"] is None for r in scan["ideal"])
    negative = lab.row_max_scan([-95.0], ["fa2/cross"], ties=2)["fa2/cross"][0]
    assert negative["ell_subnormal"] == 1.0  # m = 0: ℓ = 2e^-95, below fp32's smallest normal


# ------------------------------------------------------- the m = 0 rule's rounded tied P̄, alone
@pytest.mark.parametrize("placement", ["split", "same", "any"])
def test_tied_p_error_alone_predicts_the_m0_rule_output(placement):
    rng = random.SystemRandom()
    rm = -(10 ** rng.uniform(-4, 1))
    case = small_case(  # 16 sequences: over 2,000 draws the share never fell below 0.976
        ties=rng.randint(1, 3), placement=placement, row_max=rm, row_max_jitter=0.2 * abs(rm),
        batch=16,
    )  # fmt: skip
    built = lab.build(case, fresh_seed())
    exact = lab.reference(built)
    got = lab.run_case("fa2", built, stable="cross", block_n=case.block_n).out.double()
    delta = lab.tied_p_error(built, block_n=case.block_n).unsqueeze(-1)
    assert (to_bf16(exact * (1 + delta)) == got).double().mean() >= 0.96, (rm, case.ties)
    with pytest.raises(ValueError, match="< 0"):
        lab.tied_p_error(lab.build(replace(case, row_max=-rm), fresh_seed()))


def test_the_spike_is_every_tied_p_bar_rounded_down_the_way_the_ideal_rounds():
    rng = random.SystemRandom()
    # |r_m|·(1 ± 0.2) inside the band where e^r_m rounds up to 1, then inside (0.00196, 0.0039)
    # where it rounds down, to 1 − 2⁻⁸ (above 0.0039 e^r_m < 1 − 2⁻⁸ rounds up to it)
    at = [-rng.uniform(1e-4, 0.0016), -rng.uniform(0.0025, 0.0032)]
    seed = fresh_seed()
    scan = lab.row_max_scan(at, ["fa2/cross", "ideal"], rel_jitter=0.2, seed=seed)
    inside, spike = lab.tied_rounding_scan(at, rel_jitter=0.2, seed=seed)
    assert inside["rounded_down"] == 0.0 and spike["rounded_down"] == 1.0
    assert inside["shift"] < 0 < spike["shift"]  # O < 0: away from 0, then towards it
    for pred, meas in zip((inside, spike), scan["fa2/cross"]):
        assert pred["mean"] == pytest.approx(meas["mean"], abs=0.02)
    assert inside["mean"] < 0 < scan["ideal"][0]["mean"]  # the storage bias of the other sign
    # all moved towards 0, the way the ideal rounds: mostly the ideal's outputs, the same sign
    assert spike["same_as_ideal"] >= 0.85 and scan["fa2/cross"][1]["same_as_ideal"] >= 0.85
    assert spike["mean"] > 0 and scan["ideal"][1]["mean"] > 0


# --------------------------------------------------------------- the widget's function never raises
EXTREMES = [
    dict(stable="cross", beta=1.0001, row_max=2.0),
    dict(stable="cross", beta=1e4, row_max=20.0),
    dict(stable="always", beta=2.0, row_max=120.0, ties=1),
    dict(stable="cross", eps=0.0, tie_jitter=0.0015, row_max=0.1, row_max_jitter=0.0),
    dict(ties=256, n_keys=256),
    dict(ties=256, n_keys=256, placement="same"),
    dict(v_tied_mean=3e38, v_rest_mean=3e38, v_tied_spread=0.0),
    dict(stable="cross", beta=0.5),
    dict(stable="cross", row_max=0.0, row_max_jitter=0.0),
    dict(impl="sdpa-flash"),
    dict(ties=0),
    dict(v_tied_family="cauchy"),
]


@pytest.mark.parametrize("params", EXTREMES)
def test_lab_extreme_values_give_messages_not_exceptions(params):
    base = dict(n_keys=256, block_n=32, head_dim=16, batch=2, seed=fresh_seed())
    result = lab.lab(**{**base, **params})
    text = lab.lab_text(result)
    assert isinstance(text, str)
    assert result.messages, f"no message for {params}"


def test_lab_gap_zero_runs():
    """gap = 0: the others sit one bf16 step below the maximum; a normal, finite measurement."""
    r = lab.lab(gap=0.0, rest_spread=0.0, n_keys=256, block_n=32, head_dim=16, batch=2)
    assert math.isfinite(r.stats["mean"]) and r.counts["rows with repeated maxima (exact)"] == 32


def test_lab_messages_say_what_happened():
    base = dict(n_keys=256, block_n=32, head_dim=16, batch=2)
    r = lab.lab(stable="cross", beta=1e4, row_max=20.0, **base)
    assert r.counts["rows with ℓ = 0 (underflow)"] == r.counts["rows"]
    assert any("underflow" in m for m in r.messages) and r.counts["NaN outputs"] > 0
    r = lab.lab(stable="cross", beta=1.0001, row_max=2.0, row_max_jitter=0.0, **base)
    assert any("still hold ≥ 2 entries with P̄ = 1" in m for m in r.messages)
    r = lab.lab(stable="cross", row_max=0.0, row_max_jitter=0.0, **base)
    assert any("exactly 0" in m for m in r.messages)
    r = lab.lab(v_tied_mean=3e38, v_rest_mean=3e38, v_tied_spread=0.0, **base)
    assert r.counts["inf outputs"] > 0
    r = lab.lab(**base)  # an ordinary setting: numbers, no alarm
    assert not r.messages and math.isfinite(r.stats["mean"]) and r.running is not None


def test_small_sweep_and_gpu_script_on_cpu(tmp_path):
    recs = lab.sweep(
        ties=(2,),
        gaps=(16.0,),
        v_means=((-1.0, 0.0),),
        impls=("ideal", "fa2/off", "paper/cross"),
        base=small_case(),
        pairs=[("fa2/off", "ideal")],
        progress=False,
    )
    assert [r["impl"] for r in recs] == ["ideal", "fa2/off", "paper/cross", "fa2/off vs ideal"]
    assert recs[-1]["identical"] > 0.99
    from kernels import results
    from kernels.rounding_lab import gpu as lab_gpu

    path = lab_gpu.main(["--small", "--out", str(tmp_path)])
    rec = results.load("lab_sweep_gpu", directory=tmp_path)
    assert rec["provenance"]["command"].startswith("python -m kernels.rounding_lab.gpu")
    assert path.endswith("lab_sweep_gpu.json") and len(rec["data"]["records"]) >= 9


def test_fused_accumulation_model_loses_tiny_terms_against_a_large_accumulator():
    """Two tied V (-1 and -1 - 2^-7: their mean is a halfway point) met first, then 254 keys
    with P̄ = 2^-26 and V = -2. Each product (-2^-25) is below half an fp32 ulp of the
    accumulator (≈ -2): added one by one (fa2-fma) they vanish and O rounds up to -1; summed
    per tile first (the emulator) they survive and O is correctly rounded down."""
    n, d = 256, 16
    scores = torch.full((1, d, n), -26 * math.log(2.0)).float()
    scores[..., :2] = 0.0
    v = torch.full((1, n, d), -2.0)
    v[:, 0], v[:, 1] = -1.0, -1.0 - 2.0**-7
    sign = 1.0 if random.random() < 0.5 else -1.0  # the mirror image works the same
    built = lab.Built(
        q=torch.eye(d).unsqueeze(0),
        k=scores.transpose(-1, -2).contiguous(),
        v=sign * v,
        scores=scores,
        tie_pos=torch.tensor([[0, 1]]),
        row_max=scores[..., 0],
    )
    exact = lab.reference(built)
    tiled = lab.run_case("fa2", built).out
    fused = lab.run_case("fa2-fma", built).out
    assert torch.equal(tiled.double(), to_bf16(exact))
    assert torch.all(tiled == sign * (-1.0 - 2.0**-7))
    assert torch.all(fused == sign * -1.0)
    with pytest.raises(ValueError, match="stable='off'"):
        lab.run_case("fa2-fma", built, stable="cross")


def test_row_max_scan_counts_a_far_off_output_as_wrong():
    # two tied maxima near r_m = 96: the tied P̄ is a BF16 subnormal of a bit or none, yet ℓ
    # (summed in fp32) is not 0: O is neither NaN nor 0, but far off
    r_m = float(np.random.default_rng().choice([94.0, 96.0, 98.0]))
    row = lab.row_max_scan([r_m], ["fa2/cross"], ties=2)["fa2/cross"][0]
    assert row["ell_zero"] == 0.0  # ℓ, summed in fp32, is not 0 yet: no NaN
    assert row["wrong"] == 1.0 and row["same_as_ideal"] == 0.0
