"""kernels.tools.booktools and the README: everything that names the repository derives from
_config.yml.

* the chapters' setup cells and the README's Colab table are in sync (`booktools check`);
* changing the URL in a copy of the repository really changes the derived setup cells, Colab
  badges and the website's launch buttons, and `check` notices until `sync` is run;
* the URL is written by hand nowhere but _config.yml;
* the README holds exactly two commands, and .ci/run runs exactly those.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.env import REPO_ROOT
from kernels.tools import booktools


def run_booktools(root: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels.tools.booktools", command],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def setup_cell_source(nb_path: Path) -> str:
    nb = json.loads(nb_path.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "setup" in first_code.get("metadata", {}).get("tags", []), nb_path.name
    return "".join(first_code["source"])


def probe_notebook(title: str) -> dict:
    """A minimal chapter: a title and an (outdated) setup cell."""
    return {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": [f"# {title}\n"]},
            {
                "cell_type": "code",
                "metadata": {"tags": ["setup"]},
                "source": ["pass\n"],
                "outputs": [],
                "execution_count": None,
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


# ---------------------------------------------------------------- the repository as it is
def test_setup_cells_and_readme_are_in_sync():
    assert booktools.problems() == []
    done = run_booktools(REPO_ROOT, "check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_chapter_in_the_toc_has_a_readme_row_and_a_notebook():
    toc = (REPO_ROOT / "_toc.yml").read_text()
    listed = re.findall(r"file:\s*book/(\d\d_\w+)", toc)
    on_disk = sorted(p.stem for p in (REPO_ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    assert listed == on_disk, f"_toc.yml lists {listed}, book/ holds {on_disk}"
    readme = (REPO_ROOT / "README.md").read_text()
    for name in listed:
        nb_path = REPO_ROOT / "book" / f"{name}.ipynb"
        assert nb_path.is_file(), f"{nb_path.name} is listed in _toc.yml but missing"
        assert booktools.colab_url(nb_path) in readme


def test_repository_url_is_written_by_hand_only_in_config():
    url, _ = booktools.repository()
    slug = url.split("github.com/")[-1]
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        pytest.fail("git ls-files failed: the tests run in a git checkout")
    offenders = []
    for rel in listed.stdout.splitlines():
        path = REPO_ROOT / rel
        if rel == "_config.yml" or not path.is_file() or path.suffix in (".png", ".pdf"):
            continue
        text = path.read_text(errors="replace")
        if rel == "README.md":  # the generated chapter table may name it
            head, rest = text.split(booktools.README_BEGIN, 1)
            text = head + rest.split(booktools.README_END, 1)[1]
        elif path.suffix == ".ipynb":  # the generated setup cell may name it
            nb = json.loads(text)
            text = json.dumps(
                [c for c in nb["cells"] if "setup" not in c.get("metadata", {}).get("tags", [])]
            )
        if slug in text:
            offenders.append(rel)
    assert offenders == [], f"the repository ({slug}) is hard-coded in {offenders}"


# ---------------------------------------------------------------- moving the book
@pytest.fixture
def repo_copy(tmp_path):
    """A copy of what booktools reads and writes: kernels/, the chapters, README, _config.yml."""
    root = tmp_path / "book-copy"
    shutil.copytree(
        REPO_ROOT / "kernels", root / "kernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "book").mkdir()
    for nb_path in booktools.chapters():
        shutil.copy(nb_path, root / "book" / nb_path.name)
    # One chapter of our own, so the derivation is exercised even before the chapters exist.
    (root / "book" / "99_probe.ipynb").write_text(json.dumps(probe_notebook("Probe chapter")))
    for name in ("README.md", "_config.yml", "_toc.yml"):
        shutil.copy(REPO_ROOT / name, root / name)
    return root


def move(root: Path, url: str, branch: str) -> None:
    config = root / "_config.yml"
    text = config.read_text()
    text, n_url = re.subn(r"(?m)^(\s+url:\s*)\S+", rf"\g<1>{url}", text, count=1)
    text, n_branch = re.subn(r"(?m)^(\s+branch:\s*)\S+", rf"\g<1>{branch}", text, count=1)
    assert n_url == n_branch == 1
    config.write_text(text)


def test_changing_the_url_changes_every_derived_link(repo_copy):
    old_url, _ = booktools.repository()
    org = "org" + os.urandom(3).hex()
    new_url, branch = f"https://github.com/{org}/moved-book", "dev" + os.urandom(2).hex()
    move(repo_copy, new_url, branch)

    stale = run_booktools(repo_copy, "check")
    assert stale.returncode == 1 and "README.md" in stale.stdout and "99_probe" in stale.stdout

    synced = run_booktools(repo_copy, "sync")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert run_booktools(repo_copy, "check").returncode == 0

    readme = (repo_copy / "README.md").read_text()
    notebooks = sorted((repo_copy / "book").glob("[0-9][0-9]_*.ipynb"))
    assert notebooks
    for nb_path in notebooks:
        colab = f"https://colab.research.google.com/github/{org}/moved-book/blob/{branch}/book/{nb_path.name}"
        assert colab in readme, nb_path.name
        source = setup_cell_source(nb_path)
        assert f'REPO_URL, BRANCH = "{new_url}", "{branch}"' in source
        assert old_url not in source
    table = readme.split(booktools.README_BEGIN, 1)[1].split(booktools.README_END, 1)[0]
    assert old_url.split("github.com/")[-1] not in table

    # The website's buttons read the same key: the Sphinx configuration jupyter-book derives.
    conf = subprocess.run(
        ["jupyter-book", "config", "sphinx", str(repo_copy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert conf.returncode == 0, conf.stderr
    conf_py = (repo_copy / "conf.py").read_text()
    assert f"'repository_url': '{new_url}'" in conf_py
    assert f"'repository_branch': '{branch}'" in conf_py
    assert "'colab_url': 'https://colab.research.google.com'" in conf_py


def test_check_fails_when_a_setup_cell_is_edited_by_hand(repo_copy):
    assert run_booktools(repo_copy, "sync").returncode == 0
    probe = repo_copy / "book" / "99_probe.ipynb"
    nb = json.loads(probe.read_text())
    nb["cells"][1]["source"] = setup_cell_source(probe).replace("seed=0", "seed=1")
    probe.write_text(json.dumps(nb))
    done = run_booktools(repo_copy, "check")
    assert done.returncode == 1 and "99_probe.ipynb: setup cell differs" in done.stdout


# ---------------------------------------------------------------- README <-> CI
def readme_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split("<!-- commands:begin -->\n", 1)[1].split("<!-- commands:end -->", 1)[0]
    return [line for line in block.splitlines() if line.startswith("pip install ")]


def test_readme_has_exactly_two_commands():
    build, test = readme_commands()
    assert build.startswith("pip install -r requirements.txt && jupyter-book build . ")
    assert " -W" in build  # warnings fail the build
    assert test == "pip install -r requirements.txt && python -m pytest"


def test_ci_runs_the_readme_commands():
    script = (REPO_ROOT / ".ci" / "run").read_text()
    assert script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in script
    done = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci" / "run"), "--commands"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == readme_commands()
    assert 'eval "$TEST_CMD"' in script and 'eval "$BUILD_CMD"' in script


def test_run_plain_runs_several_notebooks_in_one_process_without_ipython(tmp_path):
    """The GPU machine has no IPython: the stand-in must survive a second notebook."""
    script = tmp_path / "run_two.py"
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
                "source": ["from IPython.display import display\n", "display('ok')\n"],
            }
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    for name in ("a.ipynb", "b.ipynb"):
        (tmp_path / name).write_text(json.dumps(nb))
    script.write_text(
        "import sys\n"
        "sys.modules['IPython'] = None  # as if not installed (the GPU machine has none)\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from kernels.tools import booktools\n"
        f"for n in ('a.ipynb', 'b.ipynb'): booktools.run_plain({str(tmp_path)!r} + '/' + n)\n"
        "print('both ran')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "both ran" in done.stdout and done.stdout.count("ok") == 2
