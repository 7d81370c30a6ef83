"""A student's answer, run in a process of its own; the grader's checks, run outside it.

The grader never runs student code in its own process. For each exercise it starts a fresh
worker process (forked from a server that has imported the book's package once, so a worker
starts in milliseconds and shares nothing with the others): the worker runs the exercise
setup from the autograder's copy of the chapter, then the student's answer source, taken
from the submitted notebook's cells, and then waits. The check runs in the grader's process
with a :class:`Remote` in place of the student's function: calling it sends the arguments to
the worker, which calls the student's function and sends back the result as plain data (ints,
floats, strings, containers, NumPy arrays, tensors; see :func:`encode`), never as pickled
objects. Whatever the answer patches (``ex.check_merge = ...``, ``ex = stub``,
``kernels.lab.exercises.fail = ...``) is patched in the worker, where no check runs.
"""

from __future__ import annotations

import base64
import io
import json
import linecache
import multiprocessing
import os
import re
import signal
import sys
import time

from . import sandbox

_CTX = None
# seconds one call of the student's function may take (LAB_CALL_TIMEOUT overrides)
CALL_TIMEOUT = float(os.environ.get("LAB_CALL_TIMEOUT", 120))
START_TIMEOUT = CALL_TIMEOUT  # seconds the worker may take to run the setup and the answer

# checks whose function must do its work in a Triton kernel: the worker switches PyTorch's
# reductions off around each call and counts the launches
GUARDS = {"check_row_max": "triton"}


# ----------------------------------------------------------------------------------------------
# values as plain data
# ----------------------------------------------------------------------------------------------
def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def encode(x, depth: int = 0):
    """``x`` as JSON-able plain data; anything else becomes ``["unsupported", type name]``."""
    import numpy as np

    kind = type(x)
    if depth > 30:
        return ["unsupported", "a value nested too deeply"]
    if x is None or kind in (bool, str):
        return ["py", x]
    if kind is int:
        return ["int", str(x)]
    if kind is float:
        return ["float", repr(x)]
    if kind in (tuple, list, set, frozenset):
        return [kind.__name__, [encode(v, depth + 1) for v in x]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    if isinstance(x, np.generic) and np.asarray(x).dtype.kind in "biufc":
        arr = np.asarray(x)
        return ["npscalar", arr.dtype.str, _b64(arr.tobytes())]
    if kind is np.ndarray and x.dtype.kind in "biufc":
        arr = np.ascontiguousarray(x)
        return ["ndarray", arr.dtype.str, list(arr.shape), _b64(arr.tobytes())]
    torch = sys.modules.get("torch")
    if torch is not None and kind in (torch.Tensor, torch.nn.Parameter):
        t = x.detach().cpu()
        name = str(t.dtype).replace("torch.", "")
        size = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if t.numel() and size <= 4 * t.numel() + 1024:
            # a view keeps its storage: a check may put a trap just past the view's end
            base = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (size,), (1,))
            layout = [list(t.stride()), t.storage_offset()]
        else:
            base, layout = t.contiguous().reshape(-1), None
        raw = (base.view(torch.int16) if t.dtype == torch.bfloat16 else base).numpy().tobytes()
        return ["tensor", name, list(t.shape), _b64(raw), layout]
    return ["unsupported", kind.__name__]


_TORCH_DTYPES = {
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
}


class _Opaque:
    """What a value that is not plain data becomes: an object of a class with its type name."""


def decode(obj):
    """The value :func:`encode` made plain; builds only builtins, NumPy arrays and tensors."""
    import numpy as np

    tag, *rest = obj
    if tag == "py":
        value = rest[0]
        if value is None or type(value) in (bool, str):
            return value
    elif tag == "int":
        return int(rest[0])
    elif tag == "float":
        return float(rest[0])
    elif tag in ("tuple", "list", "set", "frozenset"):
        items = [decode(v) for v in rest[0]]
        return {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[tag](items)
    elif tag == "dict":
        return {decode(k): decode(v) for k, v in rest[0]}
    elif tag in ("npscalar", "ndarray"):
        dtype = np.dtype(rest[0])
        if dtype.kind not in "biufc":
            raise ValueError("not a numeric array")
        raw = base64.b64decode(rest[-1])
        if tag == "npscalar":
            return np.frombuffer(raw, dtype=dtype)[0]
        shape = [int(s) for s in rest[1]]
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    elif tag == "tensor":
        import torch

        name, shape, raw = rest[0], [int(s) for s in rest[1]], base64.b64decode(rest[2])
        layout = rest[3] if len(rest) > 3 else None
        if name not in _TORCH_DTYPES:
            raise ValueError("not a tensor dtype")
        dtype = np.dtype("int16" if name == "bfloat16" else name)
        flat = torch.from_numpy(np.frombuffer(raw, dtype=dtype).copy())
        if name == "bfloat16":
            flat = flat.view(torch.bfloat16)
        if layout is None:
            return flat.reshape(shape)
        stride, offset = [int(v) for v in layout[0]], int(layout[1])
        needed = offset + sum((n - 1) * st for n, st in zip(shape, stride)) + 1
        if min(shape, default=1) > 0 and (min(stride, default=0) < 0 or needed > flat.numel()):
            raise ValueError("a tensor view outside its storage")
        return flat.as_strided(shape, stride, offset)
    elif tag == "unsupported":
        name = re.sub(r"\W", "", str(rest[0]))[:40] or "object"
        return type(name, (_Opaque,), {})()
    raise ValueError(f"not plain data: {tag!r}")


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode()


def _loads(raw: bytes):
    return json.loads(raw.decode())


# ----------------------------------------------------------------------------------------------
# the worker
# ----------------------------------------------------------------------------------------------
class _Constants:
    """The checks' module as an answer sees it in the worker: its upper-case constants only."""

    def __init__(self, module):
        for name in dir(module):
            if name.isupper():
                object.__setattr__(self, name, getattr(module, name))


def _run(source: str, namespace: dict, name: str) -> None:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


def _serve(conn, preamble, setup, answer, variable, guard, where=(None, None, False)) -> None:
    """The worker: enter the sandbox (:func:`.sandbox.enter`), run the chapter's imports, the
    setup and the answer, then call the answer for the grader."""
    sys.stdout = sys.stderr = io.StringIO()  # the answer's prints go nowhere
    try:
        sandbox.enter(*where)
    except BaseException as exc:  # noqa: BLE001
        conn.send_bytes(_dumps(["error", "the sandbox failed", str(exc)[:300]]))
        return
    try:
        namespace = {"__name__": "__main__"}
        for statement in preamble.splitlines():  # the imports of the chapter's cells
            try:
                exec(statement, namespace)
            except Exception:  # noqa: BLE001  (not installed here)
                pass
        _run(setup, namespace, "<exercise setup>")
        checks = namespace.get("ex")
        if checks is not None:
            namespace["ex"] = _Constants(checks)
        _run(answer, namespace, "<answer>")
        value = namespace.get(variable)
        if callable(value):
            conn.send_bytes(_dumps(["function"]))
        else:
            conn.send_bytes(_dumps(["value", encode(value)]))
    except BaseException as exc:  # noqa: BLE001  the answer's error
        conn.send_bytes(_dumps(["error", type(exc).__name__, str(exc)[:300]]))
        return
    while True:
        try:
            message = _loads(conn.recv_bytes())
        except EOFError:
            return
        if message[0] != "call":
            return
        args, kwargs = decode(message[1]), decode(message[2])
        launches: list = []
        try:
            if guard == "triton":  # the checks' own switch (chapter 2's ex)
                with checks._triton_only(launches):
                    out = value(*args, **kwargs)
            else:
                out = value(*args, **kwargs)
            reply = ["ok", encode(out), len(launches)]
        except BaseException as exc:  # noqa: BLE001
            reply = ["raised", type(exc).__name__, str(exc)[:300], len(launches)]
        conn.send_bytes(_dumps(reply))


# ----------------------------------------------------------------------------------------------
# the grader's side
# ----------------------------------------------------------------------------------------------
class AnswerDied(RuntimeError):
    """The worker ended, or took too long: the answer is stopped."""


_PRELOAD = {"kernels", "kernels.triton_exercises", "kernels.lab_kit._preload"}
_STATEMENTS: list = []


def preload(statements) -> None:
    """Import statements the worker server runs once, before it forks workers (only before it
    starts: later, a worker runs what it needs itself)."""
    _STATEMENTS.extend(s for s in statements if s and s not in _STATEMENTS)


def _context():
    global _CTX
    if _CTX is None:
        from ..env import REPO_ROOT

        path = os.environ.get("PYTHONPATH", "")
        if str(REPO_ROOT) not in path.split(os.pathsep):
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)
        os.environ["LAB_PRELOAD"] = "\n".join(_STATEMENTS)
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(sorted(_PRELOAD))
    return _CTX


class Answer:
    """A student's answer running in its own worker process: ``value`` is the answer when it is
    not a function, ``function`` a :class:`Remote` when it is; ``error`` says why the answer's
    cells raised, if they did. Use as a context manager: leaving it stops the worker."""

    def __init__(
        self,
        setup: str,
        answer: str,
        variable: str,
        guard: str | None = None,
        call_timeout: float = CALL_TIMEOUT,
        preamble: str = "",
    ):
        now = time.monotonic()
        self.deadline = min(
            now + sandbox.EXERCISE_BUDGET, sandbox.CURRENT.get("deadline", float("inf"))
        )
        if self.deadline <= now:
            raise AnswerDied("time budget: the student's time budget is spent: not run")
        uid, network = sandbox.capabilities() if sandbox.CURRENT else (None, False)
        where = (sandbox.CURRENT.get("dir"), uid, network)
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child, preamble, setup, answer, variable, guard, where),
            daemon=True,
        )
        self._proc.start()
        child.close()
        self.call_timeout = call_timeout
        self.value = self.function = self.error = None
        first = self._receive(START_TIMEOUT, "the answer's cells")
        if first[0] == "error":
            self.error = f"{first[1]}: {first[2]}" if first[2] else first[1]
        elif first[0] == "function":
            self.function = Remote(self, variable)
        else:
            self.value = decode(first[1])

    def _receive(self, timeout: float, what: str):
        left = self.deadline - time.monotonic()
        try:
            if not self._conn.poll(max(0.0, min(timeout, left))):
                self.stop()
                if left <= timeout:
                    raise AnswerDied(
                        f"time budget: {what} ran past the exercise's or the student's "
                        "wall-clock budget: the answer was stopped"
                    )
                raise AnswerDied(
                    f"time budget: {what} took longer than {timeout:g} s: the answer was stopped"
                )
            return _loads(self._conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            self.stop()
            raise AnswerDied(f"{what} ended the answer's process") from None

    def call(self, name: str, args, kwargs):
        if not self._proc.is_alive():
            raise AnswerDied(f"{name} ended the answer's process")
        try:
            self._conn.send_bytes(_dumps(["call", encode(tuple(args)), encode(dict(kwargs))]))
        except (OSError, ValueError):
            raise AnswerDied(f"{name} ended the answer's process") from None
        return self._receive(self.call_timeout, name)

    def stop(self) -> None:
        try:
            self._conn.close()
        except OSError:
            pass
        pid = self._proc.pid
        if pid:  # the worker's process group: it and whatever it started
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Remote:
    """Stands for the student's function in the grader's process: calls go to the worker."""

    def __init__(self, answer: Answer, name: str):
        self._answer, self.__name__ = answer, name
        self.remote_launches: list = []

    def __call__(self, *args, **kwargs):
        reply = self._answer.call(self.__name__, args, kwargs)
        self.remote_launches = [self.__name__] * int(reply[-1])
        if reply[0] == "raised":
            name = re.sub(r"\W", "", reply[1])[:40] or "Exception"
            raise type(name, (Exception,), {})(reply[2])
        return decode(reply[1])
