"""How far ``q`` travels from ``flash_attention(q, k, v)`` to the Triton launch.

A profiler hook follows every call of the book's own code that receives ``q`` (the tensor, a
view of its memory, or a tuple holding one) and stops at the first such call inside Triton:
the launch. Along the way it records which project file ``q`` is in after each call and
return. The counts say how much a reader must follow to get from the chapter's call to the
kernel: the files ``q`` visits, the crossings between them (a call into another file, or a
return out of one), and the project frames on the stack at the launch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import kernels
from kernels.attention import flash_attention
from kernels.env import native_bf16

PACKAGE = Path(kernels.__file__).resolve().parent
TRITON = Path(sys.modules["triton"].__file__).resolve().parent

MAX_FILES = 4  # the files q passes through, the launcher included
MAX_CROSSINGS = 10


def _holds(value, address, depth=0) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() > 0 and value.data_ptr() == address
    if depth < 1 and isinstance(value, (tuple, list)):
        return any(_holds(item, address, depth + 1) for item in value)
    return False


def _receives(frame, address) -> bool:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if code.co_flags & 0x04:  # *args
        names += (code.co_varnames[code.co_argcount + code.co_kwonlyargcount],)
    return any(_holds(frame.f_locals.get(name), address) for name in names)


def trace_call_path(q, k, v, **options) -> dict:
    """``flash_attention(q, k, v, **options)``, following ``q`` to the launch: the files it
    visits (in order of first visit), the crossings, the project frames at the launch and the
    project calls that received it."""
    address = q.data_ptr()
    stack: list = []  # project frames holding q, innermost last: their files
    path: list = []  # the file q is in after each change
    every: list = []  # the project frames on the stack, whether they hold q or not
    touched: list = []  # the file the innermost project frame is in, after each change
    state = dict(frames=None, calls=0, all_calls=0)

    def place(trail, file):
        if not trail or trail[-1] != file:
            trail.append(file)

    def hook(frame, event, arg):
        if state["frames"] is not None or event not in ("call", "return"):
            return
        file = Path(frame.f_code.co_filename).resolve()
        if event == "call" and file.is_relative_to(TRITON) and _receives(frame, address):
            state["frames"] = len(stack)  # the launch: stop following
            return
        if not file.is_relative_to(PACKAGE):
            return
        name = str(file.relative_to(PACKAGE.parent))
        if event == "call":
            every.append((frame, name))
            state["all_calls"] += 1
            place(touched, name)
            if _receives(frame, address):
                stack.append((frame, name))
                state["calls"] += 1
                place(path, name)
            return
        if every and every[-1][0] is frame:
            every.pop()
            if every:
                place(touched, every[-1][1])
        if stack and stack[-1][0] is frame:
            stack.pop()
            if stack:
                place(path, stack[-1][1])

    sys.setprofile(hook)
    try:
        flash_attention(q, k, v, **options)
    finally:
        sys.setprofile(None)
    return dict(
        files=list(dict.fromkeys(path)),
        crossings=len(path) - 1,
        frames=state["frames"],
        calls=state["calls"],
        path=path,
        touched=list(dict.fromkeys(touched)),
        all_crossings=len(touched) - 1,
        all_calls=state["all_calls"],
        all_frames=len(every),
    )


def test_q_reaches_the_launch_through_few_files():
    """The chapter's call, first with a new shape (planning the launch) and then cached: ``q``
    passes through at most four files with at most ten crossings on its way to the kernel,
    and a cached call runs no project code outside those four files."""
    torch.manual_seed(0)
    device = "cuda" if native_bf16() else "cpu"
    q, k, v = (torch.randn(1, 2, 80, 32, dtype=torch.bfloat16, device=device) for _ in range(3))
    tiles = dict(block_m=64, block_n=64)  # fixed, so a GPU does not autotune here
    first = trace_call_path(q, k, v, causal=True, **tiles)
    cached = trace_call_path(q, k, v, causal=True, **tiles)
    for seen in (first, cached):
        assert seen["frames"] is not None, "the launch was not reached"
        assert len(seen["files"]) <= MAX_FILES, seen["path"]
        assert seen["crossings"] <= MAX_CROSSINGS, seen["path"]
    assert cached["touched"] == cached["files"], cached["touched"]
    assert cached["all_crossings"] <= MAX_CROSSINGS, cached["touched"]
    assert cached["files"][-1] == "kernels/attention/launcher/plans.py"  # one call reaches it


def test_nothing_outside_attention_reaches_into_the_launcher():
    """Code outside ``kernels/attention/`` (the package and the chapters' code cells) uses
    the names :mod:`kernels.attention` exports, never the launcher's modules."""
    import json
    import re

    reaching = re.compile(r"attention\.launcher|attention import[^\n]*\blauncher\b")
    sources = {
        path: path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
        if not path.is_relative_to(PACKAGE / "attention")
    }
    for path in sorted((PACKAGE.parent / "book").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        sources[path] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert len(sources) > 50
    for path, text in sources.items():
        assert not reaching.search(text), f"{path}: import from kernels.attention instead"


def test_one_environment_variable_switches_speedups():
    """``LPFA_OFF`` is the package's only ``LPFA_*`` variable."""
    import re

    from kernels.attention import OFF_VARIABLE

    named = set()
    for path in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"LPFA_[A-Z_]+", path.read_text(encoding="utf-8")))
    assert named == {OFF_VARIABLE} == {"LPFA_OFF"}
