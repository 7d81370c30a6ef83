"""``glue``: a measured number handed from a cell to the prose around it.

In the book's build MyST-NB stores the value and ``{glue:text}`name:,.0f``` in a Markdown cell
prints it, so a sentence can never drift from the cell that measures it; the build fails (``-W``)
when a glued name goes missing. Where MyST-NB is not installed (Colab, a plain Jupyter) the
value is simply returned: the cell's own printed output shows it there.
"""

from __future__ import annotations


def glue(name: str, value, display: bool = False) -> None:
    """Store ``value`` under ``name`` for the prose (MyST-NB). Returns nothing, so a glue as a
    cell's last line prints no output box under the cell. A NumPy or
    torch scalar is stored as the Python number it holds (its repr, ``np.float64(0.5)``, is
    not a number a format spec such as ``:.2f`` can read)."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value, display=display)


def glue_all(numbers: dict) -> None:
    """Glue every ``{name: value}`` of ``numbers``: one call in a chapter for the numbers a
    kernels function computed for its prose (see ``glue`` for how each is stored)."""
    for name, value in numbers.items():
        glue(name, value)
