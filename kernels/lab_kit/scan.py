"""What an answer may not do, found by reading its source (Python's ``ast``), before it runs.

The grader scans the source of every answer (the answer cell and any code cells the student
added before it) and scores the exercise 0, with a message naming the call, when it finds:

* anything that reaches into the grader or the package's internals: ``import kernels...``,
  ``importlib``, ``sys``, ``os``, ``subprocess``, ``__import__``, ``exec``, ``eval``,
  ``getattr``/``setattr``, ``globals()``, attributes with double underscores, and any attribute
  of the checks' module ``ex`` except its upper-case constants (``ex.TILES``);
* patching: assigning to an attribute of a module the exercise setup imports
  (``ex.check_merge = ...``, ``torch.amax = ...``) or rebinding such a name (``ex = ...``);
* in an exercise that asks you to implement something, the library calls that would do the work
  (:data:`FORBIDDEN`): NumPy or ml_dtypes in the integer rounding of 1.2, PyTorch's reductions
  outside the Triton kernel in 2.2, SciPy in 8.2, ...

A scan is a second line of defence: every graded check also runs the answer in a fresh process
of its own (:mod:`.isolate`), so patching could not change a score anyway; the scan turns it
into a clear 0 with a reason.
"""
from __future__ import annotations

import ast
import dataclasses

# modules an answer never needs, and names that reach around the language
GENERIC_MODULES = {"kernels", "importlib", "sys", "os", "subprocess", "builtins", "inspect", "gc",
                   "ctypes", "pickle", "marshal", "runpy", "multiprocessing", "threading",
                   "signal", "socket", "shutil", "pathlib", "types", "unittest", "pytest",
                   "nbgrader", "nbformat", "nbclient", "IPython"}
GENERIC_NAMES = {"__import__", "exec", "eval", "compile", "globals", "locals", "vars", "getattr",
                 "setattr", "delattr", "open", "breakpoint", "__builtins__", "get_ipython",
                 "input"}

_REDUCTIONS = {"amax", "amin", "max", "min", "aminmax", "sort", "topk", "argmax", "argmin",
               "cummax", "kthvalue", "msort", "nanmax", "median", "mode", "quantile",
               "numpy", "tolist", "item", "max_pool1d", "max_pool2d", "adaptive_max_pool1d"}


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
    "1.2": _rule("the exercise asks for integer operations only",
                 modules={"ml_dtypes", "numpy", "torch", "struct", "array", "math", "jax",
                          "tensorflow"},
                 names={"np", "torch", "float", "ml_dtypes"}),
    "2.2": _rule("the maxima must come from your Triton kernel",
                 modules={"numpy", "scipy", "functools"},
                 names={"max", "sorted", "np", "reduce"},
                 attributes=_REDUCTIONS),
    "3.1": _rule("the exercise asks you to derive the merge", modules={"scipy"}),
    "3.2": _rule("the exercise asks for a prediction, not a measurement",
                 modules={"tracemalloc", "resource", "psutil"},
                 attributes={"peak_live_bytes", "standard_attention", "memory_allocated",
                             "max_memory_allocated"}),
    "4.1": _rule("the exercise asks you to derive the gap",
                 attributes={"backward", "grad", "autograd", "vjp", "jacobian", "functional"}),
    "5.2": _rule("the exercise asks you to predict the error, not to round",
                 modules={"ml_dtypes", "torch", "jax"},
                 names={"torch"},
                 attributes={"bfloat16", "round_to"}),
    "6.3": _rule("the exercise asks you to write the rule", attributes={"offset_rule"}),
    "7.3": _rule("the exercise asks you to write the walk", attributes={"departure"}),
    "8.2": _rule("the exercise asks for the distance without SciPy",
                 modules={"scipy", "ot", "sklearn", "statsmodels", "torch"},
                 names={"wasserstein_distance"},
                 attributes={"wasserstein_distance", "cdist"}),
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


def scan(source: str, exercise: str, module_names=("ex",)) -> None:
    """Raise :class:`Forbidden` naming the first forbidden thing in ``source`` (the answer of
    ``exercise``, such as ``"2.2"``); ``module_names``: the names the exercise setup binds to
    modules (``ex``, ``torch``, ``np``, ...)."""
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
        for child in ast.iter_child_nodes(node):       # the innermost offence is named first
            visit(child, in_jit)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            for name in names:
                top = name.split(".")[0]
                if top in GENERIC_MODULES:
                    refuse(node, f"import {name}", "answers use only what the exercise setup "
                           "imports and the standard numeric libraries")
                if top in rule.modules:
                    refuse(node, f"import {name}", rule.why)
            for alias in node.names:
                bound = (alias.asname or alias.name).split(".")[0]
                if bound in modules:
                    refuse(node, f"import ... as {bound}", "do not rebind the exercise "
                           "setup's names")
        elif isinstance(node, ast.Name):
            if node.id in GENERIC_NAMES:
                refuse(node, node.id, "answers may not reach around the language")
            if node.id in rule.names and not in_jit:
                refuse(node, node.id, rule.why)
            if node.id in rule.modules and not in_jit:
                refuse(node, node.id, rule.why)
            if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in modules:
                refuse(node, f"{node.id} = ...", "do not rebind the exercise setup's names")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("__"):
                refuse(node, f".{node.attr}", "answers may not reach around the language")
            root = _root(node.value)
            if root == "ex" and isinstance(node.value, ast.Name) and not node.attr.isupper():
                refuse(node, f"ex.{node.attr}", "answers may use only the checks' constants "
                       "(upper-case names), never their functions")
            if isinstance(node.ctx, (ast.Store, ast.Del)) and root in modules:
                refuse(node, ast.unparse(node), "do not patch the modules the exercise uses")
            if node.attr in rule.attributes and not in_jit:
                refuse(node, ast.unparse(node), rule.why)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                if name in modules:
                    refuse(node, f"global {name}", "do not rebind the exercise setup's names")

    visit(tree)
