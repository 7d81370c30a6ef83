"""A student's answer, run in a process of its own; the grader's checks, run outside it.

The grader never runs student code in its own process. For each exercise it starts a fresh
worker process, forked from a server (:mod:`.worker`) that has imported the chapters' libraries
once, never the book's package, so a worker starts in milliseconds and shares nothing with the
others. The worker gets the exercise setup as plain data (the modules it imports and the
upper-case constants of the checks' module ``ex``, from the autograder's copy of the chapter),
runs the student's answer source, taken from the submitted notebook's cells, and waits. The
check runs in the grader's process with a :class:`Remote` in place of the student's function:
calling it sends the arguments to the worker, which calls the student's function and sends back
the result as plain data (ints, floats, strings, containers, NumPy arrays, tensors; see
:func:`.codec.encode`), never as pickled objects. Whatever the answer patches
(``ex.check_merge = ...``, ``ex = stub``) is patched in the worker, where no check runs and no
check, reference or solution was ever loaded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
from multiprocessing.connection import Connection
from pathlib import Path

from . import sandbox
from .codec import decode, encode

__all__ = ["Answer", "AnswerDied", "Remote", "decode", "encode", "preload", "worker_setup"]

# seconds one call of the student's function may take (LAB_CALL_TIMEOUT overrides)
CALL_TIMEOUT = float(os.environ.get("LAB_CALL_TIMEOUT", 120))
START_TIMEOUT = CALL_TIMEOUT  # seconds the worker may take to run the setup and the answer
REPLY_MB = int(os.environ.get("LAB_REPLY_MB", 64))  # the most one reply of a worker may hold
SERVER_START_TIMEOUT = 300.0  # seconds the server may take to import the chapters' libraries

# checks whose function must do its work in a Triton kernel: the worker switches PyTorch's
# reductions off around each call and counts the launches
GUARDS = {"check_row_max": "triton"}
WORKER = Path(__file__).with_name("worker.py")


def _dumps(obj) -> bytes:
    return json.dumps(obj).encode()


def _loads(raw: bytes):
    return json.loads(raw.decode())


def worker_setup(namespace: dict) -> dict:
    """The exercise setup as the worker gets it, from the namespace the setup made in the
    grader: the modules it binds (not the book's) by name, and ``ex``'s upper-case constants."""
    modules = {
        name: value.__name__
        for name, value in namespace.items()
        if isinstance(value, types.ModuleType) and not value.__name__.startswith("kernels")
    }
    checks = namespace.get("ex")
    names = [n for n in dir(checks) if n.isupper() and not n.startswith("_")] if checks else []
    constants = {n: getattr(checks, n) for n in names}
    return {"modules": modules, "constants": encode(constants)}


class AnswerDied(RuntimeError):
    """The worker ended, or took too long: the answer is stopped."""


_STATEMENTS: list = []
_SERVER: dict = {}


def preload(statements) -> None:
    """Import statements the worker server runs once, before it forks workers (only before it
    starts: later, a worker runs what it needs itself)."""
    _STATEMENTS.extend(s for s in statements if s and s not in _STATEMENTS)


def _start_server() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ, LAB_PRELOAD="\n".join(_STATEMENTS))
    proc = subprocess.Popen(
        [sys.executable, "-I", "-B", str(WORKER), str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    theirs.close()
    _SERVER.update(proc=proc, control=ours)


def _stop_server() -> None:
    if _SERVER:
        _SERVER["control"].close()
        _SERVER["proc"].kill()
        _SERVER["proc"].wait()
        _SERVER.clear()


def _spawn() -> tuple[int, Connection]:
    """A fresh worker: (its pid, the grader's end of its socket); the server is restarted if an
    answer killed it."""
    for _attempt in range(2):
        if not _SERVER or _SERVER["proc"].poll() is not None:
            _stop_server()
            _start_server()
        ours, theirs = socket.socketpair()
        control = _SERVER["control"]
        try:
            socket.send_fds(control, [b"job"], [theirs.fileno()])
            control.settimeout(SERVER_START_TIMEOUT)
            reply = control.recv(32)
            control.settimeout(None)
            if reply:
                return int(reply), Connection(ours.detach())
        except (OSError, ValueError):
            pass
        finally:
            theirs.close()
        ours.close()
        _stop_server()
    raise AnswerDied("the worker server could not start a worker")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Answer:
    """A student's answer running in its own worker process: ``value`` is the answer when it is
    not a function, ``function`` a :class:`Remote` when it is; ``error`` says why the answer's
    cells raised, if they did. Use as a context manager: leaving it stops the worker."""

    def __init__(
        self,
        setup: dict,
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
        where = sandbox.where()
        self._pid, self._conn = _spawn()
        job = {
            "where": list(where),
            "preamble": [line for line in preamble.splitlines() if line.strip()],
            "answer": answer,
            "variable": variable,
            "guard": guard,
            **setup,
        }
        try:
            self._conn.send_bytes(_dumps(job))
        except OSError:
            self.stop()
            raise AnswerDied("the answer's process ended before it started") from None
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
            return _loads(self._conn.recv_bytes(REPLY_MB << 20))
        except OSError as exc:
            self.stop()
            if "bad message length" in str(exc):
                raise AnswerDied(f"{what} sent back more than {REPLY_MB} MiB of data") from None
            raise AnswerDied(f"{what} ended the answer's process") from None
        except (EOFError, ValueError):
            self.stop()
            raise AnswerDied(f"{what} ended the answer's process") from None

    def call(self, name: str, args, kwargs):
        if not _alive(self._pid):
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
        for kill in (os.killpg, os.kill):  # the worker's process group, then the worker
            try:
                kill(self._pid, signal.SIGKILL)
            except OSError:
                pass

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
