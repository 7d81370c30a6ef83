"""Tests for kernels/numerics/rounding.py's torch rounding of fp64 values (fresh draws each run)."""

import numpy as np
import torch

from kernels import numerics as B
from kernels.numerics.rounding import round_to_dtype


def test_round_to_dtype_rounds_fp64_once():
    x = torch.tensor([1 + 2**-8 + 2**-40, 1 + 2**-8 - 2**-40, 1 + 2**-8], dtype=torch.float64)
    assert x.to(torch.bfloat16).tolist() == [1.0, 1.0, 1.0]  # torch's cast rounds twice
    assert round_to_dtype(x, torch.bfloat16).tolist() == [1.0078125, 1.0, 1.0]
    rng = np.random.default_rng()
    for low, fmt in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        f = B.get_format(fmt)
        base = B.round_to(rng.standard_normal(4000) * np.exp2(rng.uniform(-8, 8, 4000)), f)
        half = B.ulp(base, f) / 2  # bf16 midpoints, then a hair (below fp32's reach) either side
        nudge = (
            rng.choice([-1.0, 0.0, 1.0], base.size)
            * np.abs(base)
            * 2.0 ** -rng.integers(26, 50, base.size)
        )
        x = np.concatenate([base + half + nudge, rng.standard_normal(4000) * 1e3])
        got = round_to_dtype(torch.from_numpy(x), low).numpy()
        np.testing.assert_array_equal(got, B.round_to(x, f))
    exact32 = torch.randn(1000).double()  # values already in fp32: the plain cast
    assert torch.equal(round_to_dtype(exact32, torch.bfloat16), exact32.to(torch.bfloat16).double())
    odd = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e300, 1e-300], dtype=torch.float64)
    got = round_to_dtype(odd, torch.bfloat16)
    assert got[:3].tolist() == [0.0, 0.0, float("inf")] and got[3].isnan()
    assert got[4] == float("inf") and got[5] == 0.0
