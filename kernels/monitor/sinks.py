"""Where the monitor's rows go: a CSV file, a JSON-lines file, TensorBoard, or memory.

Every row is ``(step, layer, head, metric, value)``; the CSV file has exactly these
columns (a header line, then one line per row) and the JSON-lines file one object with
these keys per line. Files are opened on the first row written, so a process that never
writes (a DDP rank other than 0) never creates one.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

COLUMNS = ("step", "layer", "head", "metric", "value")


class FileSink:
    """Rows appended to ``path``: CSV if it ends in ``.csv``, JSON lines if
    ``.jsonl``."""

    def __init__(self, path, append: bool = False):
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".jsonl"):
            raise ValueError(f"path must end in .csv or .jsonl, got {str(path)!r}")
        self.kind, self.append, self._file, self._csv = suffix[1:], append, None, None

    def _open(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not (self.append and self.path.exists() and self.path.stat().st_size)
        self._file = open(self.path, "a" if self.append else "w", newline="")
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


def tensorboard_writer_class():
    """torch's SummaryWriter, imported only when asked for (clear error if missing)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(
            "the monitor's tensorboard= option needs the 'tensorboard' package, which "
            "is not installed (pip install tensorboard), or pass tensorboard=None and "
            f"read the CSV or JSON-lines file instead ({err})") from None
    return SummaryWriter


class TensorBoardSink:
    """Rows as scalars ``<metric>/layer<l>/head<h>`` in a TensorBoard log directory."""

    def __init__(self, logdir):
        self.logdir, self._writer = str(logdir), None
        self._cls = tensorboard_writer_class()

    def write(self, rows):
        if self._writer is None:
            self._writer = self._cls(log_dir=self.logdir)
        for step, layer, head, metric, value in rows:
            self._writer.add_scalar(f"{metric}/layer{layer}/head{head}", value, step)
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_rows(path):
    """The rows of a monitor file (CSV or JSON lines) as a pandas table."""
    import pandas as pd
    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        return pd.read_json(path, lines=True, precise_float=True)
    return pd.read_csv(path)
