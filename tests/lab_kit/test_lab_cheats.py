"""Issue 43's cheat list, re-run against the current grader's scan (one rule, shared with the
notebook's checks: :func:`kernels.checking.scan`).

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
from lab_kit_helpers import chapter_exercises

from kernels.checking import SETUP_MODULES, Forbidden, bindings, scan
from kernels.lab_kit import notebook
from kernels.lab_kit.grading import chapter_imports

SOURCE = "_build/lab/course/source/ch03/03_flash_forward.ipynb"
NOOP = "@triton.jit\ndef noop(x_ptr):\n    pass\n"

# (what the review did, exercise, the answer's source, what the grader must name)
CHEATS = [
    # reaching the checks' private references
    (
        "pkgutil.resolve_name",
        "3.1",
        "import pkgutil\nmerge = pkgutil.resolve_name('kernels.flash.exercises:_merge_expected')",
        "import pkgutil",
    ),
    (
        "pydoc.locate",
        "2.1",
        "from pydoc import locate\nlaunch_grid = locate('kernels.triton_exercises.x')",
        "import pydoc",
    ),
    (
        "operator.attrgetter",
        "3.1",
        "import operator\nmerge = operator.attrgetter('_merge' + '_expected')(ex)",
        "operator.attrgetter",
    ),
    (
        "attrgetter by name",
        "3.1",
        "from operator import attrgetter as a\nmerge = a('check_merge')(ex)",
        "import attrgetter",
    ),
    (
        "exec through timeit",
        "2.1",
        "import timeit\ntimeit.timeit('1', number=1)\nlaunch_grid = None",
        "import timeit",
    ),
    (
        "exec through code",
        "2.1",
        "from code import InteractiveInterpreter as I\nI().runsource('x = 1')",
        "import code",
    ),
    ("exec through cProfile", "2.1", "import cProfile\ncProfile.run('x = 1')", "import cProfile"),
    (
        "match class pattern on __globals__",
        "3.1",
        "def merge(a, b, c, d):\n    match (lambda: 0):\n        case object(__globals__=g):\n"
        "            return g\n",
        ".__globals__",
    ),
    (
        "match class pattern on a frame",
        "3.1",
        "def f():\n    yield\nmatch f():\n    case object(gi_frame=fr):\n        merge = fr\n",
        "_.gi_frame",
    ),
    (
        "stack walk: traceback",
        "3.1",
        "import traceback\nmerge = traceback.walk_stack(None)",
        "import traceback",
    ),
    (
        "stack walk: logging",
        "3.1",
        "import logging\nmerge = logging.currentframe()",
        "import logging",
    ),
    (
        "stack walk: a generator's frame",
        "3.1",
        "def g():\n    yield\nit = g()\nmerge = it.gi_frame.f_back",
        "it.gi_frame",
    ),
    (
        "stack walk: an exception's traceback",
        "3.1",
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    merge = e.__traceback__",
        ".__traceback__",
    ),
    ("a private attribute of a library", "3.1", "merge = torch._C", "torch._C"),
    ("a name the chapter bound to os", "2.1", "launch_grid = os.listdir('.')", "os"),
    # reading the autograder's solutions on disk
    ("open the solutions", "3.1", f"text = open({SOURCE!r}).read()", "open"),
    ("io.open", "3.1", f"import io\ntext = io.open({SOURCE!r}).read()", "import io"),
    ("pathlib", "3.1", f"from pathlib import Path\ntext = Path({SOURCE!r})", "import pathlib"),
    ("NumPy reads the file", "3.1", f"text = np.loadtxt({SOURCE!r}, dtype=str)", "np.loadtxt"),
    ("torch reads the file", "3.1", f"text = torch.from_file({SOURCE!r})", "torch.from_file"),
    # libraries doing the work of 2.2
    (
        "no-op Triton launch + argsort",
        "2.2",
        NOOP + "def row_max(x):\n    noop[(1,)](x)\n    i = x.argsort(dim=1)[:, -1:]\n"
        "    return x.gather(1, i)[:, 0]",
        "x.argsort",
    ),
    (
        "MaxPool1d",
        "2.2",
        "def row_max(x):\n    return torch.nn.MaxPool1d(x.shape[1])(x[:, None])[:, 0, 0]",
        "torch.nn.MaxPool1d",
    ),
    (
        "nanquantile",
        "2.2",
        "def row_max(x):\n    return torch.nanquantile(x, 1.0, dim=1)",
        "torch.nanquantile",
    ),
    (
        "a torch.maximum fold",
        "2.2",
        "def row_max(x):\n    out = x[:, 0]\n    for j in range(1, x.shape[1]):\n"
        "        out = torch.maximum(out, x[:, j])\n    return out",
        "torch.maximum",
    ),
    (
        "a reduction named by a string",
        "2.2",
        "def row_max(x, idx):\n    return x.new_zeros(3).index_reduce_(0, idx, x, 'amax')",
        "'amax'",
    ),
    (
        "a reduction inside an unlaunched jit function",
        "2.2",
        "@triton.jit\ndef k(x):\n    return x.amax(1)\ndef row_max(x):\n    return k.fn(x)",
        "k.fn",
    ),
    ("a unique-sort", "2.2", "def row_max(x):\n    return x.unique()[-1]", "x.unique"),
    # 1.2, 5.2, 8.2
    (
        "ml_dtypes by string",
        "1.2",
        "import pkgutil\nbf16 = pkgutil.resolve_name('ml_dtypes:bfloat16')",
        "import pkgutil",
    ),
    ("ml_dtypes named in a string", "1.2", "NAME = 'ml_dtypes'", "'ml_dtypes'"),
    (
        "ml_dtypes from the chapter's cells",
        "1.2",
        "def round_bits_to_bf16(b):\n    return ml_dtypes.bfloat16(b)",
        "ml_dtypes",
    ),
    (".astype('bfloat16')", "5.2", "def f(x):\n    return x.astype('bfloat16')", "'bfloat16'"),
    (
        "SciPy from the chapter's cells",
        "8.2",
        "def w1(a, b):\n    return float(wasserstein_distance(a, b))",
        "wasserstein_distance",
    ),
    (
        "SciPy imported",
        "8.2",
        "from scipy import stats\ndef w1(a, b):\n    return stats.wasserstein_distance_nd(a, b)",
        "import scipy",
    ),
    (
        "SciPy from a star import",
        "8.2",
        "from scipy.stats import *\nw1 = None",
        "import scipy.stats",
    ),
]


def chapter_names(exercise: str):
    """The names the grader gives the scan for ``exercise``'s chapter: the setup's modules and
    the chapter's earlier imports (name: module), and the names bound to the book's package."""
    _, nb, setup, _ = chapter_exercises(f"{int(exercise.split('.')[0]):02d}")
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
    assert f"`{named}`" in str(err.value) and f"Exercise {exercise}" in str(err.value)


@pytest.mark.parametrize("number", ["01", "02", "03", "05", "08"])
def test_the_books_solutions_pass_the_same_scan_with_the_chapters_names(number):
    """The table's rules refuse no honest answer: every solution of these chapters passes."""
    _, nb, _, found = chapter_exercises(number)
    for ex in found:
        modules, package = chapter_names(ex.name)
        scan(notebook.source(nb["cells"][ex.answer]), ex.name, modules, package)
