"""Interactive figures that work on the static website, with no kernel and no CDN.

Sliders in Jupyter and Colab are ipywidgets (they call Python on every move). The website has no
Python behind it, so there the same figure is a Plotly figure with its own slider over a grid of
values computed when the page was built. :func:`site_figure` writes it as a ``<div>`` plus a
script that draws it with ``window.Plotly``; the book's Sphinx extension (book/_ext/plotly_local.py)
serves ``plotly.min.js`` from the site itself. Where Plotly is not loaded (Colab, Jupyter) the
script writes a one-line note instead of failing.
"""

from __future__ import annotations

import html
import uuid

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
