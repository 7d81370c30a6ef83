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
* :func:`routes`    what a GPU of a given compute capability gets (an A100, a T4: Colab's)

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
    TMA_FROM,
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
from .tuning import serves, stored_record, stored_table


def routes(capability: tuple) -> dict:
    """What the book's kernels do on a CUDA GPU of this compute capability ((9, 0): an H100 or
    H200; (8, 0): an A100; (7, 5): a T4), by the rules the launcher applies: the numerics path
    (:func:`kernels.env.path_for`), whether the forward may read K and V through TMA (at head
    dim >= :data:`TMA_MIN_HEAD_DIM`), and whether the stored autotuning picks serve it (else
    every new family tunes on its first call) and which GPU they were measured on."""
    from ...env import path_for

    record = stored_record()
    provenance = record.get("provenance", {}) if record else {}
    return {
        "numerics": path_for(capability),
        "tma": tuple(capability) >= TMA_FROM,
        "stored_picks": bool(record) and serves(provenance, capability),
        "picks_from": provenance.get("gpu"),
    }


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
    "routes",
    "TMA_FROM",
]
