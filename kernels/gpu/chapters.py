"""Every chapter executed top to bottom on this machine, each in its own process, with its time.

On a GPU machine this is the Colab path without Colab: the chapters take their full sizes and
the native kernels, and a chapter that leaves a tensor on the wrong device stops here. Run ::

    python -m kernels.gpu.chapters --out $OUT            # every chapter in book/
    python -m kernels.gpu.chapters --out $OUT book/09_monitor.ipynb

It writes ``chapter_times.json`` (with provenance: GPU, torch, triton, date, command): per
chapter its status (``ran``, ``failed``, ``timed out``), seconds, and the end of its output.
A chapter's budget is :data:`BUDGET_S` seconds; :func:`over_budget` names the chapters that
failed or took longer. Chapters run through :func:`kernels.tools.booktools.run_plain`, which
needs no notebook server.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from ..results import load, save, stored_names
from ..tools.booktools import BOOK_DIR, REPO_ROOT, notebook_title

BUDGET_S = 180.0  # what one chapter may take, on an H100 as on two CPU cores
TAIL_CHARS = 1500  # how much of a chapter's output the record keeps


def run_chapter(path: Path, timeout_s: float) -> dict:
    """Execute one chapter in a fresh Python process; its status, seconds and output's end."""
    command = [sys.executable, "-m", "kernels.tools.booktools", "run", str(Path(path).resolve())]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s
        )
        status = "ran" if done.returncode == 0 else "failed"
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        status = "timed out"
        output = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
            for part in (stopped.stdout, stopped.stderr)
        )
    seconds = time.perf_counter() - start
    return {
        "chapter": Path(path).name,
        "status": status,
        "seconds": round(seconds, 1),
        "tail": output[-TAIL_CHARS:],
    }


def over_budget(rows: list[dict], budget_s: float = BUDGET_S) -> list[str]:
    """The chapters that did not run cleanly or took longer than ``budget_s``, with why."""
    return [
        f"{row['chapter']}: {row['status']}"
        if row["status"] != "ran"
        else f"{row['chapter']}: {row['seconds']:.0f} s (budget {budget_s:.0f} s)"
        for row in rows
        if row["status"] != "ran" or row["seconds"] > budget_s
    ]


def chapter_title(name: str) -> str:
    """A chapter's title: the first top-level heading of ``book/<name>``."""
    import json

    return notebook_title(json.loads((BOOK_DIR / name).read_text()))


def stored_times(directory=None) -> list[dict]:
    """Each chapter's last clean run on a GPU from the stored ``chapter_times*`` records:
    {chapter, seconds, gpu, date}, sorted by chapter file; a newer record replaces an older one."""
    latest: dict = {}
    for stem in stored_names("chapter_times", directory):
        record = load(stem, directory)
        made = record["provenance"]
        for row in record["data"]["chapters"]:
            if row["status"] != "ran" or not made.get("gpu"):
                continue
            known = latest.get(row["chapter"])
            if known is None or made["date"] >= known["date"]:
                latest[row["chapter"]] = {
                    "chapter": row["chapter"],
                    "seconds": row["seconds"],
                    "gpu": made["gpu"],
                    "date": made["date"],
                }
    return [latest[name] for name in sorted(latest)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in book/")
    parser.add_argument("--out", type=Path, default=None, help="folder for chapter_times.json")
    parser.add_argument("--timeout", type=float, default=2 * BUDGET_S, help="seconds per chapter")
    args = parser.parse_args(argv)
    command = "python -m kernels.gpu.chapters " + " ".join(sys.argv[1:] if argv is None else argv)

    def record(rows: list) -> tuple[list, str]:
        late = over_budget(rows)
        data = {"budget_s": BUDGET_S, "chapters": rows, "over_budget": late}
        return late, save("chapter_times", data, command.strip(), directory=args.out)

    rows = []
    for path in args.notebooks or sorted(BOOK_DIR.glob("*.ipynb")):  # the appendix too
        row = run_chapter(path, args.timeout)
        print(f"{row['chapter']:40s} {row['status']:9s} {row['seconds']:7.1f} s", flush=True)
        if row["status"] != "ran":
            print(row["tail"], flush=True)
        rows.append(row)
        # saved after every chapter: a call stopped by its time limit keeps what it measured
        late, saved = record(rows)
    if not rows:  # no notebook to run: the record says so
        late, saved = record(rows)
    print("saved", saved)
    print("over budget or failed: " + (", ".join(late) if late else "none"))
    return 1 if late else 0


if __name__ == "__main__":
    sys.exit(main())
