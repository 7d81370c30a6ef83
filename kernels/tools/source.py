"""Show a function's or kernel's source in a chapter, cut between two marker strings."""

from __future__ import annotations

import inspect


def source_of(obj, start: str | None = None, stop: str | None = None) -> str:
    """The source text of a function or ``@triton.jit`` kernel.

    ``start`` / ``stop`` cut out a piece: from the first line containing ``start`` up to and
    including the first later line containing ``stop``. A missing marker is an error, so a
    chapter notices when the code it explains has changed.
    """
    fn = getattr(obj, "fn", obj)  # a JITFunction keeps the Python function in .fn
    lines = inspect.getsource(fn).splitlines()
    first, last = 0, len(lines) - 1
    if start is not None:
        hits = [i for i, line in enumerate(lines) if start in line]
        if not hits:
            raise ValueError(f"{start!r} does not occur in the source of {fn.__name__}")
        first = hits[0]
    if stop is not None:
        hits = [i for i, line in enumerate(lines) if stop in line and i >= first]
        if not hits:
            raise ValueError(f"{stop!r} does not occur after {start!r} in {fn.__name__}")
        last = hits[0]
    return "\n".join(lines[first : last + 1])


def show_source(obj, start: str | None = None, stop: str | None = None):
    """Display source with syntax highlighting (Jupyter and the built site); returns the object."""
    from IPython.display import Code, display

    code = Code(source_of(obj, start, stop), language="python")
    display(code)
    return code
