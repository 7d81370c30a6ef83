"""What every exercise check of the book shares.

A check (one per exercise, in the chapters' ``exercises.py`` modules) follows four rules:

* it draws **fresh random inputs** on every run from its own generator, seeded by the operating
  system (:func:`fresh_seed`), so a chapter's seeded random stream is left untouched and no
  answer can be fitted to one fixed draw;
* a blank answer (``None``, or a function whose body is still empty and so returns ``None``)
  **fails**, with "no answer yet" in the message;
* a wrong answer fails with :class:`WrongAnswer`, whose message says *what* is wrong (which
  kind of input, which quantity) and **never** the expected value, a measured value or the
  formula;
* a right answer prints one line that starts with ``correct``;
* no public function of a chapter's ``exercises`` module returns an exercise's answer: what a
  check compares with is its own private code (``_launch_grid_expected``), and an answer that
  reaches for it, or for any other function of the module, scores 0 when graded; and a check
  of an exercise that forbids library calls doing its work refuses them
  (:func:`forbid`, which runs the grader's scan, :func:`scan`, on the function's source).

The autograder (:mod:`kernels.lab_kit.grading`) runs the same checks, in its own process, against
the answer running in a fresh process of its own: an answer cannot patch them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import secrets
import sys
import textwrap

import numpy as np

__all__ = [
    "WrongAnswer",
    "fresh_seed",
    "fresh_rng",
    "fresh_generator",
    "need",
    "need_function",
    "need_names",
    "need_tensor",
    "call",
    "fail",
    "correct",
    "Forbidden",
    "scan",
    "forbid",
    "FORBIDDEN",
]


class WrongAnswer(AssertionError):
    """An exercise answer is missing or wrong; the message says what is wrong."""


def fresh_seed() -> int:
    """A seed from the operating system: different on every call, independent of any seeding."""
    return secrets.randbits(62)


def fresh_rng() -> np.random.Generator:
    return np.random.default_rng(fresh_seed())


def fresh_generator(device="cpu"):
    """A torch generator seeded from :func:`fresh_seed` (the global torch seed is untouched)."""
    import torch

    return torch.Generator(device=device).manual_seed(fresh_seed())


def _one_line(shell, etype, value, tb, tb_offset=None):
    """IPython's display of a :class:`WrongAnswer`: its one-line message, not a traceback into
    the checks' code (the cell still fails, so a notebook run stops there)."""
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _short_errors_in_ipython() -> None:
    ipython = sys.modules.get("IPython")  # None where a runner blocks IPython
    shell = ipython.get_ipython() if hasattr(ipython, "get_ipython") else None
    if shell is not None and hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc((WrongAnswer,), _one_line)


def fail(message: str):
    raise WrongAnswer(message)


def need(answer, name: str, what: str):
    """Fail with "no answer yet" while ``answer`` is None; return it otherwise."""
    if answer is None:
        fail(f"no answer yet: set {name} to {what}, then run this cell again")
    return answer


def need_function(fn, name: str):
    """Fail unless ``fn`` is a function (a blank answer is None)."""
    need(fn, name, "a function")
    if not callable(fn):
        fail(f"{name} should be a function, got a {type(fn).__name__}")
    return fn


def need_names(answer, name: str, allowed, example: str) -> set:
    """The answer as a set of names from ``allowed`` (one name alone counts as a set of one);
    fail with "no answer yet" while it is None, and say what is wrong otherwise."""
    need(answer, name, f"a set of names such as {example}")
    if isinstance(answer, str):
        answer = {answer}
    try:
        given = set(answer)
    except TypeError:
        fail(f"{name} should be a set of names, got a {type(answer).__name__}")
    if not given <= set(allowed):
        fail(f"use only the names {list(allowed)}")
    return given


def need_tensor(got, name: str, shape, wrong_shape: str):
    """``got`` if it is a tensor of ``shape``; else fail, saying ``wrong_shape`` (what the shape
    should be) and the shape it has."""
    import torch

    if not isinstance(got, torch.Tensor):
        fail(f"{name} should return a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(shape):
        fail(f"{wrong_shape}, got shape {tuple(got.shape)}")
    return got


def call(fn, name: str, *args, **kwargs):
    """Call the reader's function; a blank body (returns None) and an exception both fail."""
    try:
        out = fn(*args, **kwargs)
    except WrongAnswer:
        raise
    except Exception as exc:  # the reader's code raised: say so, with its own message
        fail(f"{name} raised {type(exc).__name__}: {exc}")
    if out is None:
        fail(f"no answer yet: {name} returned None (its body is still empty?)")
    return out


def correct(text: str) -> None:
    print(f"correct: {text}")


# ----------------------------------------------------------------------------------------------
# What an answer may not do (the grader's scan; :func:`forbid` runs it in a check)
# ----------------------------------------------------------------------------------------------
# Found by reading an answer's source (Python's ``ast``), before it runs. The grader scans the
# source of every answer (the answer cell and any code cells the student added before it) and
# scores the exercise 0, with a message naming the call, when it finds:
#
# * anything that reaches into the grader or the package's internals: ``import kernels...``,
#   ``importlib``, ``sys``, ``os``, ``subprocess``, ``__import__``, ``exec``, ``eval``,
#   ``getattr``/``setattr``, ``globals()``, attributes with double underscores, and any attribute
#   of the checks' module ``ex`` except its upper-case constants (``ex.TILES``);
# * patching: assigning to an attribute of a module the exercise setup imports
#   (``ex.check_merge = ...``, ``torch.amax = ...``) or rebinding such a name (``ex = ...``);
# * in an exercise that asks you to implement something, the library calls that would do the work
#   (:data:`FORBIDDEN`): NumPy or ml_dtypes in the integer rounding of 1.2, PyTorch's reductions
#   outside the Triton kernel in 2.2, SciPy in 8.2, ...
#
# A scan is a second line of defence: every graded check also runs the answer in a fresh process
# of its own (:mod:`kernels.lab_kit.isolate`), so patching could not change a score anyway; the
# scan turns it into a clear 0 with a reason. The checks themselves scan the reader's function
# too (:func:`forbid`), where Python can find its source, so that a forbidden call fails in the
# notebook already, not only when graded.

# modules an answer never needs, and names that reach around the language
GENERIC_MODULES = {
    "kernels",
    "importlib",
    "sys",
    "os",
    "subprocess",
    "builtins",
    "inspect",
    "gc",
    "ctypes",
    "pickle",
    "marshal",
    "runpy",
    "multiprocessing",
    "threading",
    "signal",
    "socket",
    "shutil",
    "pathlib",
    "types",
    "unittest",
    "pytest",
    "nbgrader",
    "nbformat",
    "nbclient",
    "IPython",
}
# attributes through which a library's module reaches others (torch.sys.modules[...])
GENERIC_ATTRIBUTES = {
    "modules",
    "import_module",
    "reload",
    "f_globals",
    "f_back",
    "gi_frame",
    "cr_frame",
    "tb_frame",
    "func_globals",
    "system",
    "popen",
    "spawn",
}
GENERIC_NAMES = {
    "__import__",
    "exec",
    "eval",
    "compile",
    "globals",
    "locals",
    "vars",
    "getattr",
    "setattr",
    "delattr",
    "open",
    "breakpoint",
    "__builtins__",
    "get_ipython",
    "input",
}

_REDUCTIONS = {
    "amax",
    "amin",
    "max",
    "min",
    "aminmax",
    "sort",
    "topk",
    "argmax",
    "argmin",
    "cummax",
    "kthvalue",
    "msort",
    "nanmax",
    "median",
    "mode",
    "quantile",
    "numpy",
    "tolist",
    "item",
    "max_pool1d",
    "max_pool2d",
    "adaptive_max_pool1d",
}


@dataclasses.dataclass(frozen=True)
class Rule:
    """What an "implement it" exercise forbids: whole modules, names (called or not), and
    attribute calls (``x.amax(...)``), the latter allowed inside ``@triton.jit`` functions."""

    why: str
    modules: frozenset = frozenset()
    names: frozenset = frozenset()
    attributes: frozenset = frozenset()


def _rule(why, modules=(), names=(), attributes=()):
    return Rule(why, frozenset(modules), frozenset(names), frozenset(attributes))


FORBIDDEN = {
    "1.2": _rule(
        "the exercise asks for integer operations only",
        modules={"ml_dtypes", "numpy", "torch", "struct", "array", "math", "jax", "tensorflow"},
        names={"np", "torch", "float", "ml_dtypes"},
    ),
    "2.2": _rule(
        "the maxima must come from your Triton kernel",
        modules={"numpy", "scipy", "functools"},
        names={"max", "sorted", "np", "reduce"},
        attributes=_REDUCTIONS,
    ),
    "3.1": _rule("the exercise asks you to derive the merge", modules={"scipy"}),
    "3.2": _rule(
        "the exercise asks for a prediction, not a measurement",
        modules={"tracemalloc", "resource", "psutil"},
        attributes={
            "peak_live_bytes",
            "standard_attention",
            "memory_allocated",
            "max_memory_allocated",
        },
    ),
    "4.1": _rule(
        "the exercise asks you to derive the gap",
        attributes={"backward", "grad", "autograd", "vjp", "jacobian", "functional"},
    ),
    "5.2": _rule(
        "the exercise asks you to predict the error, not to round",
        modules={"ml_dtypes", "torch", "jax"},
        names={"torch"},
        attributes={"bfloat16", "round_to", "round_to_dtype"},
    ),
    "6.3": _rule("the exercise asks you to write the rule", attributes={"offset_rule"}),
    "7.3": _rule("the exercise asks you to write the walk", attributes={"departure"}),
    "8.2": _rule(
        "the exercise asks for the distance without SciPy",
        modules={"scipy", "ot", "sklearn", "statsmodels", "torch"},
        names={"wasserstein_distance"},
        attributes={"wasserstein_distance", "cdist"},
    ),
}


class Forbidden(Exception):
    """An answer does something the exercise forbids; the message names it."""


def _root(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    if isinstance(node, ast.Call):
        return _root(node.func)
    return node.id if isinstance(node, ast.Name) else None


def _is_jit(fn: ast.AST) -> bool:
    for dec in getattr(fn, "decorator_list", []):
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in ("jit", "autotune", "heuristics"):
            return True
    return False


def refuse_attribute(node: ast.Attribute, in_jit: bool, modules: set, rule, refuse) -> None:
    """The rules on one attribute ``obj.attr`` of an answer, for :func:`scan` and the grader's
    scan (:mod:`kernels.lab_kit.answer_scan`); ``refuse`` raises."""
    if node.attr.startswith("__"):
        refuse(node, f".{node.attr}", "answers may not reach around the language")
    if node.attr in GENERIC_MODULES or node.attr in GENERIC_ATTRIBUTES:
        refuse(node, ast.unparse(node), "answers may not reach around the language")
    root = _root(node.value)
    if root == "ex" and isinstance(node.value, ast.Name) and not node.attr.isupper():
        why = "answers may use only the checks' constants (upper-case names), never functions"
        refuse(node, f"ex.{node.attr}", why)
    if isinstance(node.ctx, (ast.Store, ast.Del)) and root in modules:
        refuse(node, ast.unparse(node), "do not patch the modules the exercise uses")
    if node.attr in rule.attributes and not in_jit:
        refuse(node, ast.unparse(node), rule.why)


def scan(source: str, exercise: str, module_names=("ex",), package_names=()) -> None:
    """Raise :class:`Forbidden` naming the first forbidden thing in ``source`` (the answer of
    ``exercise``, such as ``"2.2"``); ``module_names``: the names the chapter binds to modules
    (``ex``, ``torch``, ``np``, ...); ``package_names``: the names the chapter's earlier cells
    bind to the book's package (``report``, ``tiling``, ``round_to_dtype``), which answers may not
    use."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Forbidden(f"the answer is not valid Python (line {exc.lineno}: {exc.msg})") from None
    rule = FORBIDDEN.get(exercise, _rule(""))
    modules = set(module_names)

    def refuse(node, what, reason):
        where = f"line {node.lineno}: " if hasattr(node, "lineno") else ""
        raise Forbidden(f"{where}`{what}` is not allowed in Exercise {exercise}: {reason}")

    def visit(node, in_jit=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_jit = in_jit or _is_jit(node)
        for child in ast.iter_child_nodes(node):  # the innermost offence is named first
            visit(child, in_jit)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                top = name.split(".")[0]
                if top in GENERIC_MODULES:
                    refuse(
                        node,
                        f"import {name}",
                        "answers use only what the exercise setup "
                        "imports and the standard numeric libraries",
                    )
                if top in rule.modules:
                    refuse(node, f"import {name}", rule.why)
            for alias in node.names:
                bound = (alias.asname or alias.name).split(".")[0]
                if bound in modules:
                    refuse(
                        node, f"import ... as {bound}", "do not rebind the exercise setup's names"
                    )
        elif isinstance(node, ast.Name):
            if node.id in GENERIC_NAMES:
                refuse(node, node.id, "answers may not reach around the language")
            if node.id in rule.names and not in_jit:
                refuse(node, node.id, rule.why)
            if node.id in rule.modules and not in_jit:
                refuse(node, node.id, rule.why)
            if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in modules:
                refuse(node, f"{node.id} = ...", "do not rebind the exercise setup's names")
            if isinstance(node.ctx, ast.Load) and node.id in package_names:
                refuse(
                    node,
                    node.id,
                    "answers use only what the exercise setup imports, not the book's package",
                )
        elif isinstance(node, ast.Attribute):
            refuse_attribute(node, in_jit, modules, rule, refuse)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                if name in modules:
                    refuse(node, f"global {name}", "do not rebind the exercise setup's names")

    visit(tree)


def forbid(fn, exercise: str) -> None:
    """Fail (:class:`~kernels.checking.WrongAnswer`), naming the call, if the source of the
    reader's ``fn`` does what Exercise ``exercise`` forbids. Only where Python can find the
    source (a function written in a notebook cell or a file); a lambda is scanned alone, not
    the line around it. The grader scans every answer's cells itself."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):  # no source, or a fragment
        return
    if getattr(fn, "__name__", "") == "<lambda>":
        sources = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Lambda)]
    else:
        sources = [source]
    for text in sources:
        try:
            scan(text, exercise, ("ex", "torch", "np", "triton", "tl", "math"))
        except Forbidden as exc:
            fail(str(exc))


_short_errors_in_ipython()
