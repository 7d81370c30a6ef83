"""Where a student's answers run: a worker that cannot reach the grades.

For each student the grader makes a fresh temporary directory holding only a copy of that
student's files (read into memory before any of their code runs). Each exercise's worker
process (:mod:`.isolate`), as soon as it is forked and before it runs a line of the student's:

* starts a **session and process group** of its own (killed as a whole when the exercise ends;
  at the end of the student every process of the worker's user is killed too);
* moves into the student's temporary directory (``HOME``, ``TMPDIR`` and Triton's cache too);
* sets **resource limits**: ``RLIMIT_AS`` (``RLIMIT_DATA`` where a GPU is present, as CUDA
  reserves address space), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, and ``RLIMIT_NPROC`` when it runs
  as a user of its own;
* where the grader runs as root: **hides** the book's folder, the autograder and the
  submissions (a mount namespace of its own, ``unshare(CLONE_NEWNS)``, with an empty read-only
  ``tmpfs`` over each, so the solutions and other students' work are on no path it can read;
  folders that hold the Python environment stay visible); leaves the **network** (a new, empty
  network namespace, ``unshare(CLONE_NEWNET)``); and becomes a **user of its own**: a fresh
  uid and gid with no account and no groups, unused by any process, so no other process can be
  signalled and only the student's directory can be written. It keeps one capability,
  ``CAP_DAC_READ_SEARCH`` (read any file it can reach), because the Python environment may sit
  in a directory only root can read
  (``/root/.pyenv``). ``PR_SET_NO_NEW_PRIVS`` stops it regaining more.

:func:`mode` says, once per run, what this machine allowed; the grader prints it and writes it
in the ``isolation`` column of ``grades.csv``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import shutil
import signal
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

MEMORY_MB = int(os.environ.get("LAB_MEMORY_MB", 4096))  # on top of what a worker holds at fork
CPU_SECONDS = int(os.environ.get("LAB_CPU_SECONDS", 300))
FILE_MB = 64
NPROC = 64
EXERCISE_BUDGET = float(os.environ.get("LAB_EXERCISE_BUDGET", 300))  # wall-clock seconds
STUDENT_BUDGET = float(os.environ.get("LAB_STUDENT_BUDGET", 1800))

_CLONE_NEWNET, _CLONE_NEWNS = 0x40000000, 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 1, 2, 4, 1 << 14, 1 << 18
_PR_SET_KEEPCAPS, _PR_SET_NO_NEW_PRIVS = 8, 38
_CAP_DAC_READ_SEARCH = 2
_LIBC = ctypes.CDLL(None, use_errno=True)

# the student being graded: their directory, their deadline
CURRENT: dict = {}
# folders the workers must not see (the book, the autograder, the submissions): set by the grader
HIDDEN: list = []


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _keep_only_read_search() -> None:
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    bit = 1 << _CAP_DAC_READ_SEARCH
    data[0].effective = data[0].permitted = bit
    if _LIBC.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _fresh_uid() -> int:
    used = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            used.add(entry.stat().st_uid)
    uid = 200_000 + os.getpid() % 100_000
    while uid in used:
        uid += 1
    return uid


def hidden_paths(paths) -> list[str]:
    """The folders to hide: each of ``paths``, or, where one holds the Python environment (a
    virtual environment inside the book's folder), its other entries."""
    where = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    python = [Path(p).resolve() for p in where if p]
    out = []
    for path in (Path(p).resolve() for p in paths):
        inside = [p for p in python if p == path or path in p.parents]
        if not inside:
            out.append(str(path))
        elif path not in inside and path.is_dir():
            keep = {path / p.relative_to(path).parts[0] for p in inside}
            out += [str(c) for c in path.iterdir() if c not in keep and c.is_dir()]
    return sorted(set(out))


def _hide(paths) -> None:
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if _LIBC.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    for path in paths:
        flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        if _LIBC.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=4k,mode=0555") != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def enter(workdir: str | None, uid: int | None, network: bool, hide=()) -> None:
    """In the freshly forked worker, before any of the student's code: the isolation above."""
    os.setsid()
    if hide:
        _hide(hide)
    if workdir:
        os.chdir(workdir)
        os.environ.update(HOME=workdir, TMPDIR=workdir, TRITON_CACHE_DIR=f"{workdir}/.triton")
    if network and _LIBC.unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    size = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                size = int(line.split()[1]) * 1024
    memory = resource.RLIMIT_DATA if _gpu() else resource.RLIMIT_AS
    limit = size + (MEMORY_MB << 20)
    resource.setrlimit(memory, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_MB << 20, FILE_MB << 20))
    if uid is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC, NPROC))
        _LIBC.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        _keep_only_read_search()
    _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _gpu() -> bool:
    return os.path.exists("/dev/nvidia0")


def _probe(uid: int | None, network: bool, forbidden: str, hide=()) -> bool:
    """Whether a forked child can enter that isolation, still read the Python environment, and
    not write ``forbidden`` (nor see what is in the folders of ``hide``)."""
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        ok = 1
        try:
            enter(tempfile.gettempdir(), uid, network, hide)
            Path(os.__file__).read_bytes()
            if uid is not None and os.access(forbidden, os.W_OK):
                raise PermissionError
            if any(os.listdir(p) for p in hide):
                raise PermissionError
            ok = 0
        except BaseException:  # noqa: BLE001, S110
            pass
        os._exit(ok)
    return os.waitpid(pid, 0)[1] == 0


@functools.cache
def capabilities(forbidden: str = "/") -> tuple:
    """(uid or None, network off?, hiding folders possible?) for this machine, probed once."""
    root = os.geteuid() == 0
    network = root and _probe(None, True, forbidden)
    probe = tempfile.mkdtemp(prefix="lab-probe-")
    try:
        Path(probe, "x").write_text("x")
        hide = root and _probe(None, False, forbidden, [probe])
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    uid = _fresh_uid() if root else None
    if uid is not None and not _probe(uid, network, forbidden):
        uid = None
    return uid, network, hide


def where() -> tuple:
    """The isolation a worker of the current student enters: :func:`enter`'s arguments."""
    uid, network, hide = capabilities() if CURRENT else (None, False, False)
    return CURRENT.get("dir"), uid, network, hidden_paths(HIDDEN) if hide else []


def mode() -> str:
    """The isolation this machine allows, in words (printed, and written in grades.csv)."""
    uid, network, hide = capabilities()
    who = (
        f"own user (uid {uid}, no account, read-only capability)"
        if uid is not None
        else "the grader's user"
    )
    memory = "DATA" if _gpu() else "AS"
    limits = f"RLIMIT_{memory}/CPU/FSIZE" + ("/NPROC" if uid is not None else "")
    net = "no network" if network else "network reachable"
    seen = "book, autograder and submissions hidden" if hide else "every readable file visible"
    return f"worker: {who}; {seen}; {net}; {limits}; fresh temp dir; process group killed"


def kill_user(uid: int) -> None:
    """SIGKILL every process of ``uid`` (a worker's own user: nothing else runs as it)."""
    for _ in range(20):
        found = False
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        os.kill(int(entry.name), signal.SIGKILL)
                        found = True
        if not found:
            return
        time.sleep(0.05)


@contextlib.contextmanager
def student(name: str, files):
    """The student's temporary directory with a copy of ``files`` ((path, bytes, mtime));
    every worker of theirs is dead, and the directory gone, when this ends."""
    uid = capabilities()[0]
    workdir = tempfile.mkdtemp(prefix="lab-student-")
    try:
        for i, (path, raw, _mtime) in enumerate(files):
            target = Path(workdir) / f"{i:03d}_{Path(path).name}"
            target.write_bytes(raw)
        if uid is not None:
            for p in [workdir, *map(str, Path(workdir).iterdir())]:
                os.chown(p, uid, uid)
        os.chmod(workdir, 0o700)
        CURRENT.update(dir=workdir, deadline=time.monotonic() + STUDENT_BUDGET, student=name)
        yield workdir
    finally:
        CURRENT.clear()
        if uid is not None:
            kill_user(uid)
        shutil.rmtree(workdir, ignore_errors=True)
