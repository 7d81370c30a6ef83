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

import base64
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
    ".book-explorer{border:1px solid #ccc;border-radius:6px;padding:10px 12px;margin:1em 0;"
    "max-width:100%;box-sizing:border-box}"
    # a control's label, field and value side by side, wrapped onto lines of their own when the
    # column is narrow (a phone): nothing wider than the explorer
    ".book-explorer-control{display:flex;flex-wrap:wrap;align-items:center;gap:2px 10px;"
    "margin:6px 0;font-size:15px}"
    ".book-explorer-control label{flex:0 1 210px}"
    ".book-explorer-control input,.book-explorer-control select{flex:0 1 260px;min-width:0;"
    "max-width:100%}"
    ".book-explorer-control output{font-weight:bold;max-width:100%;overflow-wrap:anywhere}"
    ".book-explorer-plot{width:100%;max-width:720px;height:auto;display:block}"
    ".book-explorer-static{width:100%;max-width:720px;height:auto}"
    ".book-explorer-reading{font-size:16px;font-weight:bold;margin:6px 0}"
    ".book-explorer-note{font-size:14px;margin:0}"
    ".book-explorer-skip{position:absolute;left:-10000px;top:0}"
    ".book-explorer-skip:focus{left:8px;top:8px;z-index:10000;background:#fff;padding:6px 10px;"
    "border:2px solid #1f77b4;font-size:16px}"
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
        f"{noscript_html(spec)}"
        f'<p class="book-explorer-note">{html.escape(spec["conclusion"])}</p>'
        f'<script type="application/json" class="book-explorer-data">{data}</script>'
        f"</div>\n<script>{SCRIPT.read_text()}(document.getElementById('{root}'));</script>"
    )


def default_setting(spec: dict) -> tuple[list[int], int]:
    """The controls' default picks and the index of that setting in the grid."""
    picks = [c["default"] for c in spec["controls"]]
    index = 0
    for control, pick in zip(spec["controls"], picks):
        index = index * len(control["values"]) + pick
    return picks, index


def value_label(v: float, panel: dict) -> str:
    """A bar's value as explorer.js writes it (``fmt``)."""
    if panel["unit"] == "%":
        return (f"{v:.1f}" if 0 < v < 1 else f"{v:.0f}") + " %"
    if abs(v) < 5e-4:
        return "0"
    if abs(v) >= 1e4:
        return f"{v:.1e}"
    text = f"{v:.0f}" if abs(v) >= 100 else f"{float(f'{v:.2g}'):g}"
    return ("+" if panel.get("signed") and v > 0 else "") + text.replace("-", "−")


def static_png(spec: dict) -> bytes:
    """The explorer at its default setting drawn by matplotlib, as the script draws it: one
    panel per quantity, one bar (with its 95 % interval) per series, the value over each bar."""
    import matplotlib.pyplot as plt

    from . import style

    picks, _ = default_setting(spec)
    n_panels = len(spec["panels"])
    fig, axes = plt.subplots(1, n_panels, figsize=(style.WIDTH_IN, 3.4), squeeze=False)
    for p, (ax, panel) in enumerate(zip(axes[0], spec["panels"])):
        lo = hi = 0.0
        for s, series in enumerate(spec["series"]):
            index = 0
            for control, pick in zip(spec["controls"][: series["depends"]], picks):
                index = index * len(control["values"]) + pick
            k = (index * n_panels + p) * 2
            value, half = series["data"][k], series["data"][k + 1] or 0.0
            if value is None:
                ax.text(s, 0, "no finite\noutput", ha="center", va="bottom")
                continue
            lo, hi = min(lo, value - half), max(hi, value + half)
            ax.bar(s, value, color=series["color"], yerr=half or None, capsize=4)
            end = value + half if value >= 0 else value - half
            shift = (0, 3 if value >= 0 else -13)
            label = value_label(value, panel)
            ax.annotate(label, (s, end), xytext=shift, textcoords="offset points", ha="center")
        if hi == lo:
            hi = 100.0 if panel["unit"] == "%" else 1.0
        pad = 0.18 * (hi - lo)
        ax.set_ylim(lo - pad if lo < 0 else 0.0, hi + pad)
        ax.axhline(0, color="#555", lw=0.8)
        ax.set_xticks(range(len(spec["series"])), [s["short"] for s in spec["series"]])
        ax.set_title(panel["title"])
        ax.set_ylabel(f"{panel['axis']} [{panel['unit']}]")
    fig.tight_layout()
    png = style.png_with_record(fig)
    plt.close(fig)
    return png


def noscript_html(spec: dict) -> str:
    """What a reader without JavaScript sees instead of the live plot: the default setting as
    an image, its reading, and the controls' default values."""
    picks, index = default_setting(spec)
    data = base64.b64encode(static_png(spec)).decode("ascii")
    setting = "; ".join(
        f"{c['label']} {c['values'][pick]}" for c, pick in zip(spec["controls"], picks)
    )
    reading = spec["readings"][spec["reading"][index]]
    alt = f"{spec['title']}, at the default setting ({setting}): {reading}"
    return (
        "<noscript>"
        f'<img class="book-explorer-static" src="data:image/png;base64,{data}" '
        f'alt="{html.escape(alt)}">'
        f'<p class="book-explorer-reading">{html.escape(reading)}</p>'
        f"<p>The explorer needs JavaScript; this is its default setting ({html.escape(setting)})."
        "</p></noscript>"
    )


def site_explorer(spec: dict):
    """Display an explorer (see :func:`explorer_html`); it works on the website and in Jupyter
    alike, with no Python behind it. Returns the IPython object."""
    from IPython.display import HTML, display

    obj = HTML(explorer_html(spec))
    display(obj)
    return obj
