"""Sphinx extension: serve Plotly's JavaScript from the site itself, on the pages that need it.

A chapter shows an interactive figure with :func:`kernels.tools.interactive.site_figure`, which
writes ``<div class="book-plotly">`` and a small script that draws the figure with
``window.Plotly``. This extension copies ``plotly.min.js`` from the installed ``plotly`` package
into ``_static/`` (no CDN: the site works offline) and adds it only to pages whose body holds
such a figure; where no page holds one (4.6 MB that no page would load) it ships nothing.
Loaded through ``sphinx.local_extensions`` in _config.yml.
"""
import shutil
from pathlib import Path

MARKER = 'class="book-plotly"'
SCRIPT = "plotly.min.js"


def _source() -> Path:
    import plotly
    return Path(plotly.__file__).parent / "package_data" / SCRIPT


def _add_on_pages_with_figures(app, pagename, templatename, context, doctree) -> None:
    if MARKER in context.get("body", ""):
        app.add_js_file(SCRIPT, priority=200)


def pages_with_figures(outdir: Path) -> list[Path]:
    """The built pages under ``outdir`` that draw a Plotly figure."""
    return [p for p in sorted(outdir.rglob("*.html")) if MARKER in p.read_text("utf-8")]


def _copy_script(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        if not pages_with_figures(Path(app.outdir)):
            (static / SCRIPT).unlink(missing_ok=True)  # left by an earlier build
            return
        static.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_source(), static / SCRIPT)


def setup(app):
    app.connect("html-page-context", _add_on_pages_with_figures)
    app.connect("build-finished", _copy_script)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
