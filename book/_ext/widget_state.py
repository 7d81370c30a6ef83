"""Sphinx extension: leave the ipywidgets state of executed notebooks out of the pages.

Executing a chapter with sliders stores every widget's state in the notebook's metadata
(``application/vnd.jupyter.widget-state+json``), and MyST-NB embeds it in the page as a
``<script>`` (hundreds of KB). The site loads no widget JavaScript (``nb_ipywidgets_js: {}``
in _config.yml): its explorers are static stand-ins, so nothing reads that state. After each
notebook is read this drops the script MyST-NB registered for the page. Loaded through
``sphinx.local_extensions`` in _config.yml.
"""

KEY = "ipywidgets_state"  # MyST-NB's key for the script (myst_nb.core.render)


def drop_widget_state(nb_metadata: dict, docname: str) -> bool:
    """Forget the widget-state script registered for ``docname``; True if there was one."""
    js_files = nb_metadata.get(docname, {}).get("js_files", {})
    return js_files.pop(KEY, None) is not None


def _on_doctree_read(app, doctree) -> None:
    metadata = getattr(app.env, "nb_metadata", None)
    if metadata is not None:
        drop_widget_state(metadata, app.env.docname)


def setup(app):
    app.connect("doctree-read", _on_doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
