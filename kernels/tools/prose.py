"""Words of prose per chapter: what a reader reads in the markdown cells.

A chapter's prose is the text of its markdown cells that the site shows (``.md`` pages: the
whole file), exercises included, less solutions folded into a dropdown (a reader opens them)
and less what is not prose: code blocks, display and inline math, HTML tags and comments,
link targets, MyST directive and role markup (a glued number counts as one word), option
lines and the YAML front matter. ``python -m kernels.tools.prose`` prints the count of every
page in ``book/``; the unit test ``tests/tools/test_prose.py`` holds every chapter to
:data:`MAX_WORDS`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

MAX_WORDS = 2_500
HIDDEN = {"remove-cell"}  # markdown cells the site leaves out (a grader's rubric)

_FENCE = re.compile(r"^(```+|~~~+|:::+)([^\n]*)\n(.*?)^\1[ \t]*$", re.M | re.S)
# directives whose body is not prose; every other {directive} (exercise, note, figure, ...)
# keeps its body, and a fence with no directive is a code block
TITLED = {"exercise", "admonition", "note", "tip", "warning", "important", "dropdown"}
NOT_PROSE = {"code-block", "code-cell", "code", "math", "raw", "literalinclude"}
_FOLDED = re.compile(  # a solution folded into a dropdown: shown only when the reader opens it
    r"^(`{3,}|:{3,})\{solution-start\}[^\n]*\n(?::[\w-]+:[^\n]*\n)*?:class:[^\n]*dropdown"
    r".*?^(`{3,}|:{3,})\{solution-end\}[^\n]*\n\2",
    re.M | re.S,
)
_DIRECTIVE_OPTION = re.compile(r"^:[\w-]+:.*$", re.M)
_DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?\$")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_TAG = re.compile(r"</?[A-Za-z][^>]*>")
_ROLE = re.compile(r"\{[\w:-]+\}`[^`]*`")
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\([^)]*\)|\]\[[^\]]*\]")
_FRONT = re.compile(r"\A---\n.*?\n---\n", re.S)
_WORD = re.compile(r"[^\W_][\w'’.,:;%/–-]*")  # starts with a letter or digit


def _fence_body(match) -> str:
    """A fenced block's prose: the body of a directive such as ``{exercise}``, with its own
    fences handled the same way, or nothing for code."""
    name = re.match(r"\s*\{([\w:-]+)\}(.*)", match.group(2))
    if name is None or name.group(1) in NOT_PROSE:
        return " "
    title = name.group(2) if name.group(1) in TITLED else ""  # not a label or a path
    return f"\n{title}\n" + _FENCE.sub(_fence_body, match.group(3)) + "\n"


def prose(text: str) -> str:
    """The prose of one markdown text, markup taken out."""
    text = _FRONT.sub(" ", text)
    text = _FOLDED.sub(" ", text)
    text = _FENCE.sub(_fence_body, text)  # code blocks out, a directive's body in
    text = _COMMENT.sub(" ", text)
    text = _DISPLAY_MATH.sub(" ", text)
    text = _INLINE_MATH.sub(" ", text)
    text = _ROLE.sub(" x ", text)  # a glued value or a reference reads as one word
    text = _CODE.sub(" x ", text)
    text = _LINK.sub("] ", text)
    text = _TAG.sub(" ", text)
    text = _DIRECTIVE_OPTION.sub(" ", text)
    return text


def count_words(text: str) -> int:
    """Words in the prose of a markdown text."""
    return len(_WORD.findall(prose(text)))


def page_markdown(path: Path) -> str:
    """The markdown of a page: a notebook's markdown cells, or a ``.md`` file."""
    path = Path(path)
    if path.suffix == ".md":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join(
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "markdown" and not HIDDEN & set(c["metadata"].get("tags", []))
    )


def page_words(path: Path) -> int:
    return count_words(page_markdown(path))


def main(paths: list[str]) -> None:
    from kernels.tools.booktools import BOOK_DIR

    pages = [Path(p) for p in paths] or sorted([*BOOK_DIR.glob("*.ipynb"), *BOOK_DIR.glob("*.md")])
    for path in pages:
        words = page_words(path)
        flag = "  over" if words > MAX_WORDS else ""
        print(f"{words:6,}  {path.name}{flag}")


if __name__ == "__main__":
    main(sys.argv[1:])
