"""GPU measurements live under ``results/`` as JSON, each with its provenance.

A chapter that cannot measure something on the machine it runs on (a GPU speed, a long
training run) loads the stored file instead and says so. Every file records the GPU, the
torch and triton versions, the date and the exact command that produced it.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import sys

from .env import RESULTS_DIR


def provenance(command: str) -> dict:
    """Where and how a measurement was taken."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a requirement
        triton_version = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    capability = torch.cuda.get_device_capability(0) if gpu else None
    return {
        "gpu": gpu,
        "capability": ".".join(map(str, capability)) if capability else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "host": platform.node(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
    }


def save(name: str, data, command: str, directory=None) -> str:
    """Write ``data`` with its provenance to ``results/<name>.json``; returns the path."""
    directory = RESULTS_DIR if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    with open(path, "w") as f:
        json.dump({"provenance": provenance(command), "data": data}, f, indent=1)
    return str(path)


def load(name: str, directory=None) -> dict:
    """Read ``results/<name>.json``: a dict with 'provenance' and 'data'."""
    directory = RESULTS_DIR if directory is None else directory
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no stored measurement {path}; run the GPU script named in the chapter"
        )
    with open(path) as f:
        return json.load(f)


def gpu_short(record: dict) -> str:
    """The GPU of a record in a word for a figure's title ("H100" for "NVIDIA H100 80GB
    HBM3"); "CPU" for a record measured without one."""
    gpu = record["provenance"].get("gpu")
    if not gpu:
        return "CPU"
    words = gpu.removeprefix("NVIDIA ").split()
    return words[0] if words else gpu


def describe(record: dict, prefix: str = "", width: int = 80) -> str:
    """What a chapter prints under a plot of stored data: where, with what and when it was
    measured, after ``prefix``, wrapped to lines of at most ``width`` characters (continuation
    lines indented) so that it fits the site's text column. The default leaves room for a short
    prefix printed in front of it ("stored: ")."""
    import textwrap

    p = record["provenance"]
    where = f"measured on {p['gpu']}" if p.get("gpu") else "computed on a CPU, no GPU involved,"
    # where the measuring machine wrote its files (``--out /root/out``) is not the reader's business
    command = re.sub(r"\s--out(?:-dir)?[= ]\S+", "", p["command"])
    command = command.replace(" ", "\0")  # a command is never split across lines
    text = (
        f"{prefix}{where} (torch {p['torch']}, triton {p['triton']}) on {p['date'][:10]} "
        f"with `{command}`"
    )
    return textwrap.fill(
        text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    ).replace("\0", " ")
