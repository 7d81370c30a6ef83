"""Sphinx extension: the ``chapter-times`` directive, a table of how long each chapter took to
execute top to bottom on a GPU, read from the stored ``results/chapter_times*.json`` records at
build time (``python -m kernels.gpu.chapters`` writes them) so the instructor page never types a
time or a GPU name. Loaded through ``sphinx.local_extensions`` in _config.yml.
"""

import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # the book's package, where Sphinx runs without it installed
    sys.path.insert(0, str(REPO_ROOT))

HEADER = ("chapter", "seconds on a GPU", "GPU", "run on")


def table_rows() -> list[tuple[str, str, str, str]]:
    """One row per chapter: its title, seconds, the GPU named by the record, the record's day."""
    from kernels.gpu.chapters import chapter_title, stored_times

    return [
        (chapter_title(r["chapter"]), f"{r['seconds']:.0f}", r["gpu"], r["date"][:10])
        for r in stored_times()
    ]


def _row(cells) -> nodes.row:
    row = nodes.row()
    for text in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(text=text)
        row += entry
    return row


class ChapterTimes(Directive):
    has_content = False

    def run(self):
        from kernels.results import record_path, stored_names

        env = self.state.document.settings.env
        for stem in stored_names("chapter_times"):  # rebuild the page when a record changes
            env.note_dependency(str(record_path(stem)))
        table = nodes.table(classes=["chapter-times"])
        group = nodes.tgroup(cols=len(HEADER))
        table += group
        group.extend(nodes.colspec(colwidth=1) for _ in HEADER)
        head = nodes.thead()
        head += _row(HEADER)
        body = nodes.tbody()
        body.extend(_row(cells) for cells in table_rows())
        group += head
        group += body
        return [table]


def setup(app):
    app.add_directive("chapter-times", ChapterTimes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
