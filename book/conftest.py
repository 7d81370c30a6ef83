"""Chapters under pytest (nbmake): each one executed also fills the site's cache.

``python -m pytest`` executes every chapter top to bottom with nbmake. The site build
(``jupyter-book build .``; ``execute_notebooks: cache`` in ``_config.yml``) executes
them again unless ``_build/.jupyter_cache`` already holds an executed copy of the same
code. So a chapter that ran here without an error is stored in that cache, as the
build would store it (keyed by the code cells and the kernelspec): a build after the
tests reuses these outputs instead of running each chapter a second time. A chapter
whose code changed since no longer matches its entry and the build executes it; a
build on its own (no tests first) executes everything, as before.
"""

from __future__ import annotations

from pathlib import Path

import nbmake.pytest_items

CACHE = Path(__file__).resolve().parent.parent / "_build" / ".jupyter_cache"


def with_outputs(path: Path, executed):
    """The notebook at ``path`` as written (its metadata is part of the cache's key)
    with the outputs of ``executed`` (whose cells carry the executor's timings)."""
    import nbformat

    notebook = nbformat.read(str(path), nbformat.NO_CONVERT)
    if len(notebook.cells) != len(executed.cells):
        raise ValueError("the executed notebook has another number of cells")
    for cell, done in zip(notebook.cells, executed.cells):
        if cell.cell_type == "code":
            cell.outputs = done.outputs
            cell.execution_count = done.execution_count
    return notebook


def cache_executed(path: Path, executed) -> None:
    """Store an executed notebook in the site build's execution cache."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(CACHE))
    record = cache.add_nb_to_project(str(path))
    bundle = CacheBundleIn(with_outputs(path, executed), record.uri)
    cache.cache_notebook_bundle(bundle, check_validity=False, overwrite=True)


class CachingRun(nbmake.pytest_items.NotebookRun):
    """nbmake's run of one notebook, which also caches a successful execution."""

    def execute(self):
        result = super().execute()
        if result.error is None:
            try:
                cache_executed(Path(self.filename), result.nb)
            except Exception as err:  # an unwritable cache costs a re-execution only
                print(f"[book/conftest] not cached: {self.filename}: {err!r}")
        return result


nbmake.pytest_items.NotebookRun = CachingRun
