"""Rules every chapter's source obeys, checked without executing anything (the site test checks
the rendered pages): code that fits the column, progress bars that print text, plain words."""

from __future__ import annotations

import ast
import json
import re

import pytest

from kernels.env import REPO_ROOT

CHAPTERS = sorted((REPO_ROOT / "book").glob("*.ipynb"))
MAX_CODE_LINE = 88
INTERNAL = re.compile(r"GUIDE|seed paper|\[local\]|\bTODO\b|FIXME")


def cells(path, kind):
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == kind:
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            yield index, source


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_code_lines_fit_the_column(path):
    long = [
        (i, line)
        for i, src in cells(path, "code")
        for line in src.splitlines()
        if len(line) > MAX_CODE_LINE and not src.startswith("# Setup")
    ]
    assert long == [], f"{path.name}: code lines over {MAX_CODE_LINE} characters: {long[:3]}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_progress_bars_print_text(path):
    """tqdm.auto draws a Jupyter widget: on the static site (and in CI) an empty box."""
    offending = [
        i for i, src in cells(path, "code") if "tqdm.auto" in src or "tqdm.notebook" in src
    ]
    assert offending == [], f"{path.name}: cells {offending} import a widget progress bar"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_internal_words(path):
    hits = [
        (i, m.group(0))
        for kind in ("markdown", "code")
        for i, src in cells(path, kind)
        for m in INTERNAL.finditer(src)
    ]
    assert hits == [], f"{path.name}: internal words {hits}"


def test_the_rule_catches_what_it_should():
    assert INTERNAL.search("see GUIDE §1") and INTERNAL.search("[local] run")
    assert not INTERNAL.search("a random seed of 3")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapters_are_stored_without_outputs(path):
    """Outputs are made where a chapter runs (the site build, nbmake, Colab); stored ones go stale
    and would contradict the text beside them on GitHub and in Colab before the first run."""
    nb = json.loads(path.read_text())
    executed = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count"))
    ]
    assert executed == [], f"{path.name}: code cells stored with outputs: {executed[:5]}"


# ---- tensors follow the chapter's device (issue 45: chapter 9 on a GPU runtime)
# The book's Triton kernels refuse CPU tensors when a GPU is present (no interpreter then:
# "CPU tensors need the Triton interpreter"). A cell that builds a model and runs it through
# them must put the model and its inputs on the chapter's device (ENV.device), which is the
# CPU here and the GPU on a GPU runtime; the CPU test cannot see the difference by running.
BOOK_KERNELS = ("hf_attention", "attn_implementation=")
DEVICE_NAMES = {"DEVICE", "DEV"}


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _on_device(node) -> bool:
    """``<something>.to(DEVICE)`` or ``.to(ENV.device)``."""
    if not (isinstance(node, ast.Call) and _name(node.func) == "to" and node.args):
        return False
    arg = node.args[0]
    return (isinstance(arg, ast.Name) and arg.id in DEVICE_NAMES) or (
        isinstance(arg, ast.Attribute) and arg.attr == "device"
    )


def device_problems(source: str) -> list[str]:
    """In a cell that runs the book's kernels: models built without ``.to(DEVICE)``, and
    names fed to such a model that are not assigned from ``.to(DEVICE)``."""
    if not any(marker in source for marker in BOOK_KERNELS):
        return []
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    problems, models, assigned = [], set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        assigned.setdefault(name.id, []).append(node.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and re.search(r"LMHeadModel$|^GPT$", _name(node.func)):
            outer = parent.get(parent.get(node))
            if not _on_device(outer):
                problems.append(f"line {node.lineno}: {_name(node.func)}(...) not .to(DEVICE)")
            elif isinstance(parent.get(outer), ast.Assign):
                models |= {t.id for t in parent[outer].targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in models:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                while isinstance(arg, ast.Subscript):
                    arg = arg.value
                if isinstance(arg, ast.Name) and not all(
                    _on_device(v) for v in assigned.get(arg.id, [None])
                ):
                    problems.append(f"line {node.lineno}: {arg.id} reaches the model off DEVICE")
    return problems


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_models_and_batches_follow_the_chapter_device(path):
    found = [(i, p) for i, src in cells(path, "code") for p in device_problems(src)]
    assert found == [], f"{path.name}: {found}"


def test_a_model_left_on_the_cpu_is_caught():
    """Chapter 9's attention-interface cell as it was before issue 45: model and batch on the
    CPU while the kernels run where the GPU is."""
    before = (
        "name = hf_attention.register()\n"
        "model = GPT2LMHeadModel(config)\n"
        "x, _ = order.batch(corpus.train, 0, 64)\n"
        "loss = model(x[:4], labels=x[:4]).loss\n"
    )
    assert len(device_problems(before)) == 1  # the model; its batch then is not checked
    half = before.replace("GPT2LMHeadModel(config)", "GPT2LMHeadModel(config).to(DEVICE)")
    assert device_problems(half) == ["line 4: x reaches the model off DEVICE"] * 2
    fixed = half.replace("x, _ = order", "x = order").replace(
        "corpus.train, 0, 64)", "corpus.train, 0, 64)[0].to(DEVICE)"
    )
    assert device_problems(fixed) == []
    assert device_problems(before.replace("hf_attention.register()", "'sdpa'")) == []
