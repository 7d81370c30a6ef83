"""Where the monitor's rows go: a CSV file, a JSON-lines file, TensorBoard (a log
directory or a ``SummaryWriter`` of the reader's own), any callable, or memory.

Every row is ``(step, layer, head, metric, value)``; the CSV file has exactly these
columns (a header line, then one line per row) and the JSON-lines file one object with
these keys per line. Files are opened on the first row written, so a process that never
writes (a DDP rank other than 0) never creates one. A file is opened once: a sink that
was closed refuses to write again (it would start the file over), and :func:`make_sink`
turns whatever the reader passed into a sink, or says what it cannot take.

A file that already holds rows is continued (``append=None``, the default; ``append=False``
starts it over): a resumed run adds to the record of the run it resumes. A run that goes
back to a step already written (resumed from a checkpoint older than the last reading)
writes a *resume row* first: metric ``"resume"``, layer and head −1, value the latest step
written before it. The rows after it replace those of the same steps before it
(:func:`kernels.monitor.layer_table` reads them so).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

COLUMNS = ("step", "layer", "head", "metric", "value")
RESUME = "resume"  # the metric of a resume row


def resume_row(step: int, latest: int) -> tuple:
    """The row that says a run went back to ``step`` after writing up to ``latest``."""
    return (int(step), -1, -1, RESUME, float(latest))


def _ends_mid_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def _last_line(path: Path, kind: str):
    """The step of the last complete row of a monitor file, or None (no row yet)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 65536))
        lines = f.read().decode("utf-8", "replace").splitlines()
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"] if kind == "jsonl" else line.split(",")[0])
        except (ValueError, KeyError, TypeError):
            continue  # a header, a cut line
    return None


class FileSink:
    """Rows appended to ``path``: CSV if it ends in ``.csv``, JSON lines if
    ``.jsonl``."""

    def __init__(self, path, append=None):
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".jsonl"):
            raise ValueError(f"path must end in .csv or .jsonl, got {str(path)!r}")
        self.kind, self._file, self._csv = suffix[1:], None, None
        self.closed = False
        held = self.path.exists() and self.path.stat().st_size > 0
        self.found_step = _last_line(self.path, self.kind) if held else None
        self.append = self.found_step is not None if append is None else bool(append)
        self.last_step = self.found_step if self.append else None

    def plan(self) -> str | None:
        """One line saying what happens to rows the file already holds (None: none)."""
        if self.found_step is None:
            return None
        if self.append:
            return (
                f"monitor: {str(self.path)!r} already holds rows up to step "
                f"{self.found_step}: appending to it (append=False starts it over)"
            )
        return (
            f"monitor: {str(self.path)!r} holds rows up to step {self.found_step}: "
            "starting it over (append=False)"
        )

    def _open(self):
        if self.closed:
            raise RuntimeError(
                f"the monitor file {str(self.path)!r} was closed: writing to it again "
                "would start it over and lose its rows. Attach a new monitor with "
                "append=True to continue it"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (self.append and self.path.exists() and self.path.stat().st_size)
        cut = not fresh and _ends_mid_line(self.path)
        self._file = open(self.path, "a" if self.append else "w", newline="")
        if cut:  # a run that stopped in the middle of a line: start on a line of our own
            self._file.write("\n")
        if self.kind == "csv":
            self._csv = csv.writer(self._file)
            if fresh:
                self._csv.writerow(COLUMNS)

    def write(self, rows):
        if self._file is None:
            self._open()
        for row in rows:
            if self.kind == "csv":
                self._csv.writerow(row)
            else:
                self._file.write(json.dumps(dict(zip(COLUMNS, row))) + "\n")
        self._file.flush()

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None
        self.closed = True


def tensorboard_writer_class():
    """torch's SummaryWriter, imported only when asked for (clear error if missing)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(
            "the monitor's tensorboard= option needs the 'tensorboard' package, which "
            "is not installed (pip install tensorboard), or pass tensorboard=None and "
            f"read the CSV or JSON-lines file instead ({err})"
        ) from None
    return SummaryWriter


class TensorBoardSink:
    """Rows as scalars ``<metric>/layer<l>/head<h>`` in a TensorBoard log directory, or
    through a writer the reader made (anything with ``add_scalar``: torch's
    ``SummaryWriter``, tensorboardX's). A writer of the reader's is flushed, never
    closed: the training loop that made it still uses it."""

    def __init__(self, logdir=None, writer=None):
        if (logdir is None) == (writer is None):
            raise ValueError("give TensorBoardSink a log directory or a writer, not both")
        self._own = writer is None
        self.logdir, self._writer = (None if logdir is None else str(logdir)), writer
        self._cls = tensorboard_writer_class() if self._own else None

    def write(self, rows):
        if self._writer is None:
            self._writer = self._cls(log_dir=self.logdir)
        for step, layer, head, metric, value in rows:
            if metric == RESUME:
                continue  # TensorBoard shows a step written twice as it is
            self._writer.add_scalar(f"{metric}/layer{layer}/head{head}", value, step)
        if hasattr(self._writer, "flush"):
            self._writer.flush()

    def close(self):
        if self._own and self._writer is not None:
            self._writer.close()
            self._writer = None


class CallableSink:
    """Rows handed to a function: ``fn(rows)``, a list of (step, layer, head, metric,
    value) tuples per reading step (a logger, wandb.log wrapped, a queue)."""

    def __init__(self, fn):
        self.fn = fn

    def write(self, rows):
        self.fn(list(rows))

    def close(self):
        pass


def make_sink(target, option: str, append=None):
    """A sink for ``target``: a path ending in .csv or .jsonl (``option="path"``) or a log
    directory (``option="tensorboard"``); an object with ``add_scalar`` (a SummaryWriter);
    or any callable taking a list of rows."""
    if isinstance(target, (str, os.PathLike)):
        return (
            FileSink(target, append=append) if option == "path" else TensorBoardSink(logdir=target)
        )
    if callable(getattr(target, "add_scalar", None)):
        return TensorBoardSink(writer=target)
    if callable(target):
        return CallableSink(target)
    raise TypeError(
        f"{option}= takes a file path, a TensorBoard SummaryWriter (anything "
        f"with add_scalar) or a function of a list of rows; got "
        f"{type(target).__name__}"
    )


def read_rows(path):
    """The rows of a monitor file (CSV or JSON lines) as a pandas table."""
    import pandas as pd

    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        return pd.read_json(path, lines=True, precise_float=True)
    return pd.read_csv(path)
