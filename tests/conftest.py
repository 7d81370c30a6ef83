"""Shared test set-up.

Import the book's package first: it switches Triton to its CPU interpreter when there is no GPU,
which must happen before any test module imports triton. Every test runs with poisoned outputs:
kernel output buffers start as NaN, so an entry a kernel forgets to write shows up.
"""

import inspect
import re

import pytest

import kernels  # noqa: F401
from kernels.attention import OFF_VARIABLE, speedups


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Kernel outputs start as NaN (on a GPU too, where it is off by default for speed), and
    whatever a test does to the speed-ups (a benchmark's ``main`` tunes every bucket,
    ``tune_every_bucket``), they are as before afterwards, ``LPFA_OFF`` included."""
    monkeypatch.delenv(OFF_VARIABLE, raising=False)  # restored after the test
    with speedups(poison_outputs=True):
        yield


# A test that asserts bit identity on the CPU must hold whatever BLAS kernel NumPy (OpenBLAS)
# and torch (MKL) pick for this processor: CI runs the tests marked ``bits`` a second time under
# another core type (.ci/run). A test is marked when its own source compares bits.
BIT_COMPARISONS = re.compile(r"torch\.equal\(|array_equal\(|\.tobytes\(\)|bit.for.bit|same bits")


def pytest_collection_modifyitems(items):
    for item in items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            continue
        if BIT_COMPARISONS.search(source):
            item.add_marker(pytest.mark.bits)
