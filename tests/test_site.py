"""The built website, as a reader sees it: every chapter page opened in headless Chromium.

Run after building the site (``.ci/run`` does both)::

    jupyter-book build . -W -n --keep-going
    python -m pytest -m site tests/test_site.py

The plain ``python -m pytest`` deselects these tests (``-m "not site"`` in pyproject.toml), because
they need ``_build/html`` and a browser; without a built site they FAIL, they never skip.

Per chapter page we check that it loads, that the browser logged no error, that every figure
decoded (``naturalWidth > 0``) and there is at least one, that MathJax typeset every formula
without a TeX error, and that the Colab launch button opens this chapter's notebook in the
repository named in ``_config.yml`` (the repository and issue buttons too); that no code,
output or display equation is cut off at the column edge; that every figure's smallest text is at
least 9 pt (12 CSS px) as displayed and every heatmap has a colour bar; that no internal word
(``INTERNAL_WORDS``, or ``None`` standing in prose) reaches the reader; and that the page fetches
nothing from another host. Debris of the workshop fails too (``test_chapter_debris``): progress
bars and empty output boxes, a run of repeated lines in a code cell, a cell whose executed output
the page does not show, bar charts whose value axis does not start at 0, overlapping figure texts
and printed tables whose columns do not line up; a code cell over 40 lines, a figure whose alt
text is a file path, a GPU name in the prose that the page's provenance lines do not name, and a
page over 1 MB with its images (``page_rule_problems``, on the built HTML). Each explorer
(chapters 5 and 6) is reached within 20 key presses from a fresh page and fits a 420 px
screen without anything cut or sticking out. A full-page
screenshot of every page is kept under ``_build/screenshots`` for review. One more test builds
a one-chapter book with the real ``_config.yml`` and checks that a Sphinx warning and a raising
cell each fail the build.

Needs Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromium``,
``/usr/bin/chromedriver``)
and ``selenium`` (requirements.txt).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from kernels.env import REPO_ROOT
from kernels.tools import booktools, style

pytestmark = pytest.mark.site

SITE = REPO_ROOT / "_build" / "html"
SCREENSHOTS = REPO_ROOT / "_build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
LOCAL_HOST = "127.0.0.1"


def toc_pages() -> list[str]:
    """Pages listed in _toc.yml, e.g. 'book/01_bf16_bits' (the root page excluded)."""
    toc = yaml.safe_load((REPO_ROOT / "_toc.yml").read_text())
    return [entry["file"] for part in toc.get("parts", []) for entry in part["chapters"]]


PAGES = toc_pages()
# Chapters are notebooks (they execute, have figures and a Colab button); the other pages
# (references, the instructor's page) are Markdown.
CHAPTERS = [p for p in PAGES if (REPO_ROOT / f"{p}.ipynb").is_file()]
TEXT_PAGES = [p for p in PAGES if p not in CHAPTERS]

# Words from the authors' workshop that must never reach a reader: names of internal notes, a
# placeholder, a debugging prefix, a missing value printed into a sentence.
INTERNAL_WORDS = (
    "GUIDE",
    "seed paper",
    "seeds/",
    "TODO",
    "[local]",
    "FIXME",
    "XXX",
    "measured on None",
    "computed on None",
    "a bug to find",
)


# ---------------------------------------------------------------- fixtures: server and browser
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output readable
        pass


@pytest.fixture(scope="session")
def site_url():
    """Serve _build/html on 127.0.0.1 (a free port) for the whole session."""
    if not (SITE / "index.html").is_file():
        pytest.fail(
            f"{SITE} has no index.html: build the site first "
            "(jupyter-book build . -W -n --keep-going)"
        )
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{LOCAL_HOST}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by chromedriver, with its browser log captured."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists():
            pytest.fail(f"{tool} is missing: apt-get install -y chromium chromium-driver")
    profile = tempfile.mkdtemp(prefix="site-test-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


# ---------------------------------------------------------------- what one page looks like
def forgivable(entry: dict) -> bool:
    """True for the two SEVERE log entries that are not the site's fault.

    * A resource on another host that could not be fetched: the CI machine has no internet, so
      anything a page asks of a non-local host fails with a ``net::ERR_`` network error. (The
      site needs none for what is tested here: MathJax is served locally.)
    * Chromium's own request for ``/favicon.ico``: the browser asks for it by itself when a page
      declares no icon; the book declares none, so the server answers 404.

    Every other SEVERE entry (a JavaScript exception, a 404 for one of the site's own files, a
    console.error) fails the test.
    """
    if entry.get("source") != "network":
        return False
    message = entry.get("message", "")
    url = urlparse(message.split(" ", 1)[0])
    if url.hostname not in (None, LOCAL_HOST):
        return "net::ERR_" in message
    return url.hostname == LOCAL_HOST and url.path == "/favicon.ico" and "404" in message


def open_page(browser, url: str, lands_on: str | None = None) -> list[dict]:
    """Load a page (and follow its redirect to ``lands_on``), wait until MathJax is done,
    return the SEVERE browser log entries."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser")  # forget what earlier pages logged
    browser.get(url)
    if lands_on:  # index.html is a meta-refresh redirect: wait for the page it leads to
        WebDriverWait(browser, 30).until(
            lambda b: (
                b.current_url.endswith(lands_on)
                and b.execute_script("return document.readyState") == "complete"
            )
        )
    browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const ready = () => window.MathJax && MathJax.startup && MathJax.startup.promise;"
        "const wanted = Array.from(document.scripts).some(s => /mathjax/i.test(s.src));"
        "const start = Date.now();"
        "(function wait() {"
        "  if (ready()) { MathJax.startup.promise.then(() => done(true), () => done(false)); }"
        "  else if (!wanted || Date.now() - start > 20000) { done(false); }"
        "  else { setTimeout(wait, 100); }"
        "})();"
    )
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def assert_math_rendered(browser, page: str) -> None:
    """MathJax (served from the site itself by sphinx-mathjax-offline, so this works offline)
    typeset every formula, none holds a TeX error or an undefined macro, and no '$' or '\\(' was
    left in the prose
    (LaTeX that MyST never recognised as math, e.g. display math glued to a paragraph)."""
    math = browser.execute_script(
        "return {spans: document.querySelectorAll('article .math').length,"
        "        raw: Array.from(document.querySelectorAll('article .math'))"
        "              .filter(el => !el.querySelector('mjx-container')).length,"
        "        typeset: document.querySelectorAll('article mjx-container').length,"
        "        errors: Array.from(document.querySelectorAll('article mjx-merror'))"
        "              .map(el => el.getAttribute('data-mjx-error') || el.textContent),"
        "        undefined: Array.from(document.querySelectorAll("  # \\foo MathJax does not know
        "              'article mjx-assistive-mml [mathcolor=\"red\"]')).map(el => el.textContent),"
        "        local: Array.from(document.scripts).some(s => /_static\\/mathjax\\//.test(s.src)),"
        "        stray: (() => {"  # LaTeX never parsed as math: a '$' or '\\(' left in the prose
        "          const hits = [], skip = 'pre, code, script, style, textarea, mjx-container,"
        "                                      .math, .output, .cell_output';"
        "          const walk = document.createTreeWalker("
        "            document.querySelector('article'), NodeFilter.SHOW_TEXT);"
        "          for (let n = walk.nextNode(); n; n = walk.nextNode()) {"
        "            if (n.parentElement.closest(skip)) continue;"
        "            if (/[$]|\\\\[(\\[]/.test(n.textContent))"
        "              hits.push(n.textContent.trim().slice(0, 80));"
        "          }"
        "          return hits; })()};"
    )
    assert math["local"], f"{page}: MathJax is not loaded from the site's _static/mathjax"
    assert math["spans"] > 0, f"{page}: no math on the page"
    assert math["raw"] == 0, f"{page}: {math['raw']} of {math['spans']} formulas not typeset"
    assert math["typeset"] >= math["spans"]
    assert math["errors"] == [], f"{page}: TeX errors {math['errors']}"
    assert math["undefined"] == [], f"{page}: undefined TeX macros {math['undefined']}"
    assert math["stray"] == [], f"{page}: LaTeX left unparsed in the text: {math['stray']}"


CLIPPABLE = (
    "article div.cell_input pre, article div.cell_output pre, "
    "article div.highlight pre, article mjx-container[display='true']"
)


def clipped_elements(browser) -> list[str]:
    """The first characters of every code block, output or display equation wider than the box
    that shows it (scrollWidth > clientWidth): what a reader would have to scroll sideways for."""
    return browser.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        "  .filter(el => el.scrollWidth > el.clientWidth + 1)"
        "  .map(el => (el.textContent || '').trim().slice(0, 60));",
        CLIPPABLE,
    )


# 'None' where a value belongs ("measured on None", "= None"), not the English "None of them".
NONE_AS_VALUE = re.compile(r"(?:[=:(]\s*|\b(?:on|is|was|were|are|by|with|at|from|to)\s+)None\b")


def internal_words(browser) -> list[str]:
    """Internal words anywhere in the article, and 'None' or 'nan' standing in prose as a value
    (outside code, where `None` is a legitimate Python name)."""
    text = browser.execute_script("return document.querySelector('article').innerText;")
    prose = browser.execute_script(
        "const skip = 'pre, code, script, style, mjx-container, .math';"
        "const walk = document.createTreeWalker("
        "  document.querySelector('article'), NodeFilter.SHOW_TEXT);"
        "const parts = [];"
        "for (let n = walk.nextNode(); n; n = walk.nextNode()) {"
        "  if (!n.parentElement.closest(skip)) parts.push(n.textContent); }"
        "return parts.join(' ');"
    )
    found = [word for word in INTERNAL_WORDS if word in text]
    found += [f"'{m.group(0)}' in prose" for m in NONE_AS_VALUE.finditer(prose)]
    return found


def external_resources(browser) -> list[str]:
    """Scripts, stylesheets, images and frames the page loads from anywhere but the site itself
    (a CDN, say): on an offline copy of the site they would be missing."""
    return browser.execute_script(
        "const urls = [];"
        "for (const el of document.querySelectorAll('script[src], link[rel=stylesheet][href], "
        "    img[src], iframe[src]')) urls.push(el.src || el.href);"
        "for (const r of performance.getEntriesByType('resource')) urls.push(r.name);"
        "return urls.filter(u => { try { const h = new URL(u, location.href).hostname;"
        "  return h !== location.hostname; } catch (e) { return true; } });"
    )


def illegible_figures(browser) -> list[str]:
    """Figures whose smallest text is under 12 CSS px (9 pt) as displayed, or that show a heatmap
    without a colour bar. Each PNG made by the book carries its smallest font (points), its dpi and
    its bare-heatmap count (kernels.tools.style); the browser says how wide it is displayed."""
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img')).map("
        "  im => [new URL(im.currentSrc).pathname, im.getBoundingClientRect().width,"
        "        im.naturalWidth]);"
    )
    problems = []
    for path, shown_width, image_width in shown:
        file = SITE / path.lstrip("/")
        if not file.is_file() or file.suffix.lower() != ".png":
            problems.append(f"{path}: not a PNG the site serves")
            continue
        record = style.read_record(file.read_bytes())
        if style.PNG_KEY_FONT not in record:
            problems.append(f"{path}: made without kernels.tools.style (no legibility record)")
            continue
        px = style.rendered_font_px(
            float(record[style.PNG_KEY_FONT]),
            float(record[style.PNG_KEY_DPI]),
            shown_width,
            image_width,
        )
        if px < MIN_TEXT_PX:
            problems.append(
                f"{path}: smallest text {px:.1f} px as shown "
                f"({record[style.PNG_KEY_FONT]} pt, image {image_width} px shown "
                f"{shown_width:.0f} px wide)"
            )
        if int(record.get(style.PNG_KEY_NO_COLORBAR, "0")):
            problems.append(
                f"{path}: {record[style.PNG_KEY_NO_COLORBAR]} heatmap(s) without a colour bar"
            )
    return problems


MIN_TEXT_PX = style.MIN_FONT_PT * 96 / 72 - 0.05  # 9 pt = 12 CSS px


TABLE_LINE = re.compile(r"(\S {2,}\S.*){2,}")  # a row of a printed table: columns apart by spaces
MAX_TABLE_WIDTH, MAX_TABLE_ROWS = 88, 13  # characters; 12 rows and a header


def unreadable_tables(browser) -> list[str]:
    """Printed tables a reader would have to scan: a row wider than the column (it wraps and its
    columns fall apart) or more than 12 rows (a figure says it better)."""
    outputs = browser.execute_script(
        "return Array.from(document.querySelectorAll('article div.cell_output pre'))"
        "  .map(el => el.textContent);"
    )
    return [problem for text in outputs for problem in table_problems(text)]


def on_screen(line: str) -> str:
    """``line`` as a monospaced font shows it: combining marks (the macron of P̄) take no column
    of their own, so they are dropped before positions and widths are measured."""
    return "".join(ch for ch in line if not unicodedata.combining(ch))


def table_problems(text: str) -> list[str]:
    problems, run = [], []
    for line in map(on_screen, text.splitlines() + [""]):
        if TABLE_LINE.search(line):
            run.append(line)
            continue
        if any(len(row) > MAX_TABLE_WIDTH for row in run):
            problems.append(f"table rows up to {max(map(len, run))} characters: {run[0][:50]!r}")
        if len(run) > MAX_TABLE_ROWS:
            problems.append(f"table of {len(run)} rows: {run[0][:50]!r}")
        if len(run) >= MIN_ALIGNED_ROWS and misaligned_columns(run):
            problems.append(f"table columns do not line up: {misaligned_columns(run)}")
        run = []
    return problems


MIN_ALIGNED_ROWS = 3  # two lines with gaps are a listing, not yet a table


TABLE_FIELD = re.compile(r"\S+(?: \S+)*")  # one cell of a printed row: words one space apart


def misaligned_columns(rows: list[str]) -> list[str]:
    """The columns of a printed table whose cells neither start nor end at one position.

    A row is split into cells at runs of two or more spaces. The rows with the most common cell
    count make the columns; each column must be left-aligned (one start) or right-aligned (one
    end) over its data rows, and the first row (a header) may sit anywhere over the column's span.
    A row with fewer cells (a header over an unnamed index column) must put each cell's start or
    end on a column's; a row with more (a header with a title or a unit added) all but one of
    them. Returns a description of each column that fails."""
    spans = [[m.span() for m in TABLE_FIELD.finditer(row)] for row in rows]
    counts = [len(s) for s in spans]
    width = max(set(counts), key=lambda c: (counts.count(c), c))
    full = [s for s in spans if len(s) == width]
    data = full[1:] if len(full) > 2 and spans[0] is full[0] else full
    problems = []
    columns = []
    for j in range(width):
        starts = {s[j][0] for s in data}
        ends = {s[j][1] for s in data}
        low, high = min(s[j][0] for s in data), max(s[j][1] for s in data)
        columns.append((starts, ends))
        text = rows[spans.index(full[-1])][full[-1][j][0] : full[-1][j][1]]
        if len(starts) > 1 and len(ends) > 1:
            problems.append(f"column {j + 1} ({text!r}) starts at {sorted(starts)}")
        elif data is not full and not (full[0][j][0] < high and full[0][j][1] > low):
            problems.append(f"column {j + 1}'s header is not over it")
    edges = {x for starts, ends in columns for x in starts | ends}
    for row, s in zip(rows, spans):
        if len(s) < width and not all(a in edges or b in edges for a, b in s):
            problems.append(f"row {row.strip()[:40]!r} does not sit on the columns")
        elif len(s) > width and sum(a in edges or b in edges for a, b in s) < width - 1:
            problems.append(f"row {row.strip()[:40]!r} has {len(s)} cells, the table {width}")
    return problems


# A progress bar (tqdm and the like) printed into an output: "45%|████▌  | 9/20 [00:01<00:02,
# 4.5it/s]". It belongs to a terminal, not a page.
PROGRESS_BAR = re.compile(r"\d+(?:\.\d+)?\s*(?:it/s|s/it)\]|\d+%\|[^|\n]*\||[█▏▎▍▌▋▊▉]{3,}")
REPEATED_LINES = 4  # this many identical lines in a row in a code cell are a slip, not code


def progress_bars(text: str) -> list[str]:
    """Progress-bar fragments in an output's text."""
    return [m.group(0) for m in PROGRESS_BAR.finditer(text)]


def repeated_lines(code: str) -> list[str]:
    """Runs of REPEATED_LINES or more identical non-blank lines in a code cell (indentation
    counts: the closing brackets of nested calls differ in it)."""
    runs, previous, length = [], None, 0
    for line in code.splitlines() + [None]:
        line = line.rstrip() if line is not None else None
        if line and line == previous:
            length += 1
            continue
        if previous and length >= REPEATED_LINES:
            runs.append(f"{length} x {previous.strip()[:40]!r}")
        previous, length = line, 1
    return runs


HIDDEN_OUTPUT_TAGS = {"remove-output", "remove_output", "hide-output", "hide_output"}
REMOVED_CELL_TAGS = {"remove-cell", "remove_cell"}


def glue_record(output: dict) -> bool:
    """An output that only stores a glued value for the prose (MyST-NB's ``glue``): never
    drawn on the page."""
    data = output.get("data", {})
    return bool(data) and all(k.startswith("application/papermill.record/") for k in data)


def missing_outputs(notebook: dict, shown: list[bool]) -> list[str]:
    """Code cells that produced an output when the book was executed but show none on the page.

    ``notebook`` is the executed notebook; ``shown`` says, for each code cell on the page in
    order, whether its output box shows something. A cell tagged to hide or remove its output is
    allowed to show nothing. (A widget, for one, has no output a static page can draw.)"""
    cells = [
        c
        for c in notebook["cells"]
        if c["cell_type"] == "code"
        and not REMOVED_CELL_TAGS & set(c.get("metadata", {}).get("tags", []))
    ]
    if len(cells) != len(shown):
        return [f"{len(cells)} code cells in the notebook, {len(shown)} on the page"]
    problems = []
    for number, (cell, visible) in enumerate(zip(cells, shown), start=1):
        tags = set(cell.get("metadata", {}).get("tags", []))
        outputs = [o for o in cell.get("outputs", []) if not glue_record(o)]
        if outputs and not visible and not HIDDEN_OUTPUT_TAGS & tags:
            first = "".join(cell["source"]).strip().splitlines()[:1] or [""]
            problems.append(f"code cell {number} ({first[0][:40]!r}) shows no output")
    return problems


# What the browser reports about each code cell of a page: its code, its output's text, whether
# its output box shows anything at all (text, an image, a drawn figure or table).
PAGE_CELLS = """
const visible = el => el && ((el.innerText || '').trim().length > 0
    || el.querySelector('img, svg, canvas, iframe, table, .book-plotly, mjx-container'));
return Array.from(document.querySelectorAll('article div.cell')).map(cell => {
  const input = cell.querySelector('div.cell_input');
  const outputs = Array.from(cell.querySelectorAll('div.cell_output'));
  return {code: input ? input.innerText : '',
          text: outputs.map(o => o.innerText || '').join('\\n'),
          boxes: outputs.length,
          empty: outputs.filter(o => !visible(o)).length,
          split: cell.querySelectorAll('div.output.stream + div.output.stream').length,
          shown: outputs.some(o => visible(o))};
});
"""


def executed_notebook(page: str) -> dict:
    """The notebook MyST-NB executed for a page. The build writes it next to the site; but
    where it took the outputs from its execution cache (a rebuild, or a chapter the tests
    executed: book/conftest.py) it writes the notebook without them, so the executed copy is
    then read from that cache."""
    path = REPO_ROOT / "_build" / "jupyter_execute" / f"{page}.ipynb"
    assert path.is_file(), f"{path} is missing: build the site first"
    notebook = json.loads(path.read_text())
    if any(c.get("outputs") for c in notebook["cells"] if c["cell_type"] == "code"):
        return notebook
    import nbformat
    from jupyter_cache import get_cache

    source = nbformat.read(str(REPO_ROOT / f"{page}.ipynb"), nbformat.NO_CONVERT)
    cache = get_cache(str(REPO_ROOT / "_build" / ".jupyter_cache"))
    try:
        _, merged = cache.merge_match_into_notebook(source)
    except KeyError as err:
        raise AssertionError(f"{page}: no executed copy beside the site or in its cache") from err
    return json.loads(nbformat.writes(merged))


def figure_debris(browser) -> list[str]:
    """Figures whose PNG record (kernels.tools.style) counts a bar chart with a value axis that
    does not start at 0, or texts printed over each other."""
    paths = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img'))"
        "  .map(im => new URL(im.currentSrc).pathname);"
    )
    problems = []
    for path in paths:
        file = SITE / path.lstrip("/")
        if file.suffix.lower() != ".png" or not file.is_file():
            continue  # illegible_figures reports it
        problems += record_debris(path, style.read_record(file.read_bytes()))
    return problems


def record_debris(name: str, record: dict) -> list[str]:
    problems = []
    for key in (style.PNG_KEY_BARS_OFF_ZERO, style.PNG_KEY_OVERLAPS):
        if key not in record:
            problems.append(f"{name}: no {key} in its record (made before the check existed)")
    if int(record.get(style.PNG_KEY_BARS_OFF_ZERO, "0")):
        problems.append(f"{name}: a bar chart whose value axis does not start at 0")
    if int(record.get(style.PNG_KEY_OVERLAPS, "0")):
        problems.append(
            f"{name}: {record[style.PNG_KEY_OVERLAPS]} pair(s) of texts overlap: "
            f"{record.get(style.PNG_KEY_OVERLAP_TEXTS, '')[:200]}"
        )
    return problems


def page_debris(browser, page: str, notebook: dict | None) -> list[str]:
    """Everything a reader should not find on a page: progress bars, empty output boxes, printed
    text split into several boxes, runs of repeated code lines, outputs the page lost, cut bar
    charts, overlapping texts."""
    cells = browser.execute_script(PAGE_CELLS)
    problems = []
    for number, cell in enumerate(cells, start=1):
        bars = progress_bars(cell["text"])
        if bars:
            problems.append(f"cell {number}: progress bar {bars[0]!r}")
        if cell["empty"]:
            problems.append(f"cell {number}: {cell['empty']} empty output box(es)")
        if cell["split"]:  # printed text cut into boxes (nb_merge_streams in _config.yml)
            problems.append(f"cell {number}: printed output split into {cell['split'] + 1} boxes")
        problems += [f"cell {number}: repeated lines {r}" for r in repeated_lines(cell["code"])]
    if notebook is not None:
        problems += missing_outputs(notebook, [cell["shown"] for cell in cells])
    return problems + figure_debris(browser)


# ---------------------------------------------------------------- rules on a page's HTML
MAX_CODE_LINES = 40  # a longer cell is bookkeeping to move into kernels/ or two concepts
MAX_PAGE_WEIGHT = 1_000_000  # a page's HTML and its images
# the GPU models a record can name ("measured on NVIDIA H100 80GB HBM3")
GPU_NAME = re.compile(r"\b(?:[ABHV]\d00|GB\d00|[LT]4|L40S?|RTX ?\d{4})\b")


def soup(html: str):
    from bs4 import BeautifulSoup

    return BeautifulSoup(html, "html.parser")


def long_code_cells(html: str, limit: int = MAX_CODE_LINES) -> list[str]:
    """Code cells on the page with more than ``limit`` lines."""
    problems = []
    cells = soup(html).select("div.cell div.cell_input pre")
    for number, pre in enumerate(cells, start=1):
        lines = len(pre.get_text().rstrip("\n").splitlines())
        if lines > limit:
            problems.append(f"code cell {number}: {lines} lines (at most {limit})")
    return problems


def path_like(text: str) -> bool:
    return bool(re.fullmatch(r"\S*[/\\]\S*|\S+\.(?:png|jpe?g|svg|gif)", text.strip()))


def figure_alt_problems(html: str) -> list[str]:
    """Figures with no alt text or with a file path for one (MyST-NB's default): a reader
    who cannot see the figure hears what it shows (``mystnb: image: alt`` in the cell)."""
    problems = []
    for img in soup(html).select("article img"):
        alt = (img.get("alt") or "").strip()
        if not alt or path_like(alt):
            problems.append(f"{img.get('src')}: alt text {alt!r} says not what it shows")
    return problems


def gpu_name_problems(html: str) -> list[str]:
    """GPU names in the prose that no provenance line printed on the page names ("measured
    on ..." under a stored result, kernels.results.describe): a sentence that names another
    GPU than the one that measured its numbers."""
    page = soup(html).select_one("article") or soup(html)
    for junk in page.select("script, style"):
        junk.decompose()
    measured = set()
    for out in page.select("div.cell_output"):
        for line in re.findall(r"measured on [^(\n]*", out.get_text()):
            measured |= set(GPU_NAME.findall(line))
        out.decompose()
    for code in page.select("div.cell_input, pre, code"):
        code.decompose()
    named = set(GPU_NAME.findall(page.get_text(" ")))
    return [f"the prose names {gpu}, no provenance line does" for gpu in sorted(named - measured)]


def page_weight(page: Path, site: Path = SITE) -> int:
    """Bytes a reader loads for this page beyond the theme: its HTML and its images."""
    total = page.stat().st_size
    for img in soup(page.read_text(errors="replace")).select("img[src]"):
        src = img["src"].split("#")[0].split("?")[0]
        file = (page.parent / src).resolve()
        if not src.startswith(("http:", "https:", "data:")) and file.is_file():
            total += file.stat().st_size
    return total


# Pages that still break one of the rules above (issue 45's review, 2026-11-28), by rule: each
# rule holds on every other page, and a page listed here that no longer breaks its rule fails
# the test until it is taken off, so the list can only shrink.
NOT_YET = {"alt text": set(), "long code cell": set(), "GPU name": set(), "page weight": set()}


NOT_YET_RULES = tuple(NOT_YET)


def rule_of(problem: str) -> str:
    """Which rule of :func:`page_rule_problems` a problem it reported breaks."""
    if problem.startswith("code cell "):
        return "long code cell"
    if problem.startswith("the prose names "):
        return "GPU name"
    if problem.startswith("page weight "):
        return "page weight"
    return "alt text"


def ratchet(page: str, problems: list[str]) -> list[str]:
    """The problems of :func:`page_rule_problems` on ``page`` less those :data:`NOT_YET` still
    allows it, plus each allowance the page no longer needs."""
    waived = {rule for rule, pages in NOT_YET.items() if page in pages}
    kept = [p for p in problems if rule_of(p) not in waived]
    stale = waived - {rule_of(p) for p in problems}
    return kept + [f"{rule}: no longer broken here, take the page off NOT_YET" for rule in stale]


def page_rule_problems(page: Path, site: Path = SITE) -> list[str]:
    """The HTML rules together: long code cells, alt texts, GPU names, page weight."""
    html = page.read_text(errors="replace")
    problems = long_code_cells(html) + figure_alt_problems(html) + gpu_name_problems(html)
    weight = page_weight(page, site)
    if weight > MAX_PAGE_WEIGHT:
        problems.append(f"page weight {weight:,} bytes (at most {MAX_PAGE_WEIGHT:,})")
    return problems


def page_url(site_url: str, chapter: str) -> str:
    return f"{site_url}/{chapter}.html"


# ---------------------------------------------------------------- the tests
def test_toc_lists_the_chapters_and_they_were_built():
    assert CHAPTERS, "_toc.yml lists no chapters"
    for page in PAGES:
        assert (REPO_ROOT / f"{page}.ipynb").is_file() or (REPO_ROOT / f"{page}.md").is_file(), (
            f"{page} listed in _toc.yml is missing"
        )
        assert (SITE / f"{page}.html").is_file(), f"{page}.html was not built"
    assert "book/references" in TEXT_PAGES, "the book has no references page"


@pytest.mark.parametrize("page", TEXT_PAGES)
def test_text_page(browser, site_url, page):
    """The pages that are not chapters: they load cleanly, nothing clipped, nothing internal."""
    severe = open_page(browser, page_url(site_url, page))
    assert browser.find_element("css selector", "article h1").text.strip(), f"{page}: no title"
    assert [e for e in severe if not forgivable(e)] == [], f"{page}: browser errors"
    assert clipped_elements(browser) == [], f"{page}: clipped {clipped_elements(browser)}"
    assert internal_words(browser) == [], f"{page}: internal words {internal_words(browser)}"
    assert external_resources(browser) == [], f"{page}: loads {external_resources(browser)}"
    save_screenshot(browser, page)


def test_references_are_cited_and_linked(browser, site_url):
    """Each chapter cites the literature through the references page, whose entries link out."""
    open_page(browser, page_url(site_url, "book/references"))
    entries = browser.execute_script(
        "return Array.from(document.querySelectorAll('article .citation, article dl.citation > dt'"
        ")).length;"
    )
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('article a.reference.external'))"
        "  .map(a => a.href).filter(h => h.startsWith('https://'));"
    )
    assert entries >= 5 and len(links) >= 5, (entries, links)
    citing = [
        c
        for c in CHAPTERS
        if "references.html#id" in (SITE / f"{c}.html").read_text(errors="replace")
        or "references.html#" in (SITE / f"{c}.html").read_text(errors="replace")
    ]
    assert len(citing) >= len(CHAPTERS) // 2, f"only {citing} cite the references page"


def test_front_page_loads(browser, site_url):
    severe = open_page(browser, site_url + "/", lands_on="book/intro.html")
    assert browser.current_url.endswith("book/intro.html"), browser.current_url
    assert browser.find_element("css selector", "article h1").text.strip()
    assert [e for e in severe if not forgivable(e)] == []
    assert_math_rendered(browser, "book/intro")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page(browser, site_url, chapter):
    assert (SITE / f"{chapter}.html").is_file(), f"{chapter}.html was not built"
    severe = open_page(browser, page_url(site_url, chapter))

    # Loads: a title and content, not an error page.
    title = browser.find_element("css selector", "article h1").text.strip()
    assert title, f"{chapter}: no title"
    assert len(browser.find_element("css selector", "article").text) > 500, (
        f"{chapter}: page nearly empty"
    )

    # No console errors except fetches of external hosts (no internet in CI).
    errors = [e for e in severe if not forgivable(e)]
    assert errors == [], f"{chapter}: browser errors {errors}"

    # Figures: at least one (every experiment ends in a figure), every image decoded.
    images = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img')).map("
        "  im => [im.currentSrc, im.complete, im.naturalWidth]);"
    )
    assert images, f"{chapter}: no figure on the page"
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert broken == [], f"{chapter}: images that did not load: {broken}"

    # Math: typeset by the site's own MathJax, no TeX error, no LaTeX left in the prose.
    assert_math_rendered(browser, chapter)

    # Nothing cut off at the column edge (1280 px window): code, outputs, display math.
    assert clipped_elements(browser) == [], f"{chapter}: clipped {clipped_elements(browser)}"

    # Colab: the launch button opens exactly this chapter's notebook of the configured repo.
    colab = [
        a.get_attribute("href")
        for a in browser.find_elements("css selector", "a[href]")
        if a.get_attribute("href").startswith("https://colab.research.google.com/")
    ]
    want = booktools.colab_url(REPO_ROOT / f"{chapter}.ipynb")
    assert colab == [want], f"{chapter}: Colab links {colab}, expected [{want}]"
    # ... and the repository and issue buttons point at the same repository.
    repo_url, _ = booktools.repository()
    links = {a.get_attribute("href") for a in browser.find_elements("css selector", "a[href]")}
    assert repo_url in links, f"{chapter}: no repository button"
    assert any(link.startswith(f"{repo_url}/issues/new") for link in links), (
        f"{chapter}: no issue button"
    )

    # Legible figures and tables, plain words, nothing fetched from elsewhere.
    assert unreadable_tables(browser) == [], f"{chapter}: {unreadable_tables(browser)}"
    assert illegible_figures(browser) == [], f"{chapter}: {illegible_figures(browser)}"
    assert internal_words(browser) == [], f"{chapter}: internal words {internal_words(browser)}"
    assert external_resources(browser) == [], f"{chapter}: loads {external_resources(browser)}"
    widgets = browser.find_elements(
        "css selector", "script[type='application/vnd.jupyter.widget-view+json']"
    )
    assert widgets == [], f"{chapter}: {len(widgets)} live widget(s), blank on a static site"

    save_screenshot(browser, chapter)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_debris(browser, site_url, chapter):
    """No progress bar, empty output box, repeated code line, lost output, bar chart cut above
    0, overlapping figure text or misaligned printed table on a chapter page; no code cell
    over 40 lines, figure without alt text, GPU name the page's records do not name, or page
    over 1 MB (``page_rule_problems``)."""
    open_page(browser, page_url(site_url, chapter))
    problems = page_debris(browser, chapter, executed_notebook(chapter))
    problems += ratchet(chapter, page_rule_problems(SITE / f"{chapter}.html"))
    assert problems == [], f"{chapter}: {problems}"


def save_screenshot(browser, page: str) -> None:
    """The whole page as a reader sees it at 1280 px, kept by CI for review: one image per
    4,000 px of page (a browser window cannot be made as tall as a long chapter)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for old in SCREENSHOTS.glob(f"{Path(page).name}_*.png"):
        old.unlink()
    step = 4000
    browser.set_window_size(1280, step)
    try:
        height = browser.execute_script("return document.documentElement.scrollHeight;")
        for part, top in enumerate(range(0, height, step), start=1):
            browser.execute_script("window.scrollTo(0, arguments[0]);", top)
            shot = SCREENSHOTS / f"{Path(page).name}_{part:02d}.png"
            assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 5_000
    finally:
        browser.set_window_size(1280, 1600)
        browser.execute_script("window.scrollTo(0, 0);")


# ---------------------------------------------------------------- the explorers (issue 25)
# Chapter 5's sources explorer and chapter 6's fixes explorer: HTML controls over a grid computed
# in Python (kernels/rounding_lab/site_explorers.py), drawn as SVG by kernels/tools/explorer.js.
EXPLORERS = {"book/05_bias_sources": "sources", "book/06_fixes": "fixes"}
MAX_PAGE_BYTES = 2_000_000
MAX_FIRST_PAINT_MS = 1000


def explorer_spec(name: str) -> dict:
    from kernels import results
    from kernels.rounding_lab import site_explorers

    if name == "fixes":
        return site_explorers.fixes_spec(results.load("fix_explorer")["data"])
    return site_explorers.sources_spec(results.load("lab_sweep_gpu")["data"]["records"])


def explorer_state(browser, name: str) -> dict:
    return browser.execute_script(
        "const r = document.querySelector(`.book-explorer[data-name='${arguments[0]}']`);"
        "return {state: r.getAttribute('data-state'),"
        "  plot: r.querySelector('svg.book-explorer-plot').innerHTML,"
        "  reading: r.querySelector('.book-explorer-reading').textContent,"
        "  shown: Array.from(r.querySelectorAll('output')).map(o => o.textContent),"
        "  active: document.activeElement && document.activeElement.id};",
        name,
    )


def expected_reading(spec: dict, state: str) -> str:
    index = 0
    for control, pick in zip(spec["controls"], map(int, state.split(","))):
        index = index * len(control["values"]) + pick
    return spec["readings"][spec["reading"][index]]


def open_explorer(browser, site_url, chapter, name):
    from selenium.webdriver.support.ui import WebDriverWait

    errors = [e for e in open_page(browser, page_url(site_url, chapter)) if not forgivable(e)]
    assert errors == [], f"{chapter}: browser errors {errors}"
    WebDriverWait(browser, 20).until(lambda b: explorer_state(b, name)["state"])
    return browser.find_element("css selector", f".book-explorer[data-name='{name}']")


def save_explorer_shot(root, name: str, setting: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser = root.parent
    browser.execute_script("arguments[0].scrollIntoView();", root)
    shot = SCREENSHOTS / f"explorer_{name}_{setting}.png"
    assert root.screenshot(str(shot)) and shot.stat().st_size > 5_000


@pytest.mark.parametrize("chapter, name", EXPLORERS.items())
def test_explorer_moves_with_the_keyboard(browser, site_url, chapter, name):
    """Each control of the explorer is reached with Tab, carries a visible label and value, and
    an arrow key moves it: the plot is redrawn and the reading under it changes (to the words
    Python wrote for that setting). The page stays small, paints fast and fetches nothing from
    another host."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    size = (SITE / f"{chapter}.html").stat().st_size
    assert size < MAX_PAGE_BYTES, f"{chapter}.html is {size:,} bytes"
    root = open_explorer(browser, site_url, chapter, name)
    spec = explorer_spec(name)
    paint = float(root.get_attribute("data-first-paint-ms"))
    assert paint < MAX_FIRST_PAINT_MS, f"{chapter}: the explorer first drew at {paint:.0f} ms"
    assert external_resources(browser) == [], f"{chapter}: loads {external_resources(browser)}"
    controls = root.find_elements("css selector", "[data-control]")
    assert [c.get_attribute("data-control") for c in controls] == [
        c["name"] for c in spec["controls"]
    ]
    start = explorer_state(browser, name)
    assert start["reading"] == expected_reading(spec, start["state"])
    browser.execute_script("arguments[0].focus();", controls[0])
    for i, (control, meta) in enumerate(zip(controls, spec["controls"])):
        cid = control.get_attribute("id")
        if i:  # Tab from the previous control lands on this one
            ActionChains(browser).send_keys(Keys.TAB).perform()
        assert explorer_state(browser, name)["active"] == cid, f"{name}: Tab missed {cid}"
        label = root.find_element("css selector", f"label[for='{cid}']")
        assert label.is_displayed() and label.text.strip() == meta["label"]
        if meta["kind"] == "range":
            shown = root.find_element("css selector", f"output[for='{cid}']")
            assert shown.is_displayed() and shown.text.strip()
        before = explorer_state(browser, name)
        pick = int(before["state"].split(",")[i])
        last = len(meta["values"]) - 1
        forward = Keys.ARROW_RIGHT if meta["kind"] == "range" else Keys.ARROW_DOWN
        back = Keys.ARROW_LEFT if meta["kind"] == "range" else Keys.ARROW_UP
        # to the end and back if need be, until both the plot and the reading have changed
        # (one step nearly always does it)
        keys = [forward] * (last - pick) + [back] * last
        for key in keys:
            moved = explorer_state(browser, name)["state"]
            ActionChains(browser).send_keys(key).perform()
            WebDriverWait(browser, 10).until(
                lambda b, s=moved: explorer_state(b, name)["state"] != s
            )
            after = explorer_state(browser, name)
            assert after["reading"] == expected_reading(spec, after["state"])
            if after["plot"] != before["plot"] and after["reading"] != before["reading"]:
                break
        assert after["plot"] != before["plot"], f"{name}: {meta['name']} never moved the plot"
        assert after["reading"] != before["reading"], f"{name}: {meta['name']} never changed it"
        if meta["kind"] == "range":
            value = meta["values"][int(after["state"].split(",")[i])]
            assert value in after["shown"] and control.get_attribute("aria-valuetext") == value
    save_explorer_shot(root, name, "moved")


def test_fixes_explorer_shows_the_nan_share_at_beta_64(browser, site_url):
    """At β = 64 ℓ underflows in most rows: the NaN/inf share is drawn as a bar with its value
    on the plot and said in the reading. Screenshots at three settings."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    root = open_explorer(browser, site_url, "book/06_fixes", "fixes")
    save_explorer_shot(root, "fixes", "1_default")

    def rule_nan_label(b):
        return b.execute_script(
            "return Array.from(arguments[0].querySelectorAll("
            "  \"text.book-explorer-value[data-series='rule'][data-panel='2']\"))"
            "  .map(t => t.textContent).join('');",
            root,
        )

    assert rule_nan_label(browser) == "0 %"
    beta = root.find_element("css selector", "[data-control='beta']")
    beta.send_keys(Keys.END)
    WebDriverWait(browser, 10).until(lambda b: "64" in explorer_state(b, "fixes")["shown"])
    label = rule_nan_label(browser)
    assert label.endswith(" %") and float(label[:-2]) > 30, label
    reading = explorer_state(browser, "fixes")["reading"]
    assert reading.startswith("ℓ underflows") and "NaN" in reading, reading
    save_explorer_shot(root, "fixes", "2_beta64")
    beta.send_keys(Keys.HOME)  # β = 1 + 2⁻¹⁰: the tied P̄ rounds back to 1 in many rows
    root.find_element("css selector", "[data-control='eps']").send_keys(Keys.HOME)
    WebDriverWait(browser, 10).until(lambda b: explorer_state(b, "fixes")["shown"][-1] == "0")
    save_explorer_shot(root, "fixes", "3_beta_near_1_eps_0")


def test_none_as_a_value_is_caught_but_not_the_english_word():
    assert NONE_AS_VALUE.search("measured on None (torch 2.11)")
    assert NONE_AS_VALUE.search("bias = None ulp")
    assert not NONE_AS_VALUE.search("None of the 32 runs failed")


def test_the_table_rule_tells_tables_from_prose():
    row = "  β rule across tiles            191871.8   553.63   +2.136"
    assert table_problems("\n".join([row] * 8)) == []
    assert len(table_problems("\n".join([row] * 20))) == 1
    assert len(table_problems(row + " " * 3 + "x" * 40)) == 1
    prose = "The tie share left the control's before ‖W_Q‖ did in 6 of 6 pairs, " * 3
    assert table_problems(prose) == []


def test_misaligned_table_columns_are_caught():
    aligned = [
        "rule                  bias    rms",
        "FA2                 +0.294   0.50",
        "β across tiles      -0.004   0.61",
    ]
    assert table_problems("\n".join(aligned)) == []
    index = ["          bias    rms", "FA2     +0.294   0.50", "β rule  -0.004   0.61"]
    assert table_problems("\n".join(index)) == []  # a header over an unnamed index column
    units = ["rule" + " " * 18 + "bias    rms  [ulp]"] + aligned[1:]
    assert table_problems("\n".join(units)) == []  # a header that adds its unit
    shifted = ["rule" + " " * 19 + "bias    rms  [ulp]"] + aligned[1:]
    assert len(table_problems("\n".join(shifted))) == 1
    seeded = aligned[:2] + ["β across tiles    -0.004     0.61"]  # printed without widths
    problems = table_problems("\n".join(seeded))
    assert len(problems) == 1 and "do not line up" in problems[0], problems
    # a label with a combining macron: aligned on screen when padded by display width
    p_bar = "ℓ from rounded P\u0304"
    on_screen_rows = aligned + [p_bar + " " * (20 - len(p_bar) + 1) + "+0.011   0.55"]
    assert table_problems("\n".join(on_screen_rows)) == []
    by_code_points = aligned + [f"{p_bar:20s}+0.011   0.55"]  # one column short on screen
    assert len(table_problems("\n".join(by_code_points))) == 1


def test_page_debris_on_a_seeded_page(browser, tmp_path):
    """The browser side of the debris check, on a page made like MyST-NB's: a progress bar, an
    empty output box and a code cell with a run of repeated lines are each found."""
    cell = (
        '<div class="cell"><div class="cell_input"><pre>{code}</pre></div>'
        '<div class="cell_output"><pre>{out}</pre></div></div>'
    )
    cells = [
        cell.format(code="x = 1", out="0.5"),
        cell.format(code="run()", out="100%|##########| 20/20 [00:04&lt;00:00, 4.9it/s]"),
        cell.format(code="show()", out=""),
        cell.format(code="print(\n" + '    f""\n' * 6 + ")", out="ok"),
    ]
    page = tmp_path / "page.html"
    page.write_text(f"<html><body><article>{''.join(cells)}</article></body></html>")
    browser.get(page.as_uri())
    problems = page_debris(browser, "seeded", None)
    assert len(problems) == 3, problems
    assert "cell 2: progress bar" in problems[0]
    assert "cell 3: 1 empty output box" in problems[1]
    assert "cell 4: repeated lines 6 x" in problems[2]


SEEDED_CELL = (
    '<div class="cell docutils container"><div class="cell_input docutils container">'
    '<div class="highlight"><pre>{code}</pre></div></div>'
    '<div class="cell_output docutils container"><div class="output stream">'
    "<pre>{out}</pre></div>{img}</div></div>"
)


def seeded_page(cells: list[dict], prose: str = "<p>Some prose.</p>") -> str:
    body = "".join(
        SEEDED_CELL.format(code=c.get("code", "x = 1"), out=c.get("out", ""), img=c.get("img", ""))
        for c in cells
    )
    return f"<html><body><article>{prose}{body}</article></body></html>"


def test_long_code_cells_are_caught():
    lines = lambda n: "\n".join(f"x{i} = {i}" for i in range(n))  # noqa: E731
    page = seeded_page([{"code": lines(40)}, {"code": lines(41) + "\n"}, {"code": "x"}])
    assert long_code_cells(page) == ["code cell 2: 41 lines (at most 40)"]


def test_figure_alt_text_must_say_what_it_shows():
    img = '<img alt="{}" src="../_images/a.png" />'
    good = img.format("Loss against step for the failing path and its control")
    for bad in ("../_build/jupyter_execute/abc123.png", "abc123.png", "", "_images\\a.png"):
        problems = figure_alt_problems(seeded_page([{"img": good}, {"img": img.format(bad)}]))
        assert len(problems) == 1, (bad, problems)
    assert figure_alt_problems(seeded_page([{"img": good}])) == []
    assert len(figure_alt_problems(seeded_page([{"img": '<img src="a.png">'}]))) == 1


def test_a_gpu_name_the_provenance_does_not_name_is_caught():
    stored = "measured on NVIDIA H100 80GB HBM3 (torch 2.9.0, triton 3.5.0) on 2026-01-02"
    cells = [{"out": stored}, {"code": "# an A100 would differ", "out": "A100: 0.4"}]
    agree = seeded_page(cells, "<p>On the H100 the kernel takes 3 ms.</p>")
    assert gpu_name_problems(agree) == []  # names in code and outputs are not prose
    differ = seeded_page(cells, "<p>On the H200 the kernel takes 3 ms.</p>")
    assert gpu_name_problems(differ) == ["the prose names H200, no provenance line does"]
    no_record = seeded_page([{"out": "1.5"}], "<p>An H100 ran it.</p>")
    assert gpu_name_problems(no_record) == ["the prose names H100, no provenance line does"]
    plain = seeded_page([], "<p>Layer 4, step 100, T = 4 and the L2 norm.</p>")
    assert gpu_name_problems(plain) == []


def test_page_weight_counts_the_html_and_its_images(tmp_path):
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "a.png").write_bytes(b"x" * 600_000)
    (tmp_path / "_images" / "b.png").write_bytes(b"x" * 500_000)
    (tmp_path / "book").mkdir()
    page = tmp_path / "book" / "ch.html"
    one = '<img alt="a figure" src="../_images/a.png">'
    page.write_text(seeded_page([{"img": one}]))
    assert page_weight(page, tmp_path) == page.stat().st_size + 600_000
    assert page_rule_problems(page, tmp_path) == []
    two = one + '<img alt="another figure" src="../_images/b.png">'
    page.write_text(seeded_page([{"img": two}]))
    problems = page_rule_problems(page, tmp_path)
    assert len(problems) == 1 and problems[0].startswith("page weight"), problems


def test_the_not_yet_list_only_shrinks(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "NOT_YET", {"alt text": {"book/x"}})
    alt = "a.png: alt text '' says not what it shows"
    long = "code cell 3: 41 lines (at most 40)"
    assert ratchet("book/x", [alt, long]) == [long]  # the listed rule is allowed, no other
    assert ratchet("book/y", [alt]) == [alt]  # only on the listed page
    assert ratchet("book/x", []) == ["alt text: no longer broken here, take the page off NOT_YET"]
    assert {rule_of(p) for p in (alt, long, "page weight 2 bytes", "the prose names T4")} == set(
        NOT_YET_RULES
    )


def test_progress_bars_and_repeated_lines_are_caught():
    bar = " 45%|████▌     | 9/20 [00:01<00:02,  4.50it/s]"
    assert progress_bars(bar)
    assert progress_bars("100%|##########| 20/20 [00:04<00:00, 4.9it/s]")
    assert progress_bars("epoch 3: 12.5s/it]")
    assert progress_bars("bias 45% of rows | rms 0.5 | done") == []
    assert progress_bars("mean +0.212 ulp (s.e. 0.004), 4,096 rows") == []
    code = 'print(\n    f"x"\n' + '    f""\n' * 49 + ")\n"
    assert repeated_lines(code) == ["49 x 'f\"\"'"]
    nested = "f(\n    g(\n        h(\n            1\n        )\n    )\n)\n"
    assert repeated_lines(nested) == []
    assert repeated_lines("a = 1\n\n\n\n\nb = 2\n") == []  # blank lines are layout


def test_missing_outputs_are_caught():
    def cell(outputs, tags=()):
        return {
            "cell_type": "code",
            "source": ["show()"],
            "outputs": outputs,
            "metadata": {"tags": list(tags)},
        }

    widget = {
        "output_type": "display_data",
        "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "1"}},
    }
    text = {"output_type": "stream", "name": "stdout", "text": "0.5\n"}
    glued = {
        "output_type": "display_data",
        "data": {"application/papermill.record/text/plain": "1"},
    }
    notebook = {
        "cells": [
            cell([text]),
            cell([]),
            cell([widget]),
            cell([text], ["remove-cell"]),
            cell([widget], ["remove-output"]),
            cell([glued, glued]),  # a cell that only glues shows nothing, rightly
        ]
    }
    assert missing_outputs(notebook, [True, False, True, False, False]) == []
    assert missing_outputs({"cells": [cell([glued, text])]}, [False]) != []  # its print is lost
    # the seeded fault: the widget's cell renders nothing on the site
    problems = missing_outputs(notebook, [True, False, False, False, False])
    assert len(problems) == 1 and "code cell 3" in problems[0]
    assert missing_outputs(notebook, [True, False]) != []  # cells do not match the page


def test_the_figure_record_rules():
    clean = {style.PNG_KEY_BARS_OFF_ZERO: "0", style.PNG_KEY_OVERLAPS: "0"}
    assert record_debris("a.png", clean) == []
    assert len(record_debris("a.png", {**clean, style.PNG_KEY_BARS_OFF_ZERO: "1"})) == 1
    assert len(record_debris("a.png", {**clean, style.PNG_KEY_OVERLAPS: "2"})) == 1
    assert len(record_debris("a.png", {})) == 2  # a figure made before the checks existed


def test_forgiven_log_entries_are_narrow():
    """The rule above must not hide real errors."""

    def entry(source, message):
        return {"source": source, "level": "SEVERE", "message": message}

    local = f"http://{LOCAL_HOST}:8000"
    assert forgivable(
        entry(
            "network",
            "https://cdn.example.org/x.js - Failed to load resource: net::ERR_NAME_NOT_RESOLVED",
        )
    )
    assert forgivable(
        entry(
            "network",
            f"{local}/favicon.ico - Failed to load resource: the "
            "server responded with a status of 404 (File not found)",
        )
    )
    assert not forgivable(
        entry(
            "network",
            f"{local}/_static/x.js - Failed to load resource: the "
            "server responded with a status of 404 (File not found)",
        )
    )
    assert not forgivable(
        entry(
            "network",
            "https://cdn.example.org/x.js - Failed to load "
            "resource: the server responded with a status of 500",
        )
    )
    assert not forgivable(
        entry("javascript", "https://cdn.example.org/x.js 12:3 Uncaught TypeError: x is undefined")
    )
    assert not forgivable(
        entry("console-api", f'{local}/_static/a.js 0:1 "Got invalid theme mode"')
    )


# ---------------------------------------------------------------- the build itself
def build_mini_book(root: Path, intro: str, code: str) -> subprocess.CompletedProcess:
    """Build a one-chapter book with the repository's real _config.yml and the README's flags."""
    (root / "book").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "_config.yml", root / "_config.yml")
    shutil.copy(REPO_ROOT / "book" / "references.bib", root / "book" / "references.bib")
    for folder in ("_ext", "_static"):
        shutil.copytree(
            REPO_ROOT / "book" / folder,
            root / "book" / folder,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    (root / "_toc.yml").write_text(
        "format: jb-book\nroot: book/intro\nchapters:\n  - file: book/01_probe\n"
    )
    (root / "book" / "intro.md").write_text(intro)
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "# Probe\n\nMath: $x^2$."},
        {
            "cell_type": "code",
            "metadata": {},
            "source": code,
            "outputs": [],
            "execution_count": None,
        },
    ]
    nb = {
        "cells": cells,
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    }
    (root / "book" / "01_probe.ipynb").write_text(json.dumps(nb))
    return subprocess.run(
        ["jupyter-book", "build", str(root), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_build_fails_on_a_warning_and_on_a_raising_cell(tmp_path):
    value = os.urandom(4).hex()
    good = build_mini_book(tmp_path, "# Front\n\nText.\n", f"print('{value}')")
    assert good.returncode == 0, good.stdout[-3000:]
    page = (tmp_path / "_build" / "html" / "book" / "01_probe.html").read_text()
    assert value in page  # the notebook was executed
    assert "_static/mathjax/tex-chtml.js" in page
    assert (tmp_path / "_build" / "html" / "_static" / "mathjax" / "tex-chtml.js").is_file()

    warned = build_mini_book(
        tmp_path, "# Front\n\nSee {ref}`no-such-label`.\n", f"print('{value}')"
    )
    assert warned.returncode != 0
    assert "undefined label" in warned.stdout + warned.stderr

    raised = build_mini_book(tmp_path, "# Front\n\nText.\n", f"raise ValueError('{value}')")
    assert raised.returncode != 0
    assert "CellExecutionError" in raised.stdout + raised.stderr


# ---------------------------------------------------------------- explorers on every screen (45)
MAX_TABS_TO_EXPLORER = 20
NARROW_WINDOW = (420, 900)
MIN_EXPLORER_FONT_PX = 12.0


def presses_to_first_control(browser, name: str, limit: int = MAX_TABS_TO_EXPLORER):
    """Key presses from a freshly loaded page until the explorer's first control has the focus:
    Tab, and Enter on the explorer's "Skip to the explorer" link when Tab reaches it. None if
    ``limit`` presses do not get there."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    first = browser.execute_script(
        "return document.querySelector(`.book-explorer[data-name='${arguments[0]}'] "
        "[data-control]`).id;",
        name,
    )
    for presses in range(1, limit + 1):
        active = browser.execute_script(
            "const a = document.activeElement;"
            "return a ? [a.id, a.className || '', a.tagName] : ['', '', ''];"
        )
        key = Keys.ENTER if "book-explorer-skip" in active[1] else Keys.TAB
        ActionChains(browser).send_keys(key).perform()
        if browser.execute_script("return document.activeElement.id;") == first:
            return presses
    return None


def explorer_overflow(browser, root) -> list[str]:
    """What sticks out of the explorer or the window, SVG texts cut at the plot's edge, and
    plot text drawn smaller than MIN_EXPLORER_FONT_PX."""
    return browser.execute_script(
        "const root = arguments[0], minPx = arguments[1], bad = [];"
        "const r = root.getBoundingClientRect(), vw = document.documentElement.clientWidth;"
        "if (r.left < -1 || r.right > vw + 1)"
        "  bad.push(`explorer spans ${r.left.toFixed(0)}-${r.right.toFixed(0)} px of ${vw}`);"
        "if (root.scrollWidth > root.clientWidth + 1)"
        "  bad.push(`explorer scrolls: ${root.scrollWidth} > ${root.clientWidth} px`);"
        "root.querySelectorAll('label, input, select, output, svg, p').forEach(e => {"
        "  const b = e.getBoundingClientRect();"
        "  if (b.width && (b.left < r.left - 1 || b.right > r.right + 1))"
        "    bad.push(`${e.tagName} '${e.textContent.slice(0, 30)}' sticks out`); });"
        "const svg = root.querySelector('svg.book-explorer-plot'), s = svg.getBoundingClientRect();"
        "svg.querySelectorAll('text').forEach(t => {"
        "  const b = t.getBoundingClientRect();"
        "  if (b.width && (b.left < s.left - 1 || b.right > s.right + 1 || b.top < s.top - 1"
        "      || b.bottom > s.bottom + 1)) bad.push(`text cut: '${t.textContent}'`); });"
        "const px = 15 * s.width / svg.viewBox.baseVal.width;"
        "if (px < minPx) bad.push(`plot text ${px.toFixed(1)} px (at least ${minPx})`);"
        "return bad;",
        root,
        MIN_EXPLORER_FONT_PX,
    )


@pytest.mark.parametrize("chapter, name", EXPLORERS.items())
def test_the_explorer_is_reached_within_20_key_presses(browser, site_url, chapter, name):
    """From a freshly loaded page (1280 px), Tab and the "Skip to the explorer" link bring the
    keyboard to the explorer's first control in at most 20 presses (issue 45: it took 146-202
    Tab presses past the site's navigation)."""
    open_explorer(browser, site_url, chapter, name)
    presses = presses_to_first_control(browser, name)
    assert presses is not None, f"{chapter}: not reached in {MAX_TABS_TO_EXPLORER} presses"


@pytest.mark.parametrize("chapter, name", EXPLORERS.items())
def test_the_explorer_fits_a_420_px_screen(browser, site_url, chapter, name):
    """At a phone's 420 px nothing of the explorer sticks out of it or the window, no value
    label is cut at the plot's edge and its text stays legible (the panels stack); it still
    moves with the keyboard."""
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(*NARROW_WINDOW)
    try:
        root = open_explorer(browser, site_url, chapter, name)
        assert root.get_attribute("data-layout") == "stacked"
        assert explorer_overflow(browser, root) == [], f"{chapter} at 420 px"
        before = explorer_state(browser, name)["state"]
        control = root.find_elements("css selector", "input[type=range]")[-1]
        control.send_keys(Keys.HOME if control.get_attribute("value") != "0" else Keys.END)
        WebDriverWait(browser, 10).until(lambda b: explorer_state(b, name)["state"] != before)
        assert explorer_overflow(browser, root) == [], f"{chapter} at 420 px, moved"
        save_explorer_shot(root, name, "420px")
    finally:
        browser.set_window_size(1280, 1600)


def test_the_overflow_rule_catches_a_wide_explorer(browser, tmp_path):
    """explorer_overflow on a seeded page: a control wider than its explorer, and an SVG text
    past the plot's edge."""
    page = tmp_path / "wide.html"
    page.write_text(
        "<html><body style='margin:0'><div class='book-explorer' style='width:300px'>"
        "<label>a label</label><input style='width:500px'>"
        "<svg class='book-explorer-plot' viewBox='0 0 300 100' style='width:300px'>"
        "<text x='280' y='50' font-size='15'>a value cut off</text></svg></div></body></html>"
    )
    browser.get(page.as_uri())
    root = browser.find_element("css selector", ".book-explorer")
    problems = explorer_overflow(browser, root)
    assert any(p.startswith("INPUT") for p in problems), problems
    assert "text cut: 'a value cut off'" in problems, problems
