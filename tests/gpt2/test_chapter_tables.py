"""The computing helpers of chapter 7's tables (kernels/gpt2/chapter_tables.py, chapter_fixes.py),
on fresh random inputs each run."""

import numpy as np
import pandas as pd

from kernels.gpt2 import chapter_fixes, chapter_tables


def test_spread_numbers_measure_the_spread_and_the_released_fix_above_the_mean():
    rng = np.random.default_rng()
    level = {v: list(rng.uniform(1.0, 3.0, 2)) for v in "UFP"}
    mean = np.mean([level[v] for v in "UFP"], axis=0)
    above = rng.uniform(0.05, 0.5, 2)
    level["Z"] = list(mean * (1 + above))
    numbers = chapter_tables.spread_numbers(level)
    values = np.array([level[v] for v in "UFP"])
    assert np.isclose(numbers["g7_spread"], 100 * (values.max() / values.min() - 1))
    assert np.isclose(numbers["g7_z_lo"], 100 * above.min())
    assert np.isclose(numbers["g7_z_hi"], 100 * above.max())


def test_wq_at_reads_the_first_check_at_or_after_the_step():
    rng = np.random.default_rng()
    steps = np.sort(rng.choice(np.arange(0, 10_000, 100), 20, replace=False))
    wq = rng.uniform(0.5, 5.0, len(steps))
    heads = rng.uniform(0.1, 0.4, (len(steps), 4))
    heads[:, 0] = wq  # the largest head is the one monitor_series reads
    run = {"monitor": [{"step": int(s), "wq_norms": [list(h)]} for s, h in zip(steps, heads)]}
    i = int(rng.integers(1, len(steps)))
    target = int(steps[i - 1]) + 1  # between two checks: the later one
    got = chapter_tables.wq_at(run, target)
    assert got == float(wq[i])


def test_the_offset_rule_goes_nan_where_the_tied_p_underflows_in_bf16():
    rng = np.random.default_rng()
    beta = float(rng.uniform(1.4, 3.0))
    r_m = chapter_fixes.first_nan(beta, np.arange(10.0, 400.0, 1.0))
    expected = chapter_fixes.ZERO_AT["BF16"] / (beta - 1)  # e^{(1-β) r_m} below 2^-134
    # the offset β·r_m is a BF16 number: rounded by up to 2^-8 of itself, which moves the
    # exponent (1 - β) r_m, and so the threshold, by up to β r_m 2^-8 / (β - 1)
    slack = 1.0 + beta * expected * 2.0**-8 / (beta - 1)
    assert r_m is not None and abs(r_m - expected) <= slack, (beta, r_m, expected, slack)


def test_the_released_clamp_normalises_small_rows_and_shrinks_large_ones():
    rng = np.random.default_rng()
    # whole r_m: S is a BF16 number, exact for integers up to 256
    small, large = rng.integers(1, 16, 3), rng.integers(28, 41, 3)
    out = chapter_fixes.released_clamp_curve(np.concatenate([small, large]))
    assert np.allclose(out[:3], 1.0, rtol=2e-2)
    row_sum = sum(np.exp(-large - d) for d in (0, 0, 3, 5, 8))  # P̄ with m = 2 r_m
    assert np.allclose(out[3:], row_sum / 1e-10, rtol=5e-2)


def test_clamp_numbers_find_the_first_drop():
    rng = np.random.default_rng()
    tied = np.arange(18, 42)
    first = int(rng.integers(20, 24))
    out = np.where(tied < first, 1.0, np.exp(-(tied - first + 1.0)))
    numbers = chapter_fixes.clamp_numbers(tied, out)
    assert numbers["g7_clamp_first"] == first
    assert numbers["g7_clamp_26"] == out[tied == 26][0]


def test_departure_numbers_count_amplified_and_real_pairs_apart():
    """Pairs with fewer than 7 bits are amplified, BF16's 7 bits real whatever the run's
    name; among the real ones, FA2 numerics and SDPA flash (the second testbed's W and A) are
    counted apart from the all-BF16 path, whose lag behind ‖W_Q‖ is over the pairs where ‖W_Q‖
    left first."""
    rng = np.random.default_rng()
    amplified = int(rng.integers(2, 6))
    rows = [
        {"failing": f"k4-U-s{i}", "obits": 4, "rows_tied_bf16": 500, "wq": 2_000.0, "explosion": 9}
        for i in range(amplified)
    ]
    lags = rng.integers(1, 30, 3) * 100
    rows += [
        {"failing": f"tb-U-s{i}", "obits": 7, "rows_tied_bf16": 10_000 + lag, "wq": 10_000.0,
         "explosion": 20_000}
        for i, lag in enumerate(lags)
    ]  # fmt: skip
    ties = rng.integers(5, 20, 3) * 100  # FA2 numerics and SDPA flash: ties first
    rows += [
        {"failing": f"tb-{arm}-s{i}", "obits": 7, "rows_tied_bf16": tie, "wq": 15_000.0,
         "explosion": 30_000 if arm == "W" else np.nan}
        for i, (arm, tie) in enumerate(zip("WAA", ties))
    ]  # fmt: skip
    # FA2 numerics with ‖W_Q‖ first: not counted among the ties-first FA2 pairs
    rows.append({"failing": "tb-W-s9", "obits": 7, "rows_tied_bf16": 16_000, "wq": 15_000.0,
                 "explosion": 30_000})  # fmt: skip
    # BF16 on a shorter schedule, named like an amplified run: real, and its ties led
    rows.append({"failing": "k7long-U-s0", "obits": 7, "rows_tied_bf16": 5_200, "wq": 13_500.0,
                 "explosion": np.nan})  # fmt: skip
    rows.append({"failing": "bf16-U-s0", "obits": 7, "rows_tied_bf16": 100, "wq": np.nan,
                 "explosion": np.nan})  # fmt: skip
    numbers = chapter_tables.departure_numbers(pd.DataFrame(rows))
    assert numbers["g7_amp_ties_first"] == numbers["g7_amp_pairs"] == amplified
    assert numbers["g7_real_pairs"] == 8 and numbers["g7_pairs"] == amplified + 8
    assert numbers["g7_real_ties_first"] == 4 and numbers["g7_real_wq_first"] == 4
    assert numbers["g7_paper_pairs"] == 4 and numbers["g7_paper_wq_first"] == 3
    assert numbers["g7_real_lag_lo"] == lags.min() and numbers["g7_real_lag_hi"] == lags.max()
    assert numbers["g7_fa2_pairs"] == 4 and numbers["g7_fa2_ties_first"] == 3
    assert numbers["g7_fa2_tie_lo"] == ties.min() and numbers["g7_fa2_tie_hi"] == ties.max()
    assert numbers["g7_fa2_lead_lo"] == 15_000 - ties.max()
    assert numbers["g7_fa2_lead_hi"] == 15_000 - ties.min()
    assert numbers["g7_sdpa_never"] == 2
