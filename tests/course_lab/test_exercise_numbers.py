"""book/_ext/exercise_numbers.py numbers the website's exercises per chapter ("Exercise 2.1"),
solutions and references included, and leaves the chapters' own section headings alone:
a two-chapter mini book in two parts, built with Sphinx, myst-parser and sphinx-exercise."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from kernels.env import REPO_ROOT


def _chapter(stem: str) -> str:
    return textwrap.dedent(f"""\
        # Chapter {stem}

        ## 1. A section of the chapter

        ```{{exercise}} First
        :label: ex-{stem}-1

        Do it.
        ```

        ```{{solution}} ex-{stem}-1
        :class: dropdown

        Done.
        ```

        ```{{exercise}} Second
        :label: ex-{stem}-2

        Do more.
        ```

        See {{numref}}`ex-{stem}-2`.
        """)


def test_exercises_are_numbered_per_chapter(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO_ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_parser', 'sphinx_exercise', 'exercise_numbers']\n"
        "numfig = True\n"
    )
    (tmp_path / "index.md").write_text(
        "# Book\n\n```{toctree}\n:caption: One\nbook/01_a\n```\n\n"
        "```{toctree}\n:caption: Two\nbook/02_b\n```\n"
    )
    for stem in ("01_a", "02_b"):
        (tmp_path / "book" / f"{stem}.md").write_text(_chapter(stem))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-q",
            "-b",
            "html",
            str(tmp_path),
            str(tmp_path / "_build"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    for stem, chapter in (("01_a", 1), ("02_b", 2)):
        html = (tmp_path / "_build" / "book" / f"{stem}.html").read_text()
        text = re.sub(r"<[^>]+>", "", html)
        assert f"Exercise {chapter}.1" in text and f"Exercise {chapter}.2" in text
        assert f"Solution to Exercise {chapter}.1 (First)" in re.sub(r"\s+", " ", text)
        assert f"See Exercise {chapter}.2" in re.sub(r"\s+", " ", text)
        assert "1. A section of the chapter" in text  # not numbered a second time
        assert not re.search(r"\d\.?\s+1\. A section", text)
        assert "Exercise 3" not in text and "Exercise 4" not in text
