"""Chapter 2's teaching kernels (kernels/triton_intro.py) against torch (the exercise checks are
tested in tests/course_lab)."""

import kernels  # noqa: F401,I001  first: without a GPU it turns on the interpreter before triton loads

import pytest
import torch

from kernels import triton_intro as ti
from kernels.tools.source import source_of
from kernels.env import native_bf16

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 255, 256, 1000])
def test_vector_add_matches_torch(n):
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    assert torch.equal(ti.vector_add(x, y, block=128), x + y)


@pytest.mark.parametrize("shape", [(1, 1), (5, 37), (3, 256), (2, 300)])
def test_row_softmax_close_to_fp64(shape):
    x = torch.randn(shape, device=DEVICE) * 5
    want = torch.softmax(x.double(), dim=1)
    got = ti.row_softmax(x)
    assert not got.isnan().any()
    assert (got.double() - want).abs().max().item() < 1e-6


def test_row_softmax_large_scores_do_not_overflow():
    x = torch.tensor([[1000.0, 999.0, -1000.0]], device=DEVICE)
    got = ti.row_softmax(x).double()
    assert torch.allclose(got, torch.softmax(x.double(), 1), atol=1e-7)


def test_tile_dot_upcast_is_exact_products():
    a = torch.randn(16, 32, device=DEVICE).bfloat16()
    b = torch.randn(32, 32, device=DEVICE).bfloat16()
    want = a.double() @ b.double()
    got = ti.tile_dot(a, b, upcast=True).double()
    assert (got - want).abs().max().item() < 1e-4  # fp32 accumulation of exact products


def test_tile_dot_native_bf16():
    """On a GPU >= sm_80 the native bf16 dot is right; the interpreter returns garbage."""
    a = torch.randn(16, 16, device=DEVICE).bfloat16()
    b = torch.randn(16, 16, device=DEVICE).bfloat16()
    want = a.double() @ b.double()
    if native_bf16():
        assert (ti.tile_dot(a, b, upcast=False).double() - want).abs().max().item() < 1e-4
    elif DEVICE == "cpu":
        assert ti.tile_dot(a, b, upcast=False).abs().max().item() > 1e6  # the documented trap
    else:  # pre-sm_80 GPU (a T4): Triton cannot compile a bf16 dot at all, and must say so
        # ptxas refuses cvt.bf16.f32 below sm_80 (TritonError: PTXASError or CompilationError)
        from triton.runtime.errors import TritonError

        with pytest.raises(TritonError):
            ti.tile_dot(a, b, upcast=False)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: ti.vector_add(torch.zeros(3), torch.zeros(4)),
        lambda: ti.vector_add(torch.zeros(3), torch.zeros(3), block=100),
        lambda: ti.row_softmax(torch.zeros(3)),
        lambda: ti.tile_dot(torch.zeros(16, 16), torch.zeros(16, 16), upcast=True),
        lambda: ti.tile_dot(
            torch.zeros(16, 8).bfloat16(), torch.zeros(8, 16).bfloat16(), upcast=True
        ),
        lambda: source_of(ti.add_kernel, start="no such line"),
    ],
)
def test_bad_input_is_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        bad()


def test_source_of_cuts_a_piece():
    piece = source_of(ti.softmax_kernel, start="row_max =", stop="tl.sum")
    assert piece.lstrip().startswith("row_max") and "tl.sum" in piece.splitlines()[-1]
