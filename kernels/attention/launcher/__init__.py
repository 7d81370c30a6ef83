"""Launching the attention kernels: plans, tuning, stored picks, compiles, TMA decisions.

The kernels reach this package through one call per launch (a :class:`Launcher`, or
:func:`launch_together` for the backward's kernels); everything that makes a launch fast lives
here, so a reader of :mod:`..flash_fwd` sees the kernel and what it needs, not how it is made
fast.

* :mod:`.switches`  the one immutable value :class:`Speedups` (:data:`switches.CURRENT`), changed
  only inside ``with speedups(...)``; the one environment variable ``LPFA_OFF``
* :mod:`.plans`     :class:`Launcher` and its plans, tile sizes, compiling several launches at once
  or ahead in the background
* :mod:`.tuning`    parallel compiles and the stored autotuning picks

Code outside :mod:`kernels.attention` uses the names :mod:`kernels.attention` exports.
"""

from .plans import (
    Launch,
    Launcher,
    autotuners,
    cdiv,
    clear_plans,
    compile_ahead_of,
    forget_compiled,
    launch_together,
    launcher,
    n_bucket,
    pick_blocks,
    plans_made,
    tuned_entries,
)
from .switches import (
    OFF_VARIABLE,
    TMA_MIN_HEAD_DIM,
    Speedups,
    base_two,
    current,
    not_specialised,
    off_in_children,
    speedups,
    tma_usable,
    tune_every_bucket,
)
from .tuning import stored_table

__all__ = [
    "Launch",
    "Launcher",
    "autotuners",
    "cdiv",
    "clear_plans",
    "compile_ahead_of",
    "forget_compiled",
    "launch_together",
    "launcher",
    "n_bucket",
    "pick_blocks",
    "plans_made",
    "tuned_entries",
    "OFF_VARIABLE",
    "TMA_MIN_HEAD_DIM",
    "Speedups",
    "base_two",
    "current",
    "not_specialised",
    "off_in_children",
    "speedups",
    "tma_usable",
    "tune_every_bucket",
    "stored_table",
]
