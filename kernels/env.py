"""Where is this chapter running, and which numerics path does it take?

Every chapter's first cell calls :func:`setup`. It works in three places:

* a local clone (CPU or GPU),
* Google Colab (the setup cell clones the repository first; this module installs only
  packages Colab lacks and never touches torch),
* CI (no GPU, ``CI=true``).

The decision that matters for the whole book is the *numerics path*:

``gpu-native``
    A CUDA GPU with compute capability >= 8.0 (A100, L4, H100, ...). Triton compiles real
    bf16 instructions: ``tl.dot`` on bf16 tiles, hardware round-to-nearest-even casts.
``gpu-explicit``
    A CUDA GPU older than sm_80 (Colab's free T4 is sm_75). Triton cannot emit bf16 there,
    so bf16 values are carried in fp32 registers and rounded with integer bit arithmetic.
``cpu-emulation``
    No GPU. Kernels run under the Triton interpreter (``TRITON_INTERPRET=1``), which cannot
    do bf16 either (bf16 ``tl.dot`` multiplies raw bit patterns, fp32->bf16 casts truncate),
    so it takes the same explicit-rounding path as the T4, at small sizes.

The interpreter switch must be set before :mod:`triton` is imported; importing
:mod:`kernels` does that (:func:`kernels.interpreter.configure_triton`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

from .interpreter import configure_triton, interpreting
from .results import RESULTS_DIR  # noqa: F401  (defined once, where measurements are read)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Packages a chapter needs beyond torch/triton; installed on Colab only if missing.
_COLAB_EXTRAS = {
    "ml_dtypes": "ml_dtypes",
    "ipywidgets": "ipywidgets",
    "tqdm": "tqdm",
    "matplotlib": "matplotlib",
    "pandas": "pandas",
}


NATIVE_BF16_FROM = (8, 0)  # the compute capability from which Triton emits bf16 instructions


def path_for(capability) -> str:
    """The numerics path of a CUDA GPU of this compute capability ((8, 0): an A100; (7, 5): a
    T4), or of no GPU (None)."""
    if capability is None:
        return "cpu-emulation"
    return "gpu-native" if tuple(capability) >= NATIVE_BF16_FROM else "gpu-explicit"


def _cuda_capability():
    """(major, minor) of GPU 0, or None without a usable CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(0)


def native_bf16() -> bool:
    """True when Triton can compile real bf16 instructions (CUDA sm_80 or newer, no interpreter)."""
    cap = _cuda_capability()
    return (not interpreting()) and path_for(cap) == "gpu-native"


@dataclasses.dataclass(frozen=True)
class Env:
    """What :func:`setup` found. ``small`` tells chapters to use CPU-sized problems."""

    path: str  # 'gpu-native' | 'gpu-explicit' | 'cpu-emulation'
    device: str  # 'cuda' | 'cpu'
    gpu_name: str | None
    capability: tuple | None
    in_colab: bool
    in_ci: bool
    seed: int
    reason: str

    @property
    def small(self) -> bool:
        return self.device == "cpu"

    @property
    def explicit_rounding(self) -> bool:
        return self.path != "gpu-native"

    def pick(self, cpu, gpu):
        """Choose a size: ``cpu`` on the CPU path, ``gpu`` on a GPU."""
        return cpu if self.small else gpu

    @property
    def summary(self) -> str:
        """``reason`` in a few words, for the one line :func:`setup` prints (it must fit the
        site's 88-character column; the book's introduction explains each path in full)."""
        sm = f"sm_{self.capability[0]}{self.capability[1]}: " if self.capability else ""
        if self.path == "cpu-emulation":
            return "Triton interpreter, small sizes"
        if self.path == "gpu-explicit":
            return sm + "bf16 emulated, full sizes"
        return sm + "native bf16, full sizes"


def in_colab() -> bool:
    return "google.colab" in sys.modules


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _install_missing_on_colab() -> list[str]:
    """pip-install the few packages Colab lacks. Never torch or triton."""
    missing = [pkg for mod, pkg in _COLAB_EXTRAS.items() if importlib.util.find_spec(mod) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
    return missing


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def cores_available() -> int:
    """CPU cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


def pin_threads() -> int:
    """Give torch one intra-op thread per available core, and no more: on a busy 2-core machine
    more threads than cores made a chapter run 8 times slower. Returns the thread count."""
    import torch

    n = cores_available()
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work has started: leave it
        pass
    return n


def describe() -> Env:
    """Detect the numerics path without printing or seeding."""
    configure_triton()
    cap = _cuda_capability()
    if cap is None:
        why = (
            "no CUDA GPU: Triton interpreter on the CPU, bf16 rounded explicitly (RNE), small sizes"
        )
        return Env("cpu-emulation", "cpu", None, None, in_colab(), in_ci(), 0, why)
    import torch

    name = torch.cuda.get_device_name(0)
    if interpreting():
        why = f"{name} present but TRITON_INTERPRET=1 was set: interpreter with explicit rounding"
        return Env("cpu-emulation", "cpu", name, cap, in_colab(), in_ci(), 0, why)
    if path_for(cap) == "gpu-native":
        why = f"{name} is sm_{cap[0]}{cap[1]} (>= sm_80): real bf16 instructions, full sizes"
        return Env("gpu-native", "cuda", name, cap, in_colab(), in_ci(), 0, why)
    why = (
        f"{name} is sm_{cap[0]}{cap[1]} (< sm_80, no bf16 in Triton): bf16 carried in fp32 "
        "and rounded explicitly (RNE), full sizes"
    )
    return Env("gpu-explicit", "cuda", name, cap, in_colab(), in_ci(), 0, why)


def setup(seed: int = 0, quiet: bool = False) -> Env:
    """The chapters' setup: detect the path, install Colab extras, seed, print one line."""
    if in_colab():
        _install_missing_on_colab()
    env = dataclasses.replace(describe(), seed=seed)
    pin_threads()
    seed_everything(seed)
    _style_plots()
    if not quiet:
        where = "for this page" if env.in_ci else "on this machine"
        where = "in Colab" if env.in_colab else where
        print(f"Numerics path {where}: {env.path} ({env.summary}); seed = {seed}")
    return env


def _style_plots() -> None:
    """A readable default look for every figure in the book."""
    from .tools import style

    style.install()


def run_module_json(module: str, *args: str, env: dict, what: str, timeout: float = 600):
    """Run ``python -m module args`` in a child process from the repository root with the
    environment ``env``; return the JSON object on the last line of its output and the child's
    stderr (its log), as a pair. A child that fails raises a RuntimeError naming ``what`` it
    was measuring, with the end of its stderr.
    Used where a measurement needs a fresh process (Triton decides once per process whether it
    interprets, and a kernel's specialisation is fixed when it is defined)."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
