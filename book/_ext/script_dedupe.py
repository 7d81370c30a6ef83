"""Sphinx extension: emit each inline <script> of a page once.

Why: Sphinx 7.4 registers an inline script added by an extension twice, once with
``filename=None`` (added to the builder directly) and once with ``filename=''`` (re-added from
the registry when the builder prepares writing), and its duplicate check does not see them as
equal. sphinx-thebe's inline script declares ``const THEBE_JS_URL``, so the second copy raises
"SyntaxError: Identifier 'THEBE_JS_URL' has already been declared" on every page, which the
site test (tests/test_site.py) rightly counts as a browser error. Loaded through
``sphinx.local_extensions`` in _config.yml.
"""


def _key(script) -> tuple:
    return (script.filename or "", tuple(sorted(script.attributes.items())))


def _drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        if _key(script) not in seen:
            seen.add(_key(script))
            unique.append(script)
    scripts[:] = unique


def setup(app):
    app.connect("html-page-context", _drop_duplicate_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
