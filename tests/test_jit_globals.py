"""Every Triton kernel, the book's and the tests', compiles on a GPU as it runs in the interpreter.

The CPU interpreter lets a ``@triton.jit`` function read any module-level value; the GPU compiler
reads only ``tl.constexpr`` globals and refuses a plain ``int`` (``Cannot access global variable``).
A kernel that passed every CPU test once failed on the GPU for that reason, so this test reads
each kernel's globals and names the ones the compiler would refuse.
"""

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

import triton.language as tl

import kernels

ROOT = Path(__file__).resolve().parents[1]
PLAIN_VALUES = (bool, int, float, str)


def _names_read(code):
    """Global names a function's code reads, nested functions and comprehensions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_read(const)
    return names


def _modules_with_kernels():
    for info in pkgutil.walk_packages(kernels.__path__, "kernels."):
        source = Path(importlib.util.find_spec(info.name).origin or "")
        if source.suffix == ".py" and "@triton.jit" in source.read_text():
            yield info.name, importlib.import_module(info.name)
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name != Path(__file__).name and "@triton.jit" in path.read_text():
            name = "jit_globals_" + "_".join(path.relative_to(ROOT).with_suffix("").parts)
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.parent))  # as pytest imports it: helpers beside it
            try:
                spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))
            yield str(path.relative_to(ROOT)), module


def _kernels_of(module):
    for value in vars(module).values():
        fn = getattr(value, "fn", None)
        if callable(fn) and hasattr(fn, "__code__") and type(value).__module__.startswith("triton"):
            yield fn


def refused_globals(fn):
    """The module-level values ``fn`` reads that the GPU compiler would refuse."""
    return sorted(
        name
        for name in _names_read(fn.__code__)
        if isinstance(fn.__globals__.get(name), PLAIN_VALUES)  # a tl.constexpr is none of these
    )


def test_the_check_sees_a_plain_global():
    """The check itself: a kernel body that reads a plain int is flagged, a constexpr is not."""
    scope = {"PLAIN": 2, "WRAPPED": tl.constexpr(2)}
    exec("def body(x):\n    return x + PLAIN + WRAPPED\n", scope)
    assert refused_globals(scope["body"]) == ["PLAIN"]


def test_no_kernel_reads_a_global_the_gpu_compiler_refuses():
    found = {}
    checked = 0
    for where, module in _modules_with_kernels():
        for fn in _kernels_of(module):
            checked += 1
            refused = refused_globals(fn)
            if refused:
                found[f"{where}.{fn.__name__}"] = refused
    assert checked >= 20, f"only {checked} Triton kernels found: the search lost some"
    assert not found, (
        "these kernels read plain module-level values, which compile in the interpreter but not "
        f"on a GPU (pass them as tl.constexpr arguments or wrap them in tl.constexpr): {found}"
    )
