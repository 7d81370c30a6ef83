"""Every page (chapters, intro, instructor pages) at most 2,500 words of prose, counted by
kernels.tools.prose: the
markdown a reader reads on the page, exercises included, without code, math, markup or the
solutions folded into a dropdown."""

from __future__ import annotations

import pytest

from kernels.env import REPO_ROOT
from kernels.tools import prose

BOOK = REPO_ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))

# Chapters still over the limit. A chapter listed here that has come under it fails too, so
# the list only shrinks.
OVER_FOR_NOW: set[str] = set()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_is_at_most_2500_words_of_prose(path):
    words = prose.page_words(path)
    if path.stem in OVER_FOR_NOW:
        assert words > prose.MAX_WORDS, (
            f"{path.name}: {words:,} words, within {prose.MAX_WORDS:,}: take it off OVER_FOR_NOW"
        )
    else:
        assert words <= prose.MAX_WORDS, (
            f"{path.name}: {words:,} words of prose (at most {prose.MAX_WORDS:,})"
        )


def test_the_count_leaves_out_code_math_markup_and_folded_solutions():
    text = "\n".join(
        [
            "# A title of four words",
            "Prose with $x^2 + y$ and `code here` and {glue:text}`c10_x:.0f` µs, "
            "see [the link](https://example.org/a/b).",
            "$$",
            "a + b = c",
            "$$",
            "```python",
            "print('not prose at all')",
            "```",
            "```{exercise} Three more words",
            ":label: ex-1",
            "",
            "Write two words.",
            "```",
            "```{solution-start} ex-1",
            ":class: dropdown",
            "```",
            "The folded answer is not counted.",
            "```{solution-end}",
            "```",
            "<!-- a comment --> <em>shown</em>",
        ]
    )
    counted = prose.prose(text).split()
    assert "print('not" not in counted and "folded" not in counted and "b)." not in counted
    # A title of four words (5) + Prose with and x and x µs, see the link (10)
    # + Three more words (3) + Write two words. (3) + shown (1)
    assert prose.count_words(text) == 5 + 10 + 3 + 3 + 1


def test_a_page_over_the_limit_is_caught(tmp_path):
    page = tmp_path / "long.md"
    page.write_text("word " * (prose.MAX_WORDS + 1))
    assert prose.page_words(page) == prose.MAX_WORDS + 1 > prose.MAX_WORDS
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(
        '{"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["two words"]},'
        ' {"cell_type": "markdown", "metadata": {"tags": ["remove-cell"]}, "source": "a rubric"},'
        ' {"cell_type": "code", "metadata": {}, "source": "x = 1"}]}'
    )
    assert prose.page_words(notebook) == 2
