"""Sphinx extension: number exercises per chapter, "Exercise 2.1", from the file name.

Why: sphinx-exercise numbers exercises with Sphinx's figure numbers, which run through the
whole book (chapter 2 started at Exercise 4) unless the table of contents is numbered. The two
ways Jupyter Book 1.x offers do not fit this book. A numbered toc (``numbered: true``) numbers
every section too, so the chapters' own "## 1." headings would read "1.1 1. ..."; limited to
the chapter titles (``numbered: 1``) it still renames every page in the sidebar, numbers the
appendix, and numbers chapters by their place in the toc, not by their file: a chapter added
after the appendix would be "9" while its file and the README say 08. Explicit titles
(``:nonumber:`` and a subtitle) render as "Exercise (2.1 ...)". So, after Sphinx has assigned
its numbers, this extension renumbers the exercises of every page whose file name starts with
two digits and an underscore (``book/02_triton_in_one_sitting``) as (chapter, k), k counting
that page's exercises in order. Solutions ("Solution to Exercise 2.1") and references read the
same table, so they follow. The lab kit numbers its student notebooks by the same rule
(``kernels/course_lab/notebook.py``).
Loaded through ``sphinx.local_extensions`` in _config.yml.
"""
import re

CHAPTER = re.compile(r"(?:^|/)(\d\d)_[^/]*$")


def renumber(env) -> list:
    """Rewrite ``env.toc_fignumbers`` for exercises; return the pages whose numbers changed."""
    changed = []
    for docname, by_type in env.toc_fignumbers.items():
        match = CHAPTER.search(docname)
        numbers = by_type.get("exercise")
        if not match or not numbers:
            continue
        chapter = int(match.group(1))
        ordered = sorted(numbers, key=lambda ident: numbers[ident])
        new = {ident: (chapter, k) for k, ident in enumerate(ordered, start=1)}
        if new != numbers:
            by_type["exercise"] = new
            changed.append(docname)
    return changed


def _on_env_updated(app, env):
    previous = getattr(env, "_exercise_numbers", {})
    renumber(env)
    current = {doc: dict(t.get("exercise", {})) for doc, t in env.toc_fignumbers.items()}
    env._exercise_numbers = current
    # pages whose final numbers differ from the last build's must be written again
    return [doc for doc in current if current[doc] != previous.get(doc)]


def setup(app):
    # after Sphinx's own toctree collector (priority 500) has assigned the figure numbers
    app.connect("env-get-updated", _on_env_updated, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
