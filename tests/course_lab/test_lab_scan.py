"""The grader's source scan, its plain-data codec, and the checks' modules without answers."""

from __future__ import annotations

import importlib
import inspect
import secrets

import numpy as np
import pytest
import torch
from course_lab_helpers import CHAPTERS, chapter_exercises

import kernels  # noqa: F401  (the Triton interpreter switch, before anything imports triton)
from kernels import exercise_rules as scan
from kernels.course_lab import isolate, notebook

SETUP_NAMES = ("ex", "torch", "triton", "tl", "np", "math")


@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_the_books_solutions_and_blanks_pass_the_scan(number):
    path, nb, _, found = chapter_exercises(number)
    for ex in found:
        text = notebook.source(nb["cells"][ex.answer])
        scan.scan(text, ex.label, SETUP_NAMES)
        scan.scan(notebook.clear_solution(text), ex.label, SETUP_NAMES)


@pytest.mark.parametrize(
    "exercise, source, named",
    [
        (
            "ex-bf16-round-bits",
            "import ml_dtypes\ndef round_bits_to_bf16(b):\n    return ml_dtypes.bfloat16(b)",
            "import ml_dtypes",
        ),
        ("ex-bf16-round-bits", "def round_bits_to_bf16(b):\n    return int(np.float32(b))", "np"),
        ("ch2-rowmax", "def row_max(x):\n    return torch.aminmax(x, dim=1).max", "torch.aminmax"),
        ("ch2-rowmax", "def row_max(x):\n    return x.amax(dim=1)", "x.amax"),
        (
            "ch2-rowmax",
            "def row_max(x):\n    return torch.tensor([max(r) for r in x.tolist()])",
            "max",
        ),
        (
            "ex-golden-w1",
            "from scipy.stats import wasserstein_distance as w\nw1 = w",
            "import scipy.stats",
        ),
        (
            "ch3-merge",
            "def merge(a, b, c, d):\n    return ex._merge_expected(a, b, c, d)",
            "ex._merge_expected",
        ),
        ("ch2-grid", "ex.check_launch_grid = print\nlaunch_grid = None", "ex.check_launch_grid"),
        ("ch3-merge", "import types\nex = types.SimpleNamespace()", "import types"),
        ("ch3-merge", "ex = None", "ex = ..."),
        ("ex-fixes-offset", "torch.where = lambda *a: a", "torch.where"),
        (
            "ex-sources-mirror",
            "import kernels.rounding_lab.exercises as m\nm.fail = print\nmirror = 1",
            "import kernels.rounding_lab.exercises",
        ),
        ("ex-sources-mirror", "mirror = getattr(ex, '_mirror_sign')()", "getattr"),
        ("ex-gpt2-tokens", "minutes = (lambda s: s).__globals__", ".__globals__"),
        (
            "ch2-grid",
            "launch_grid = torch.sys.modules['kernels.triton_exercises']._launch_grid_expected",
            "torch.sys",
        ),
        ("ch3-causal-tiles", "key_tiles = np.os.system", "np.os"),
        (
            "ch4-dk",
            "def dk_gap(p, q, a, b, al):\n    q.requires_grad_()\n    q.sum().backward()",
            "q.sum().backward",
        ),
    ],
)
def test_forbidden_calls_and_patching_are_named(exercise, source, named):
    with pytest.raises(scan.Forbidden) as err:
        scan.scan(source, exercise, SETUP_NAMES)
    assert f"`{named}`" in str(err.value) and f"exercise {exercise}" in str(err.value)


def test_reductions_are_allowed_inside_the_triton_kernel():
    source = (
        "@triton.jit\ndef k(x_ptr, o_ptr, B: tl.constexpr):\n"
        "    tl.store(o_ptr, tl.max(tl.load(x_ptr + tl.arange(0, B)), axis=0))\n"
    )
    scan.scan(source, "ch2-rowmax", SETUP_NAMES)
    with pytest.raises(scan.Forbidden):
        scan.scan(
            source + "def row_max(x):\n    return x.max(1).values\n", "ch2-rowmax", SETUP_NAMES
        )


def test_values_cross_between_processes_as_plain_data_only():
    rng = np.random.default_rng(secrets.randbits(62))
    values = [
        None,
        True,
        3,
        2**80,
        1.5,
        float("inf"),
        "s",
        (1, [2.0, {3}]),
        {"a": (4,)},
        rng.normal(size=(3, 4)),
        np.int64(rng.integers(1, 9)),
        np.float32(0.25),
        torch.randn(2, 3, dtype=torch.float64),
        torch.randn(5).bfloat16(),
        torch.tensor([True, False]),
        rng.integers(0, 9, 7).astype(np.uint16),
    ]
    for value in values:
        back = isolate.decode(isolate.encode(value))
        assert type(back) is type(value)
        if isinstance(value, torch.Tensor):
            assert back.dtype == value.dtype and torch.equal(back, value)
        elif isinstance(value, np.ndarray):
            assert back.dtype == value.dtype and np.array_equal(back, value)
        else:
            assert back == value or (back != back and value != value)

    # a view crosses with its storage: what lies past its end (a check's trap) is still there
    buffer = torch.randn(5, 4, dtype=torch.float64)
    view = isolate.decode(isolate.encode(buffer[:3]))
    assert torch.equal(view, buffer[:3])
    assert torch.equal(view.as_strided((20,), (1,), 0), buffer.reshape(-1))
    transposed = buffer.T
    assert torch.equal(isolate.decode(isolate.encode(transposed)), transposed)

    class Sneaky:
        def __eq__(self, other):
            return True

    back = isolate.decode(isolate.encode(Sneaky()))
    assert type(back).__name__ == "Sneaky" and back != 1  # an opaque stand-in
    with pytest.raises(ValueError):
        isolate.decode(["ndarray", "|O", [1], ""])  # no object arrays
    with pytest.raises(ValueError):
        isolate.decode(["pickle", "..."])


MODULES = [
    "kernels.numerics.exercises",
    "kernels.triton_exercises",
    "kernels.attention.exercises",
    "kernels.rounding_lab.exercises",
    "kernels.gpt2.exercises",
    "kernels.golden.exercises",
    "kernels.monitor.exercises",
    "kernels.gpu.exercises",
]


@pytest.mark.parametrize("name", MODULES)
def test_no_public_function_of_a_checks_module_returns_an_answer(name):
    module = importlib.import_module(name)
    own = [
        n
        for n, f in vars(module).items()
        if inspect.isfunction(f) and f.__module__ == name and not n.startswith("_")
    ]
    assert own and all(n.startswith("check_") for n in own), own


def test_a_check_refuses_a_forbidden_call_in_the_notebook_already():
    """The checks scan the reader's function where Python finds its source: a forbidden call
    fails in the notebook, not only when graded; a function without source is not scanned."""
    from kernels.exercise_rules import WrongAnswer
    from kernels.golden import exercises as golden
    from kernels.numerics import exercises as numerics

    def round_bits_to_bf16(bits32):
        import ml_dtypes

        x = np.array([bits32], dtype=np.uint32).view(np.float32)
        return int(x.astype(ml_dtypes.bfloat16).view(np.uint16)[0])

    with pytest.raises(
        WrongAnswer, match="`import ml_dtypes` is not allowed in exercise ex-bf16-round-bits"
    ):
        numerics.check_round_bits(round_bits_to_bf16)

    def w1(a, b):
        from scipy.stats import wasserstein_distance

        return wasserstein_distance(a, b)

    with pytest.raises(
        WrongAnswer, match="`import scipy.stats` is not allowed in exercise ex-golden-w1"
    ):
        golden.check_w1(w1)
    golden.check_w1(eval("lambda a, b: float(np.mean(np.abs(np.sort(a) - np.sort(b))))"))
