"""The process that forks the workers where students' answers run; it never imports the book.

The grader (:mod:`.isolate`) starts it as a script, ``python -I worker.py <fd>``: ``-I`` keeps
the script's folder, the user's site-packages and ``PYTHON*`` variables off its path, so the
folder that holds the book's package is not on it, and an import of ``kernels`` (installed or
not) fails: a finder placed first on ``sys.meta_path`` refuses it. The script loads four files
by their paths, as modules of their own, never through the package (so ``kernels`` is not in
``sys.modules``): :mod:`.codec` (values as plain data), :mod:`.sandbox` (the isolation a worker
enters), ``kernels/reduction_guard.py`` (the guard of exercise ``ch2-rowmax``, the check's own) and
``kernels/interpreter.py`` (only for :func:`configure_triton`: Triton's CPU interpreter and
its fixes, as the notebooks have them; it holds no check and no answer).
It then runs the import statements of the chapters' cells once (``LAB_PRELOAD``), so that no
worker repeats a slow import.

For each answer the grader sends, over the socket ``<fd>``, the end of a fresh socket pair;
this process forks a worker, which reads the job from that socket: the chapter's import
statements, the exercise setup as plain data (module names, and the upper-case constants of the
checks' module ``ex``: never the module), the answer's source and the name it must define. The
worker enters the sandbox, runs them, and calls the answer's function for the grader, values
crossing as plain data. The checks and the references stay in the grader's process.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import linecache
import os
import signal
import socket
import sys
from multiprocessing.connection import Connection

HERE = os.path.dirname(os.path.abspath(__file__))


class NoBook:
    """A finder that refuses the book's package."""

    def find_spec(self, name, path=None, target=None):
        if name == "kernels" or name.startswith("kernels."):
            raise ImportError("the book's package is not available where answers run")
        return None


def load(name: str, path: str):
    """The module in the file ``path``, loaded under ``name`` (no package, no relative import)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Constants:
    """The checks' module ``ex`` as an answer sees it: its upper-case constants only."""

    def __init__(self, values: dict):
        for name, value in values.items():
            object.__setattr__(self, name, value)


def _run(source: str, namespace: dict, name: str) -> None:
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)


def _send(conn, message) -> None:
    conn.send_bytes(json.dumps(message).encode())


def serve(conn, codec, sandbox, guard) -> None:
    """One worker: read the job, enter the sandbox, run the answer, answer calls."""
    job = json.loads(conn.recv_bytes().decode())
    sys.stdout = sys.stderr = io.StringIO()  # the answer's prints go nowhere
    try:
        sandbox.enter(*job["where"])
    except BaseException as exc:  # noqa: BLE001
        _send(conn, ["error", "the sandbox failed", str(exc)[:300]])
        return
    try:
        namespace = {"__name__": "__main__"}
        for statement in job["preamble"]:  # the imports of the chapter's cells
            try:
                exec(statement, namespace)
            except Exception:  # noqa: BLE001, S110  (not installed here)
                pass
        for name, module in job["modules"].items():
            namespace[name] = importlib.import_module(module)
        namespace["ex"] = Constants(codec.decode(job["constants"]))
        _run(job["answer"], namespace, "<answer>")
        value = namespace.get(job["variable"])
        if callable(value):
            _send(conn, ["function"])
        else:
            _send(conn, ["value", codec.encode(value)])
    except BaseException as exc:  # noqa: BLE001  the answer's error
        _send(conn, ["error", type(exc).__name__, str(exc)[:300]])
        return
    while True:
        try:
            message = json.loads(conn.recv_bytes().decode())
        except (EOFError, OSError, ValueError):
            return
        if message[0] != "call":
            return
        args, kwargs = codec.decode(message[1]), codec.decode(message[2])
        launches: list = []
        try:
            if job["guard"] == "triton":
                with guard.triton_only(launches):
                    out = value(*args, **kwargs)
            else:
                out = value(*args, **kwargs)
            reply = ["ok", codec.encode(out), len(launches)]
        except BaseException as exc:  # noqa: BLE001
            reply = ["raised", type(exc).__name__, str(exc)[:300], len(launches)]
        _send(conn, reply)


def main(fd: int) -> None:
    sys.meta_path.insert(0, NoBook())
    codec = load("lab_codec", os.path.join(HERE, "codec.py"))
    sandbox = load("lab_sandbox", os.path.join(HERE, "sandbox.py"))
    interpreter = os.path.join(os.path.dirname(HERE), "interpreter.py")
    load("lab_triton_interpreter", interpreter).configure_triton()
    guard = load("lab_reduction_guard", os.path.join(os.path.dirname(HERE), "reduction_guard.py"))
    for statement in os.environ.get("LAB_PRELOAD", "").splitlines():
        try:
            exec(statement, {})
        except Exception:  # noqa: BLE001, S110  (not installed here: the answer will say)
            pass
    control = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped as they end
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 16, 1)
        except OSError:
            return
        if not fds:  # the grader is gone
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                serve(Connection(fds[0]), codec, sandbox, guard)
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(fds[0])
        control.sendall(str(pid).encode())


if __name__ == "__main__":
    main(int(sys.argv[1]))
