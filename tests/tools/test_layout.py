"""The shape of ``kernels/``: no import cycle between files, at most five layers of subpackages,
no chain of imports inside one package longer than nine files, no module over 450 lines.

A *file* imports another when any ``import`` in it (at the top or inside a function) names the
other's module; ``from .. import results`` names ``kernels/results.py``, ``import kernels`` names
``kernels/__init__.py``. A *room* is a subpackage (``kernels/attention/``) or a module at the top
(``kernels/env.py``; the package's own ``__init__.py`` is a room too). A room's layer is 1 + the
highest layer of the rooms it imports (1 for a room that imports none), as the package
docstring draws them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kernels"
MAX_LAYERS = 5
MAX_DEPTH = 9  # files in the longest chain of imports inside one package (folder)
MAX_LINES = 450


def _module_file(dotted: str) -> Path | None:
    path = ROOT.joinpath(*dotted.split("."))
    if path.is_dir() and (path / "__init__.py").exists():
        return path / "__init__.py"
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None


def _dotted(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[Path]:
    """The files of ``kernels/`` that ``path`` imports."""
    here = _dotted(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from x import y": y may be a submodule of x, else a name in x
            names = [
                f"{module}.{alias.name}" if _module_file(f"{module}.{alias.name}") else module
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if (
                name.split(".")[0] == "kernels"
                and (target := _module_file(name))
                and target != path
            ):
                found.add(target)
    return found


@cache
def file_graph() -> dict[Path, set[Path]]:
    return {path: _imports(path) for path in sorted(PACKAGE.rglob("*.py"))}


def room(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return f"kernels/{parts[0]}/" if len(parts) > 1 else f"kernels/{parts[0]}"


def room_graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for path, targets in file_graph().items():
        rooms.setdefault(room(path), set()).update(room(t) for t in targets)
    for name, targets in rooms.items():
        targets.discard(name)
    return rooms


def find_cycle(graph: dict) -> list | None:
    """One cycle of ``graph`` as a list of its nodes, or None."""
    state: dict = {}
    stack: list = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ()), key=str):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph, key=str):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layers(graph: dict[str, set[str]]) -> dict[str, int]:
    @cache
    def layer(node: str) -> int:
        return 1 + max((layer(t) for t in graph.get(node, ())), default=0)

    return {node: layer(node) for node in graph}


def _short(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_import_cycle_between_files():
    cycle = find_cycle(file_graph())
    assert cycle is None, "import cycle: " + " -> ".join(_short(p) for p in cycle)


def test_at_most_five_layers():
    graph = room_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "subpackages import each other: " + " -> ".join(cycle)
    found = layers(graph)
    drawn = "\n".join(
        f"  {n}: {', '.join(sorted(r for r, k in found.items() if k == n))}"
        for n in sorted(set(found.values()), reverse=True)
    )
    assert max(found.values()) <= MAX_LAYERS, f"{max(found.values())} layers:\n{drawn}"


def longest_chain(graph: dict) -> list:
    """The longest path of an acyclic ``graph`` (a file, a file it imports, ...)."""
    longest: dict = {}

    def chain(node):
        if node not in longest:
            below = max((chain(t) for t in graph.get(node, ())), key=len, default=[])
            longest[node] = [node] + below
        return longest[node]

    return max((chain(node) for node in graph), key=len, default=[])


def package_chains() -> dict[str, list[Path]]:
    """Per package (a folder of ``kernels/``), its longest chain of imports among its own files."""
    inside: dict[Path, dict] = {}
    for path, targets in file_graph().items():
        folder = inside.setdefault(path.parent, {})
        folder[path] = {t for t in targets if t.parent == path.parent}
    return {_short(folder): longest_chain(graph) for folder, graph in inside.items()}


def test_no_package_imports_deeper_than_nine_files():
    """A reader following one call inside a package should not cross more than nine files."""
    deep = {
        folder: " -> ".join(p.name for p in chain)
        for folder, chain in package_chains().items()
        if len(chain) > MAX_DEPTH
    }
    assert not deep, f"chains of imports over {MAX_DEPTH} files inside one package: {deep}"


def test_no_module_over_450_lines():
    long = {
        _short(path): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_the_graph_is_read():
    """The reader sees the imports it should (a broken reader would pass the tests above)."""
    graph = file_graph()
    assert PACKAGE / "env.py" in graph[PACKAGE / "__init__.py"]
    assert PACKAGE / "results.py" in graph[PACKAGE / "gpu" / "perf.py"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert layers({"a": {"b"}, "b": set()}) == {"a": 2, "b": 1}
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": set()}) == ["a", "b", "c"]
    chains = package_chains()
    assert len(chains["kernels/attention"]) >= 4  # autograd, flash_fwd, tile_ops, options


def test_the_package_docstring_draws_the_layers_as_they_are():
    """Each numbered layer of kernels/__init__.py's docstring names the rooms on that layer."""
    import re

    import kernels

    found = layers(room_graph())
    drawn: dict[str, int] = {}
    layer = None
    for line in kernels.__doc__.splitlines():
        start = re.match(r"(\d+)\. ", line)
        if start:
            layer = int(start.group(1))
        elif not line.startswith("   "):
            layer = None if not line.strip() or not line.startswith(" ") else layer
        if layer is None:
            continue
        for name in re.findall(r":mod:`kernels\.(\w+)", line):
            path = PACKAGE / name
            drawn[f"kernels/{name}/" if path.is_dir() else f"kernels/{name}.py"] = layer
    assert drawn, "no numbered layers found in the package docstring"
    wrong = {
        room: (layer, found.get(room)) for room, layer in drawn.items() if found.get(room) != layer
    }
    assert not wrong, f"drawn on another layer than they are (drawn, actual): {wrong}"
    missing = set(found) - set(drawn) - {"kernels/__init__.py"}
    assert not missing, f"rooms the docstring does not draw: {sorted(missing)}"
