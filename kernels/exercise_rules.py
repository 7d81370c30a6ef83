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

The autograder (:mod:`kernels.course_lab.grading`) runs the same checks, in its own process, against
the answer running in a fresh process of its own: an answer cannot patch them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
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
# Found by reading an answer's source (Python's ``ast``), before it runs; one rule, :func:`scan`,
# for the checks in the notebook (:func:`forbid`) and the grader, which scores the exercise 0
# with a message naming the call when it finds: what reaches into the grader or the package
# (``import kernels``, ``sys``, ``getattr``, ``__globals__``, private attributes, any attribute
# of ``ex`` but its upper-case constants); patching (``ex.check_merge = ...``, ``ex = ...``); or,
# in an exercise that asks you to implement something, the library calls that would do the work
# (:data:`FORBIDDEN`). The scan is a second line of defence: the grader also runs each answer
# in a process of its own (:mod:`kernels.course_lab.isolate`), so patching changes no score.

# modules an answer never needs, and names that reach around the language (one rule for the
# notebook's checks and the grader)
GENERIC_MODULES = set(
    "kernels importlib sys os posix subprocess builtins inspect gc ctypes pickle marshal runpy "
    "multiprocessing threading _thread concurrent asyncio signal socket shutil pathlib types "
    "unittest pytest nbgrader nbformat nbclient IPython pkgutil pydoc timeit code codeop "
    "traceback logging pdb bdb cProfile profile trace doctest linecache io codecs fileinput "
    "glob tempfile mmap tokenize zipimport dis site sysconfig atexit faulthandler weakref "
    "copyreg platform".split()
)
# attributes through which a library reaches others (torch.sys.modules[...]), frames or files
GENERIC_ATTRIBUTES = set(
    "modules import_module reload f_globals f_locals f_back f_code gi_frame cr_frame ag_frame "
    "tb_frame func_globals system popen spawn attrgetter methodcaller currentframe walk_stack "
    "extract_stack settrace setprofile open read_text read_bytes write_text write_bytes "
    "loadtxt genfromtxt fromfile from_file memmap fn".split()
)
GENERIC_NAMES = set(
    "__import__ exec eval compile globals locals vars getattr setattr delattr open breakpoint "
    "__builtins__ get_ipython input attrgetter methodcaller".split()
)
# the names a notebook's exercise setup binds, and their modules (``ex``: the chapter's checks)
SETUP_MODULES = {
    "ex": "",
    "torch": "torch",
    "np": "numpy",
    "triton": "triton",
    "tl": "triton.language",
    "math": "math",
}
# built-ins that do an exercise's work only when they reduce a sequence: max(a, b) is allowed
SCALAR_BUILTINS = {"max", "min"}

_REDUCTIONS = set(
    "amax amin max min aminmax maximum fmax sort argsort msort topk argmax argmin cummax "
    "kthvalue nanmax median nanmedian mode quantile nanquantile percentile nanpercentile ptp "
    "unique scatter_reduce index_reduce segment_reduce numpy tolist item max_pool1d max_pool2d "
    "max_pool1d_with_indices adaptive_max_pool1d MaxPool1d MaxPool2d AdaptiveMaxPool1d".split()
)


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


FORBIDDEN = {  # keyed by the exercise's ``:label:``, never by its number
    "ex-bf16-round-bits": _rule(
        "the exercise asks for integer operations only",
        modules={"ml_dtypes", "numpy", "torch", "struct", "array", "math", "jax", "tensorflow"},
        names={"np", "torch", "float", "ml_dtypes"},
    ),
    "ch2-rowmax": _rule(
        "the maxima must come from your Triton kernel",
        modules={"numpy", "scipy", "functools"},
        names={"max", "sorted", "np", "reduce"},
        attributes=_REDUCTIONS,
    ),
    "ch3-merge": _rule("the exercise asks you to derive the merge", modules={"scipy"}),
    "ch3-bytes": _rule(
        "the exercise asks for a prediction, not a measurement",
        modules={"tracemalloc", "resource", "psutil"},
        attributes={
            "peak_live_bytes",
            "standard_attention",
            "memory_allocated",
            "max_memory_allocated",
        },
    ),
    "ch4-dk": _rule(
        "the exercise asks you to derive the gap",
        attributes={"backward", "grad", "autograd", "vjp", "jacobian", "functional"},
    ),
    "ex-sources-midpoint": _rule(
        "the exercise asks you to predict the error, not to round",
        modules={"ml_dtypes", "torch", "jax"},
        names={"torch"},
        attributes={"bfloat16", "round_to", "round_to_dtype"},
    ),
    "ex-fixes-offset": _rule("the exercise asks you to write the rule", attributes={"offset_rule"}),
    "ex-gpt2-logit": _rule("the exercise asks you to write the walk", attributes={"departure"}),
    "ex-golden-w1": _rule(
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


def bindings(node) -> list[tuple[str, str]]:
    """(bound name, the module or object it is bound to) for each alias of an import."""
    out = []
    for alias in node.names:
        if isinstance(node, ast.Import):
            module = alias.name if alias.asname else alias.name.split(".")[0]
            out.append(((alias.asname or alias.name).split(".")[0], module))
        else:
            out.append((alias.asname or alias.name, f"{node.module or ''}.{alias.name}"))
    return out


def refuse_attribute(node: ast.Attribute, in_jit: bool, modules: set, rule, refuse) -> None:
    """The rules on one attribute ``obj.attr`` of an answer (part of :func:`scan`); ``refuse``
    raises."""
    if node.attr.startswith("__"):
        refuse(node, f".{node.attr}", "answers may not reach around the language")
    if node.attr in GENERIC_MODULES or node.attr in GENERIC_ATTRIBUTES:
        refuse(node, ast.unparse(node), "answers may not reach around the language")
    root = _root(node.value)
    if root == "ex" and isinstance(node.value, ast.Name) and not node.attr.isupper():
        why = "answers may use only the checks' constants (upper-case names), never functions"
        refuse(node, f"ex.{node.attr}", why)
    if node.attr.startswith("_"):
        refuse(node, ast.unparse(node), "answers may not use private attributes")
    if isinstance(node.ctx, (ast.Store, ast.Del)) and root in modules:
        refuse(node, ast.unparse(node), "do not patch the modules the exercise uses")
    if node.attr in rule.attributes and not in_jit:
        refuse(node, ast.unparse(node), rule.why)


def _named(text: str, rule, in_jit: bool) -> bool:
    """Whether a string such as ``"ml_dtypes.bfloat16"`` or ``"amax"`` names what is forbidden."""
    if not re.fullmatch(r"[A-Za-z_][\w.:]*", text):
        return False
    banned = GENERIC_MODULES | GENERIC_NAMES
    if not in_jit:
        banned = banned | rule.modules | rule.names | rule.attributes
    return any(p.startswith("_") or p in banned for p in re.split(r"[.:]", text) if p)


def scan(source: str, exercise: str, module_names=SETUP_MODULES, package_names=()) -> None:
    """Raise :class:`Forbidden` naming the first forbidden thing in ``source`` (the answer of
    the exercise labelled ``exercise``, such as ``"ch2-rowmax"``), as written. ``module_names``:
    the names the chapter binds to modules, as a dict (``{"np": "numpy"}``) or names (their
    modules from :data:`SETUP_MODULES`); ``package_names``: the names the chapter's earlier cells
    bind to the book's package (``report``, ``tiling``), which answers may not use.

    One rule for the notebook's checks (:func:`forbid`) and the grader: an import of a module
    under the name the chapter already gives it (``import numpy as np``) is no rebinding; a
    module the exercise forbids may be imported but not used; ``max(a, b)`` of two or more plain
    arguments compares scalars and is allowed (``max(row)``, ``max(*xs)``, ``reduce(max, ...)``
    are not); a string that names a forbidden module or attribute counts as using it."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Forbidden(f"the answer is not valid Python (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(module_names, dict):
        module_names = {n: SETUP_MODULES.get(n, "") for n in module_names}
    rule = FORBIDDEN.get(exercise, _rule(""))
    modules = set(module_names)
    bound = dict(module_names)  # name: module, the answer's own imports added
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((b, m) for b, m in bindings(node) if b not in modules)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and type(n.ctx) is ast.Load}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def refuse(node, what, reason):
        where = f"line {node.lineno}: " if hasattr(node, "lineno") else ""
        raise Forbidden(f"{where}`{what}` is not allowed in exercise {exercise}: {reason}")

    def forbidden_module(name: str) -> bool:
        return name.split(".")[0] in rule.modules

    def visit_import(node):
        is_import = isinstance(node, ast.Import)
        names = [a.name for a in node.names] if is_import else [node.module or ""]
        for name in names:
            if name.split(".")[0] in GENERIC_MODULES or getattr(node, "level", 0):
                why = "answers use only what the exercise setup imports and the standard libraries"
                refuse(node, f"import {name}", why)
        for alias in [] if is_import else node.names:
            if alias.name.startswith("_") or alias.name in GENERIC_NAMES | GENERIC_ATTRIBUTES:
                refuse(node, f"import {alias.name}", "answers may not reach around the language")
            if alias.name == "*" and forbidden_module(names[0]):
                refuse(node, f"import {names[0]}", rule.why)
        for name, module in bindings(node):
            if name in modules and module_names[name] != module:
                refuse(node, f"import ... as {name}", "do not rebind the exercise setup's names")
            if forbidden_module(module) and name in loaded:
                refuse(node, f"import {names[0]}", rule.why)

    def visit_name(node, in_jit):
        if node.id in GENERIC_NAMES:
            refuse(node, node.id, "answers may not reach around the language")
        if node.id in rule.names and not in_jit:
            call = parents.get(node)
            scalar = (
                node.id in SCALAR_BUILTINS
                and isinstance(call, ast.Call)
                and call.func is node
                and len(call.args) >= 2
                and not call.keywords
                and not any(isinstance(a, ast.Starred) for a in call.args)
            )
            if not scalar:
                refuse(node, node.id, rule.why)
        used, module = type(node.ctx) is ast.Load, bound.get(node.id, "")
        if used and node.id != "ex" and module.split(".")[0] in GENERIC_MODULES:
            refuse(node, node.id, "answers may not reach around the language")
        if used and not in_jit and (node.id in rule.modules or forbidden_module(module)):
            refuse(node, node.id, rule.why)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in modules:
            refuse(node, f"{node.id} = ...", "do not rebind the exercise setup's names")
        if used and node.id in package_names:
            refuse(node, node.id, "answers use the exercise setup's names, not the book's package")

    def visit(node, in_jit=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_jit = in_jit or _is_jit(node)
        for child in ast.iter_child_nodes(node):  # the innermost offence is named first
            visit(child, in_jit)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            visit_import(node)
        elif isinstance(node, ast.Name):
            visit_name(node, in_jit)
        elif isinstance(node, ast.Attribute):
            refuse_attribute(node, in_jit, modules, rule, refuse)
        elif isinstance(node, ast.MatchClass):  # case object(__globals__=g)
            for attr in node.kwd_attrs:
                fake = ast.Attribute(ast.Name("_", ast.Load()), attr, ast.Load())
                refuse_attribute(ast.copy_location(fake, node), in_jit, set(), rule, refuse)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _named(node.value, rule, in_jit):
                refuse(node, repr(node.value), "a string may not name what the answer may not use")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in set(node.names) & modules:
                refuse(node, f"global {name}", "do not rebind the exercise setup's names")

    visit(tree)


def forbid(fn, exercise: str) -> None:
    """Fail (:class:`~kernels.exercise_rules.WrongAnswer`), naming the call, if the source of the
    reader's ``fn`` does what the exercise labelled ``exercise`` forbids. Only where Python can
    find the source (a function written in a notebook cell or a file); a lambda is scanned alone,
    not the line around it. The grader scans every answer's cells itself."""
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
            scan(text, exercise)
        except Forbidden as exc:
            fail(str(exc))


_short_errors_in_ipython()
