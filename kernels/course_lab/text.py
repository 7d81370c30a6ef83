"""The chapters' Markdown made readable where MyST does not run (Jupyter, Colab), for students.

* ``{cite:t}`key``` becomes "Author et al. (year)" and ``{cite:p}`key``` "(Author et al.,
  year)", linked to the reference's URL, from ``book/references.bib``;
* admonitions (```` ```{note} ````) become block quotes with a bold title;
* talk of the solution goes: the Exercises intro's sentences about the folded reference
  solution, and sentences of an exercise that say what "the solution" does next.
"""

from __future__ import annotations

import functools
import re

from ..env import REPO_ROOT

BIB = REPO_ROOT / "book" / "references.bib"
CITE = re.compile(r"\{cite(?::(?P<kind>[tp]))?\}`(?P<keys>[^`]+)`")
ADMONITION = re.compile(
    r"```+\{(?P<kind>note|warning|tip|important|hint|caution|seealso|"
    r"attention|danger|admonition)\}(?P<title>[^\n]*)\n(?P<body>.*?)\n```+",
    re.S,
)
BOOK_INTRO = re.compile(
    r"Here, in the book, the answer cell holds\s+the reference solution,.*?"
    r"the answer cell is blank\.",
    re.S,
)
STUDENT_INTRO = (
    "Write your answer in the blank answer cell under each exercise, then run the "
    "check cell below it. Where an exercise asks for a value, also explain it in a "
    "sentence or two in the cell under the answer (graded by hand). Where it asks "
    "you to write something, write it: an answer that calls a library function "
    "doing the work is refused, and the check names the call."
)
SOLUTION_SENTENCE = re.compile(r"(?:(?<=[.?!)])\s+|;\s+)[Tt]he solution\b.*?[.?!](?=\s|$)", re.S)


def _field(entry: str, name: str) -> str:
    match = re.search(rf"\b{name}\s*=\s*\{{(.*?)\}},?\s*\n", entry, re.S)
    return match.group(1).strip() if match else ""


def _plain(text: str) -> str:
    text = re.sub(r"\\['`^\"~]\{?(\w)\}?", r"\1", text)
    return re.sub(r"[{}\\]", "", text).strip()


@functools.cache
def bibliography() -> dict:
    """key: (short author list, year, url) from ``book/references.bib``."""
    found = {}
    if not BIB.is_file():
        return found
    for match in re.finditer(r"@\w+\{([^,]+),(.*?)\n\}", BIB.read_text(), re.S):
        key, entry = match.group(1).strip(), match.group(2) + "\n"
        people = [p.strip() for p in _field(entry, "author").split(" and ") if p.strip()]
        last = [_plain(p.split(",")[0]) if "," in p else _plain(p) for p in people]
        if len(last) > 2:
            names = f"{last[0]} et al."
        else:
            names = " and ".join(last) or key
        found[key] = (names, _plain(_field(entry, "year")), _field(entry, "url"))
    return found


def _cite(match: re.Match) -> str:
    bib = bibliography()
    parts = []
    for key in (k.strip() for k in match["keys"].split(",")):
        names, year, url = bib.get(key, (key, "", ""))
        text = f"{names} ({year})" if match["kind"] == "t" else f"{names}, {year}"
        parts.append(f"[{text}]({url})" if url else text)
    joined = "; ".join(parts)
    return joined if match["kind"] == "t" else f"({joined})"


def _admonition(match: re.Match) -> str:
    kind, title = match["kind"], match["title"].strip()
    lines = [line for line in match["body"].split("\n") if not re.match(r"^:\w+:", line)]
    heading = title if kind == "admonition" else kind.capitalize()
    body = "\n".join(f"> {line}" if line else ">" for line in lines).lstrip("> ").lstrip()
    return f"> **{heading}.** {body}"


def for_jupyter(markdown: str) -> str:
    """Citations and admonitions written so that Jupyter and Colab show them as text."""
    return ADMONITION.sub(_admonition, CITE.sub(_cite, markdown))


def for_students(markdown: str, exercise: bool = False) -> str:
    """:func:`for_jupyter`, without the Exercises intro's talk of the folded reference solution;
    in an exercise's text (``exercise``), without the sentences on what "the solution" does."""
    text = BOOK_INTRO.sub(STUDENT_INTRO, for_jupyter(markdown))
    if exercise:
        text = SOLUTION_SENTENCE.sub(
            lambda m: "." if m.group(0).lstrip().startswith(";") else "", text
        )
    return text
