"""Making a new shape's first call cheap: compiling in parallel, and the stored picks.

* :func:`compile_ahead` compiles several kernels (an autotuner's choices, the backward's
  kernels) in parallel threads; :func:`compile_in_background` does it while the caller goes on
  (the forward pass compiling the backward's kernels), :func:`wait_for_background` waits.
* :func:`stored_table` reads the configurations the GPU benchmark's autotuner chose
  (``results/perf_tuning.json``, written by :mod:`kernels.gpu.perf`), which a launcher uses for a
  family it has never tuned (the ``stored_tuning`` speed-up).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from triton.runtime import _async_compile  # whether an AsyncCompileMode is active

from ...env import RESULTS_DIR
from ...interpreter import interpreting
from . import switches

MAX_COMPILE_THREADS = 16
_BACKGROUND: list = []  # threads compiling ahead (compile_in_background)


def compile_ahead(jobs, minimum=2) -> None:
    """Compile these kernels (:meth:`Launcher.compile_jobs`) in parallel threads, where the
    launches that follow would compile them one after the other; they then find them compiled
    (the ``parallel_compile`` speed-up; CUDA only, two jobs or more). Triton's compiler
    spends its time in C++ passes and in ptxas, neither holding Python's lock, so threads
    overlap: on an H100 host, 36 kernels compiled in 78 s one after the other and in 13 s on
    12 threads. A job that fails here is left for its launch, which raises the error itself."""
    if len(jobs) < minimum or not switches.CURRENT.parallel_compile or interpreting():
        return
    if _async_compile.active_mode.get() is not None:  # the program compiles asynchronously
        return
    workers = max(1, min(len(jobs), os.cpu_count() or 1, MAX_COMPILE_THREADS))
    with ThreadPoolExecutor(workers) as pool:
        compiled = []
        with triton.AsyncCompileMode(pool, ignore_errors=True):
            for kernel, args, grid, kwargs in jobs:
                try:
                    compiled.append((kernel.warmup(*args, grid=grid, **kwargs), device_of(args)))
                except Exception:  # noqa: BLE001 - the launch raises it, with its own message
                    continue
        # each kernel's first launch also loads it onto the GPU and builds its C launcher
        # (the system's C compiler, once per kernel signature): that too, in parallel
        list(pool.map(_load, compiled))


def _load(item) -> None:
    made, device = item
    if hasattr(made, "result"):
        made = made.result(ignore_errors=True)
    init = getattr(made, "_init_handles", None)  # Triton 3.6's CompiledKernel
    if init is None:
        return
    try:
        if device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # a pool thread starts on device 0
        init()
    except Exception:  # noqa: BLE001 - too large for the GPU: the launch says so itself
        return


def compile_in_background(jobs, device=None) -> None:
    """:func:`compile_ahead` in a thread of its own, so the caller goes on (the forward pass
    compiles the backward's kernels this way while it runs itself); a launch that would
    compile the same kernels first waits for it (:func:`wait_for_background`)."""
    if not jobs or not switches.CURRENT.parallel_compile or interpreting():
        return

    def run():
        if device is not None and device.type == "cuda":
            torch.cuda.set_device(device)  # a new thread starts on device 0
        compile_ahead(jobs, minimum=1)

    thread = threading.Thread(target=run, name="lpfa-compile-ahead", daemon=True)
    thread.start()
    _BACKGROUND.append(thread)


def wait_for_background() -> None:
    """Wait until every background compile has finished."""
    while _BACKGROUND:
        _BACKGROUND.pop().join()


def choices_id(tuned) -> str:
    """A short name for the configurations an autotuner chooses among (a hash of their tile
    sizes, warps and stages): a stored pick is used only by an autotuner with the same ones."""
    configs = getattr(tuned, "configs", None) or ()
    text = repr([(sorted(c.kwargs.items()), c.num_warps, c.num_stages) for c in configs])
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def device_of(args):
    """The device of the first tensor among a launch's arguments (None if there is none)."""
    return next((a.device for a in args if isinstance(a, torch.Tensor)), None)


STORED_TUNING = "perf_tuning"  # results/perf_tuning.json, written by python -m kernels.gpu.perf
_STORED: dict = {}  # GPU name -> its table (read once per process)
# Records made before provenance held the compute capability: the GPUs we measured on
KNOWN_CAPABILITIES = {"H100": (9, 0), "H200": (9, 0)}


def record_capability(provenance: dict) -> tuple[int, int] | None:
    """The compute capability of the GPU a record was measured on: from its provenance, or for
    an older record from its GPU's name (:data:`KNOWN_CAPABILITIES`); None if unknown."""
    if provenance.get("capability"):
        major, minor = str(provenance["capability"]).split(".")
        return int(major), int(minor)
    name = provenance.get("gpu") or ""
    return next((cap for model, cap in KNOWN_CAPABILITIES.items() if model in name), None)


def stored_record() -> dict | None:
    """The stored benchmark's record (``results/perf_tuning.json``), None where there is none."""
    try:
        with open(RESULTS_DIR / f"{STORED_TUNING}.json") as f:
            return json.load(f)
    except (OSError, ValueError):  # no stored benchmark here (or not readable)
        return None


def serves(provenance: dict, capability: tuple, gpu: str | None = None) -> bool:
    """Whether picks measured on the GPU of ``provenance`` serve a GPU of this compute
    capability (named ``gpu``): the same model, or the same architecture (an H100's picks
    serve an H200 and back, whose SMs are the same)."""
    same_model = gpu is not None and provenance.get("gpu") == gpu
    return same_model or record_capability(provenance) == tuple(capability)


def stored_table(device) -> dict:
    """The stored benchmark's picks as {family: [(lengths, triton.Config)]} if they serve
    ``device`` (:func:`serves`); else (an A100 or a T4, the CPU, no stored file) empty, and the
    launcher tunes."""
    if device is None or device.type != "cuda":
        return {}
    gpu = torch.cuda.get_device_name(device)
    if gpu not in _STORED:
        record = stored_record()
        here = tuple(torch.cuda.get_device_capability(device))
        fits = record is not None and serves(record.get("provenance", {}), here, gpu)
        _STORED[gpu] = table_of(record["data"]["entries"]) if fits else {}
    return _STORED[gpu]


def table_of(entries) -> dict:
    """{(kernel, choices, compile-time values, dtypes): [(lengths, triton.Config)]} from
    :func:`tuned_entries`' JSON."""
    table: dict = {}
    for e in entries:
        family = (e["kernel"], e["choices"], tuple(sorted(e["consts"].items())), tuple(e["dtypes"]))
        c = e["config"]
        config = triton.Config(c["kwargs"], num_warps=c["num_warps"], num_stages=c["num_stages"])
        table.setdefault(family, []).append((tuple(e["lengths"]), config))
    return table
