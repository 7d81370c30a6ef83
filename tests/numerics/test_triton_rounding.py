"""kernels.numerics.triton_rounding: the Triton bf16 round-to-nearest-even helper against torch's
own cast.

Runs in the interpreter on the CPU and natively on a GPU (gpu_check runs it there too, where
both the explicit helper and the hardware cast are checked).
"""

from __future__ import annotations

import pytest
import torch

import kernels  # noqa: F401  (sets up the interpreter before triton is imported)
from kernels.env import native_bf16
from kernels.numerics.triton_rounding import round_tensor

DEVICE = "cuda" if native_bf16() else "cpu"
PATHS = [True, False] if native_bf16() else [True]


def torch_bits(x):
    return x.to(torch.bfloat16).to(torch.float32).view(torch.int32)


def same_as_torch(x, explicit):
    got = round_tensor(x, explicit=explicit).view(torch.int32)
    want = torch_bits(x)
    both_nan = torch.isnan(got.view(torch.float32)) & torch.isnan(want.view(torch.float32))
    return (got == want) | both_nan


@pytest.mark.parametrize("explicit", PATHS)
def test_random_bit_patterns_round_like_torch(explicit):
    # every fp32 bit pattern is fair game: normals, subnormals, infinities, NaNs
    n = 2_000_000 if DEVICE == "cuda" else 200_000
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device=DEVICE)
    x = bits.view(torch.float32)
    ok = same_as_torch(x, explicit)
    assert ok.all(), f"{(~ok).sum().item()} of {n} values differ, e.g. {x[~ok][:4].tolist()}"


@pytest.mark.parametrize("explicit", PATHS)
def test_ties_go_to_even(explicit):
    # values exactly halfway between two bf16 numbers: 1 + 2^-8 lies between 1 and 1 + 2^-7
    base = torch.randn(10_000, device=DEVICE).to(torch.bfloat16).to(torch.float32)
    halfway = (base.view(torch.int32) + 0x8000).view(torch.float32)
    ok = same_as_torch(halfway, explicit)
    assert ok.all()
    # and the rounding really went to the neighbour with an even last bit
    kept = round_tensor(halfway, explicit=explicit).view(torch.int32) >> 16
    finite = torch.isfinite(halfway)
    assert ((kept[finite] & 1) == 0).all()


@pytest.mark.parametrize("explicit", PATHS)
def test_special_values(explicit):
    big = torch.finfo(torch.float32).max
    x = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            -float("inf"),
            float("nan"),
            big,
            -big,
            1e-40,
            -1e-45,
            3.3895314e38,
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
        ],
        device=DEVICE,
    )
    got = round_tensor(x, explicit=explicit)
    assert torch.isnan(got[4])
    assert torch.equal(
        got[[0, 1, 2, 3, 5, 6]].cpu(),
        torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("inf"), -float("inf")]),
    )
    assert torch.signbit(got[1]) and not torch.signbit(got[0])
    assert got[10].item() == 1.0 and got[11].item() == 1.0 + 4 * 2**-8  # ties to even
    assert same_as_torch(x, explicit).all()


def test_round_tensor_rejects_bad_input():
    with pytest.raises(TypeError, match="float32"):
        round_tensor(torch.zeros(4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="torch.Tensor"):
        round_tensor([1.0, 2.0])
