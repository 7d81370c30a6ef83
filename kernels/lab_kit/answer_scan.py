"""The grader's scan of an answer's cells, as the student wrote them (issue 43, item A).

It follows :func:`kernels.checking.scan` (the same reach-around lists and the same per-exercise
rules, :data:`kernels.checking.FORBIDDEN`) with two differences that keep honest habits from
scoring 0:

* **ordinary imports**: ``import torch`` / ``import numpy as np`` / ``import math`` where the
  exercise setup (or the chapter's earlier cells) already binds that name *to that module* is
  not a rebinding: the name means what it meant. Importing a module that an exercise forbids
  is refused only if the answer *uses* the name it binds (an unused ``import numpy as np`` in
  Exercise 1.2 changes nothing); the message names the import.
* **harmless built-ins**: the rules forbid a built-in such as ``max`` to stop it doing the
  exercise's work (a reduction over the row in 2.2); ``max(a, b)`` of two or more plain
  arguments compares scalars (a block size) and is allowed. ``max(values)``, ``max(*xs)`` and
  ``max`` passed as a value (``reduce(max, ...)``) stay refused.

Everything else is refused exactly as :func:`kernels.checking.scan` refuses it.
"""

from __future__ import annotations

import ast

from .. import checking as ck
from ..checking import Forbidden

# built-ins that do an exercise's work only when they reduce a sequence
SCALAR_BUILTINS = {"max", "min"}


def _bindings(node) -> list[tuple[str, str]]:
    """(bound name, the module it is bound to) for each alias of an import statement."""
    out = []
    for alias in node.names:
        if isinstance(node, ast.Import):
            module = alias.name if alias.asname else alias.name.split(".")[0]
            out.append(((alias.asname or alias.name).split(".")[0], module))
        else:
            out.append((alias.asname or alias.name, f"{node.module or ''}.{alias.name}"))
    return out


def _scalar_call(call: ast.Call) -> bool:
    return (
        len(call.args) >= 2
        and not any(isinstance(a, ast.Starred) for a in call.args)
        and not call.keywords
    )


def scan(source: str, exercise: str, setup_modules: dict, package_names=()) -> None:
    """Raise :class:`~kernels.checking.Forbidden` naming the first forbidden thing in
    ``source``; ``setup_modules`` maps each name the chapter binds to a module (``np``) to that
    module's name (``numpy``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise Forbidden(f"the answer is not valid Python (line {exc.lineno}: {exc.msg})") from None
    rule = ck.FORBIDDEN.get(exercise, ck._rule(""))
    modules = set(setup_modules)
    loaded = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def refuse(node, what, reason):
        where = f"line {node.lineno}: " if hasattr(node, "lineno") else ""
        raise Forbidden(f"{where}`{what}` is not allowed in Exercise {exercise}: {reason}")

    def visit_import(node):
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        for name in names:
            top = name.split(".")[0]
            if top in ck.GENERIC_MODULES:
                refuse(
                    node,
                    f"import {name}",
                    "answers use only what the exercise setup "
                    "imports and the standard numeric libraries",
                )
        for bound, module in _bindings(node):
            if bound in modules and setup_modules[bound] != module:
                refuse(node, f"import ... as {bound}", "do not rebind the exercise setup's names")
            if module.split(".")[0] in rule.modules:
                if bound in loaded:
                    refuse(node, f"import {names[0]}", rule.why)

    def visit(node, in_jit=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_jit = in_jit or ck._is_jit(node)
        for child in ast.iter_child_nodes(node):  # the innermost offence is named first
            visit(child, in_jit)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            visit_import(node)
        elif isinstance(node, ast.Name):
            visit_name(node, in_jit)
        elif isinstance(node, ast.Attribute):
            visit_attribute(node, in_jit)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                if name in modules:
                    refuse(node, f"global {name}", "do not rebind the exercise setup's names")

    def visit_name(node, in_jit):
        if node.id in ck.GENERIC_NAMES:
            refuse(node, node.id, "answers may not reach around the language")
        if node.id in rule.names and not in_jit:
            parent = parents.get(node)
            harmless = (
                node.id in SCALAR_BUILTINS
                and isinstance(parent, ast.Call)
                and parent.func is node
                and _scalar_call(parent)
            )
            if not harmless:
                refuse(node, node.id, rule.why)
        if node.id in rule.modules and not in_jit and isinstance(node.ctx, ast.Load):
            refuse(node, node.id, rule.why)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in modules:
            refuse(node, f"{node.id} = ...", "do not rebind the exercise setup's names")
        if isinstance(node.ctx, ast.Load) and node.id in package_names:
            refuse(
                node,
                node.id,
                "answers use only what the exercise setup imports, not the book's package",
            )

    def visit_attribute(node, in_jit):
        ck.refuse_attribute(node, in_jit, modules, rule, refuse)

    visit(tree)
