"""The review's cheat list, re-run against the current grader's scan (one rule, shared with the
notebook's checks: :func:`kernels.exercise_rules.scan`).

``CHEATS`` is the stored table: each row is a cheat of the review (or a close variant), the
exercise it targets, and the thing the scan must name when it scores that exercise 0. The scan
gets what the grader gives it for that chapter: the exercise setup's names, the names bound by
the imports of the chapter's earlier cells (``from scipy.stats import wasserstein_distance`` in
chapter 8, ``import os`` in chapter 2) and the names bound to the book's package. The attacks
that act while an answer runs (rewriting files, killing workers, SIGSTOP, memory, time) are run
through the whole grader in ``test_lab_robust.py``; the end-to-end cheating students are in
``test_lab_grading.py``.
"""

from __future__ import annotations

import ast

import pytest
from course_lab_helpers import chapter_exercises, chapter_of_label

from kernels.course_lab import notebook
from kernels.course_lab.grading import chapter_imports
from kernels.exercise_rules import SETUP_MODULES, Forbidden, bindings, scan

SOURCE = "_build/lab/course/source/ch03/03_flash_forward.ipynb"
NOOP = "@triton.jit\ndef noop(x_ptr):\n    pass\n"

# (what the review did, exercise, the answer's source, what the grader must name)
CHEATS = [
    # reaching the checks' private references
    (
        "pkgutil.resolve_name",
        "ch3-merge",
        "import pkgutil\nmerge = pkgutil.resolve_name('kernels.flash.exercises:_merge_expected')",
        "import pkgutil",
    ),
    (
        "pydoc.locate",
        "ch2-grid",
        "from pydoc import locate\nlaunch_grid = locate('kernels.triton_exercises.x')",
        "import pydoc",
    ),
    (
        "operator.attrgetter",
        "ch3-merge",
        "import operator\nmerge = operator.attrgetter('_merge' + '_expected')(ex)",
        "operator.attrgetter",
    ),
    (
        "attrgetter by name",
        "ch3-merge",
        "from operator import attrgetter as a\nmerge = a('check_merge')(ex)",
        "import attrgetter",
    ),
    (
        "exec through timeit",
        "ch2-grid",
        "import timeit\ntimeit.timeit('1', number=1)\nlaunch_grid = None",
        "import timeit",
    ),
    (
        "exec through code",
        "ch2-grid",
        "from code import InteractiveInterpreter as I\nI().runsource('x = 1')",
        "import code",
    ),
    (
        "exec through cProfile",
        "ch2-grid",
        "import cProfile\ncProfile.run('x = 1')",
        "import cProfile",
    ),
    (
        "match class pattern on __globals__",
        "ch3-merge",
        "def merge(a, b, c, d):\n    match (lambda: 0):\n        case object(__globals__=g):\n"
        "            return g\n",
        ".__globals__",
    ),
    (
        "match class pattern on a frame",
        "ch3-merge",
        "def f():\n    yield\nmatch f():\n    case object(gi_frame=fr):\n        merge = fr\n",
        "_.gi_frame",
    ),
    (
        "stack walk: traceback",
        "ch3-merge",
        "import traceback\nmerge = traceback.walk_stack(None)",
        "import traceback",
    ),
    (
        "stack walk: logging",
        "ch3-merge",
        "import logging\nmerge = logging.currentframe()",
        "import logging",
    ),
    (
        "stack walk: a generator's frame",
        "ch3-merge",
        "def g():\n    yield\nit = g()\nmerge = it.gi_frame.f_back",
        "it.gi_frame",
    ),
    (
        "stack walk: an exception's traceback",
        "ch3-merge",
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    merge = e.__traceback__",
        ".__traceback__",
    ),
    ("a private attribute of a library", "ch3-merge", "merge = torch._C", "torch._C"),
    ("a name the chapter bound to os", "ch2-grid", "launch_grid = os.listdir('.')", "os"),
    # reading the autograder's solutions on disk
    ("open the solutions", "ch3-merge", f"text = open({SOURCE!r}).read()", "open"),
    ("io.open", "ch3-merge", f"import io\ntext = io.open({SOURCE!r}).read()", "import io"),
    (
        "pathlib",
        "ch3-merge",
        f"from pathlib import Path\ntext = Path({SOURCE!r})",
        "import pathlib",
    ),
    (
        "NumPy reads the file",
        "ch3-merge",
        f"text = np.loadtxt({SOURCE!r}, dtype=str)",
        "np.loadtxt",
    ),
    ("torch reads the file", "ch3-merge", f"text = torch.from_file({SOURCE!r})", "torch.from_file"),
    # libraries doing the work of ch2-rowmax
    (
        "no-op Triton launch + argsort",
        "ch2-rowmax",
        NOOP + "def row_max(x):\n    noop[(1,)](x)\n    i = x.argsort(dim=1)[:, -1:]\n"
        "    return x.gather(1, i)[:, 0]",
        "x.argsort",
    ),
    (
        "MaxPool1d",
        "ch2-rowmax",
        "def row_max(x):\n    return torch.nn.MaxPool1d(x.shape[1])(x[:, None])[:, 0, 0]",
        "torch.nn.MaxPool1d",
    ),
    (
        "nanquantile",
        "ch2-rowmax",
        "def row_max(x):\n    return torch.nanquantile(x, 1.0, dim=1)",
        "torch.nanquantile",
    ),
    (
        "a torch.maximum fold",
        "ch2-rowmax",
        "def row_max(x):\n    out = x[:, 0]\n    for j in range(1, x.shape[1]):\n"
        "        out = torch.maximum(out, x[:, j])\n    return out",
        "torch.maximum",
    ),
    (
        "a reduction named by a string",
        "ch2-rowmax",
        "def row_max(x, idx):\n    return x.new_zeros(3).index_reduce_(0, idx, x, 'amax')",
        "'amax'",
    ),
    (
        "a reduction inside an unlaunched jit function",
        "ch2-rowmax",
        "@triton.jit\ndef k(x):\n    return x.amax(1)\ndef row_max(x):\n    return k.fn(x)",
        "k.fn",
    ),
    ("a unique-sort", "ch2-rowmax", "def row_max(x):\n    return x.unique()[-1]", "x.unique"),
    # ex-bf16-round-bits, ex-sources-midpoint, ex-golden-w1
    (
        "ml_dtypes by string",
        "ex-bf16-round-bits",
        "import pkgutil\nbf16 = pkgutil.resolve_name('ml_dtypes:bfloat16')",
        "import pkgutil",
    ),
    ("ml_dtypes named in a string", "ex-bf16-round-bits", "NAME = 'ml_dtypes'", "'ml_dtypes'"),
    (
        "ml_dtypes from the chapter's cells",
        "ex-bf16-round-bits",
        "def round_bits_to_bf16(b):\n    return ml_dtypes.bfloat16(b)",
        "ml_dtypes",
    ),
    (
        ".astype('bfloat16')",
        "ex-sources-midpoint",
        "def f(x):\n    return x.astype('bfloat16')",
        "'bfloat16'",
    ),
    (
        "SciPy from the chapter's cells",
        "ex-golden-w1",
        "def w1(a, b):\n    return float(wasserstein_distance(a, b))",
        "wasserstein_distance",
    ),
    (
        "SciPy imported",
        "ex-golden-w1",
        "from scipy import stats\ndef w1(a, b):\n    return stats.wasserstein_distance_nd(a, b)",
        "import scipy",
    ),
    (
        "SciPy from a star import",
        "ex-golden-w1",
        "from scipy.stats import *\nw1 = None",
        "import scipy.stats",
    ),
]


def chapter_names(exercise: str):
    """The names the grader gives the scan for ``exercise``'s chapter: the setup's modules and
    the chapter's earlier imports (name: module), and the names bound to the book's package."""
    _, nb, setup, _ = chapter_exercises(chapter_of_label(exercise))
    statements, package = chapter_imports(nb["cells"][:setup])
    modules = dict(SETUP_MODULES)
    for statement in statements:
        for node in ast.walk(ast.parse(statement)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules.update(bindings(node))
    return modules, tuple(package - set(modules))


@pytest.mark.parametrize(
    "exercise, source, named", [c[1:] for c in CHEATS], ids=[c[0] for c in CHEATS]
)
def test_every_cheat_of_the_review_is_named_and_scores_zero(exercise, source, named):
    modules, package = chapter_names(exercise)
    with pytest.raises(Forbidden) as err:
        scan(source, exercise, modules, package)
    assert f"`{named}`" in str(err.value) and f"exercise {exercise}" in str(err.value)


@pytest.mark.parametrize("number", ["01", "02", "03", "05", "08"])
def test_the_books_solutions_pass_the_same_scan_with_the_chapters_names(number):
    """The table's rules refuse no honest answer: every solution of these chapters passes."""
    _, nb, _, found = chapter_exercises(number)
    for ex in found:
        modules, package = chapter_names(ex.label)
        scan(notebook.source(nb["cells"][ex.answer]), ex.label, modules, package)
