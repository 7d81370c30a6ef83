"""Interactive figures that work on the static website, with no kernel and no CDN.

Sliders in Jupyter and Colab are ipywidgets (they call Python on every move). The website has no
Python behind it, so there the same controls move over a grid of values computed in Python.
:func:`site_explorer` writes an explorer (labelled ``<select>`` and ``<input type=range>``
controls, an SVG plot, a one-line reading) with its data and ``explorer.js`` inline: nothing is
fetched, and it works in Jupyter too. :func:`site_figure` writes a Plotly figure as a ``<div>``
plus a script that draws it with ``window.Plotly``; the book's Sphinx extension
(book/_ext/plotly_local.py) serves ``plotly.min.js`` from the site itself. Where Plotly is not
loaded (Colab, Jupyter) that script writes a one-line note instead of failing.
"""

from __future__ import annotations

import html
import json
import uuid
from pathlib import Path

NOTE = (
    "This figure is interactive on the book's website; in Jupyter or Colab use the live "
    "sliders above it."
)


def site_figure(fig, note: str = NOTE):
    """Display the Plotly figure ``fig`` as HTML for the website; returns the IPython object."""
    from IPython.display import HTML, display

    div_id = "book-plotly-" + uuid.uuid4().hex[:10]
    spec = fig.to_json()
    page = (
        f'<div class="book-plotly" id="{div_id}" style="width:100%"></div>\n'
        f"<script>(function() {{\n"
        f"  var el = document.getElementById('{div_id}');\n"
        f"  if (window.Plotly) {{ var f = {spec};\n"
        f"    Plotly.newPlot(el, f.data, f.layout, {{responsive: true, displaylogo: false}});\n"
        f"  }} else {{ el.innerHTML = '<p><em>{html.escape(note)}</em></p>'; }}\n"
        f"}})();</script>"
    )
    obj = HTML(page)
    display(obj)
    return obj


SCRIPT = Path(__file__).with_name("explorer.js")
CSS = (
    ".book-explorer{border:1px solid #ccc;border-radius:6px;padding:10px 12px;margin:1em 0}"
    ".book-explorer-control{display:flex;align-items:center;gap:10px;margin:4px 0;font-size:15px}"
    ".book-explorer-control label{flex:0 0 210px}"
    ".book-explorer-control input,.book-explorer-control select{flex:0 0 260px}"
    ".book-explorer-control output{font-weight:bold}"
    ".book-explorer-plot{width:100%;max-width:720px;height:auto;display:block}"
    ".book-explorer-reading{font-size:16px;font-weight:bold;margin:6px 0}"
    ".book-explorer-note{font-size:14px;margin:0}"
)


def explorer_html(spec: dict) -> str:
    """An explorer's HTML: labelled controls (keyboard: <select>, <input type=range>), an SVG
    plot, the reading, the data as JSON and the script that draws (kernels/tools/explorer.js)."""
    root = f"book-explorer-{spec['name']}-{uuid.uuid4().hex[:8]}"
    rows = []
    for c in spec["controls"]:
        cid = f"{root}-{c['name']}"
        label = f'<label for="{cid}">{html.escape(c["label"])}</label>'
        if c["kind"] == "select":
            options = "".join(
                f'<option value="{i}"{" selected" if i == c["default"] else ""}>'
                f"{html.escape(v)}</option>"
                for i, v in enumerate(c["values"])
            )
            field = f'<select id="{cid}" data-control="{c["name"]}">{options}</select>'
        else:
            value = html.escape(c["values"][c["default"]])
            field = (
                f'<input type="range" id="{cid}" data-control="{c["name"]}" min="0" '
                f'max="{len(c["values"]) - 1}" step="1" value="{c["default"]}" '
                f'aria-valuetext="{value}">'
                f'<output data-for="{c["name"]}" for="{cid}">{value}</output>'
            )
        rows.append(f'<div class="book-explorer-control">{label}{field}</div>')
    data = json.dumps(spec, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return (
        f"<style>{CSS}</style>"
        f'<div class="book-explorer" id="{root}" data-name="{spec["name"]}">'
        f'<div class="book-explorer-controls">{"".join(rows)}</div>'
        f'<svg class="book-explorer-plot" role="img" xmlns="http://www.w3.org/2000/svg" '
        f'aria-label="{html.escape(spec["title"])}"></svg>'
        f'<p class="book-explorer-reading" aria-live="polite"></p>'
        f'<p class="book-explorer-note">{html.escape(spec["conclusion"])}</p>'
        f'<script type="application/json" class="book-explorer-data">{data}</script>'
        f"</div>\n<script>{SCRIPT.read_text()}(document.getElementById('{root}'));</script>"
    )


def site_explorer(spec: dict):
    """Display an explorer (see :func:`explorer_html`); it works on the website and in Jupyter
    alike, with no Python behind it. Returns the IPython object."""
    from IPython.display import HTML, display

    obj = HTML(explorer_html(spec))
    display(obj)
    return obj
