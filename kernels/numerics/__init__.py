"""Numbers: floating-point formats, exact rounding traces, rounding helpers, statistics.

The bottom layer of the package; it imports nothing else from ``kernels`` but the exercise
checks' shared rules, :mod:`kernels.exercise_rules`.

* :mod:`.formats`          formats, bit patterns, ``round_to`` / ``ulp`` on NumPy values
                            (any format)
* :mod:`.addition`         one addition traced with integers (align, normalise, round, check);
  :mod:`.addition_view` shows a trace as text or HTML
* :mod:`.rounding`         the torch helpers: ``round_to_dtype``, ``round_mantissa``,
  ``ulp_in_dtype``, ``error_in_ulps``, ``ulp_distance``
* :mod:`.triton_rounding`  round-to-nearest-even inside Triton kernels (explicit or hardware)
* :mod:`.stats`            a mean with its standard error; bias verdicts
* :mod:`.experiments`, :mod:`.exercises`, :mod:`.widgets`  chapter 1's experiments, checks, sliders

Chapter 1 uses the NumPy side by name from here (``numerics.bits``, ``numerics.add_trace``); the
torch helpers (which take a torch dtype, not a format name) are imported from :mod:`.rounding`.
"""

from .addition import AddTrace, Operand, add_trace
from .exercises import EXERCISE_SUMS, PAPER_EXAMPLE
from .experiments import KINDS, plot_error_hist, plot_ulp, rounding_errors
from .formats import (
    FORMATS,
    Fields,
    Format,
    bits,
    decode,
    format_table,
    from_bits,
    get_format,
    round_to,
    ulp,
)
from .stats import MeanError, mean_error

__all__ = [
    "AddTrace",
    "Operand",
    "add_trace",
    "KINDS",
    "plot_error_hist",
    "plot_ulp",
    "rounding_errors",
    "EXERCISE_SUMS",
    "PAPER_EXAMPLE",
    "FORMATS",
    "Fields",
    "Format",
    "bits",
    "decode",
    "format_table",
    "from_bits",
    "get_format",
    "round_to",
    "ulp",
    "MeanError",
    "mean_error",
]
