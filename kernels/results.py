"""GPU measurements live under ``results/`` as JSON, each with its provenance.

A chapter that cannot measure something on the machine it runs on (a GPU speed, a long
training run) loads the stored file instead and says so. Every file records the GPU, the
torch and triton versions, the date and the exact command that produced it.

Files over :data:`PACK_OVER` bytes (the GPT-2 runs' loss curves) are stored gzip-compressed as
``<name>.json.gz`` (``python -m kernels.results pack``), which keeps the repository small enough
to clone quickly and to send to a GPU machine; :func:`load` reads either form.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import platform
import re
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"  # the one definition
PACK_OVER = 1 << 20  # a results file larger than this (1 MiB) is stored compressed


def folder(directory=None) -> Path:
    """Where records are read and written: ``directory`` (a path or a string), else results/."""
    return RESULTS_DIR if directory is None else Path(directory)


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
    directory = folder(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    with open(path, "w") as f:
        json.dump({"provenance": provenance(command), "data": data}, f, indent=1)
    return str(path)


def record_path(name: str, directory=None):
    """The stored file of measurement ``name``: ``<name>.json`` or ``<name>.json.gz``."""
    directory = folder(directory)
    for path in (directory / f"{name}.json", directory / f"{name}.json.gz"):
        if path.exists():
            return path
    raise FileNotFoundError(
        f"no stored measurement {directory / name}.json; run the GPU script named in the chapter"
    )


def stored_names(prefix: str, directory=None) -> list[str]:
    """The names of every stored measurement whose name starts with ``prefix``, sorted."""
    directory = folder(directory)
    paths = list(directory.glob(f"{prefix}*.json")) + list(directory.glob(f"{prefix}*.json.gz"))
    return sorted({path.name.removesuffix(".gz").removesuffix(".json") for path in paths})


def load(name: str, directory=None) -> dict:
    """Read ``results/<name>.json`` (or its compressed ``.json.gz``): a dict with 'provenance'
    and 'data'."""
    path = record_path(name, directory)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def pack(directory=None, over: int = PACK_OVER) -> list[str]:
    """Compress every ``<name>.json`` in ``directory`` larger than ``over`` bytes to
    ``<name>.json.gz`` (same bytes on every machine: no time stamp inside) and remove the
    original; returns the names packed."""
    directory = folder(directory)
    packed = []
    for path in sorted(directory.glob("*.json")):
        if path.stat().st_size <= over:
            continue
        target = path.with_name(path.name + ".gz")
        with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            gz.write(path.read_bytes())
        with gzip.open(target, "rt") as f:
            if f.read() != path.read_text():  # pragma: no cover - a full disk, say
                raise RuntimeError(f"{target} does not read back as {path}")
        path.unlink()
        packed.append(path.stem)
    return packed


# modules renamed since some records were made: (pattern, today's name)
RENAMED = (
    (r"\bkernels\.lab_kit\b", "kernels.course_lab"),
    (r"\bkernels\.lab_gpu\b", "kernels.rounding_lab.gpu"),
    (r"\bkernels\.lab\.(?=\w)", "kernels.rounding_lab."),
    (r"\bkernels\.lab\b(?![.\w])", "kernels.rounding_lab.sweep"),
    (r"\bkernels\.gpu_check\b", "kernels.gpu.check"),
    (r"\bkernels\.booktools\b", "kernels.tools.booktools"),
    (r"\bkernels\.gpt2\.fastpath\b", "kernels.gpt2.fast_step_check"),
)


def current_command(command: str) -> str:
    """A recorded command as it runs today: modules renamed since carry their current names
    (the file itself keeps the command as it was recorded)."""
    for pattern, name in RENAMED:
        command = re.sub(pattern, name, command)
    return command


def gpu_short(record: dict) -> str:
    """The GPU of a record in a word for a figure's title ("H100" for "NVIDIA H100 80GB
    HBM3"); "CPU" for a record measured without one."""
    gpu = record["provenance"].get("gpu")
    if not gpu:
        return "CPU"
    words = gpu.removeprefix("NVIDIA ").split()
    return words[0] if words else gpu


GPU_PREFIX = "GPU measurement, not this machine: "  # before a GPU record printed on a CPU


def describe(record: dict, prefix: str = "", width: int = 80) -> str:
    """What a chapter prints under a plot of stored data: where, with what and when it was
    measured, after ``prefix``, wrapped to lines of at most ``width`` characters (continuation
    lines indented) so that it fits the site's text column. The default leaves room for a short
    prefix printed in front of it ("stored: ")."""
    import textwrap

    p = record["provenance"]
    where = f"measured on {p['gpu']}" if p.get("gpu") else "computed on a CPU without a GPU"
    # where the measuring machine wrote its files (``--out /root/out``) is not the reader's business
    command = current_command(re.sub(r"\s--out(?:-dir)?[= ]\S+", "", p["command"]))
    command = command.replace(" ", "\0")  # a command is never split across lines
    text = (
        f"{prefix}{where} (torch {p['torch']}, triton {p['triton']}) on {p['date'][:10]} "
        f"with `{command}`"
    )
    return textwrap.fill(
        text, width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    ).replace("\0", " ")


if __name__ == "__main__":
    if sys.argv[1:] != ["pack"]:
        sys.exit("usage: python -m kernels.results pack")
    for name in pack():
        print(f"packed results/{name}.json.gz")
