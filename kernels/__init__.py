"""Code for the book *Why low-precision flash attention fails*.

Importing this package first decides whether Triton runs natively or in its CPU interpreter
(:mod:`kernels.env`), so it must be imported before anything else imports triton.
"""
from .env import configure_triton as _configure_triton

_configure_triton()

from .env import setup  # noqa: E402
from .attention import flash_attention  # noqa: E402
