"""book/_ext keeps the pages light: no ipywidgets state embedded (widget_state.py), and
plotly.min.js shipped only where a page draws a Plotly figure (plotly_local.py)."""

import importlib.util
from pathlib import Path

EXT = Path(__file__).resolve().parents[2] / "book" / "_ext"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_widget_state_script_is_dropped_and_nothing_else():
    widget_state = load("widget_state")
    other = ("mathjax.js", {})
    metadata = {
        "06_fixes": {"js_files": {widget_state.KEY: (None, {"body": "{}"}), "x": other}},
        "01_bf16_bits": {"js_files": {"x": other}},
    }
    assert widget_state.drop_widget_state(metadata, "06_fixes")
    assert not widget_state.drop_widget_state(metadata, "01_bf16_bits")
    assert not widget_state.drop_widget_state(metadata, "intro")  # not a notebook
    assert metadata["06_fixes"]["js_files"] == {"x": other}
    assert metadata["01_bf16_bits"]["js_files"] == {"x": other}


def test_plotly_ships_only_with_a_page_that_draws_a_figure(tmp_path):
    plotly_local = load("plotly_local")
    (tmp_path / "a.html").write_text("<p>class=&quot;book-plotly&quot; in prose</p>")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.html").write_text("<div></div>")
    assert plotly_local.pages_with_figures(tmp_path) == []
    (tmp_path / "sub" / "b.html").write_text('<div class="book-plotly" id="x"></div>')
    assert plotly_local.pages_with_figures(tmp_path) == [tmp_path / "sub" / "b.html"]
