"""The rounding lab: attention rows with tied maxima built exactly, and the bias each
implementation gives them (the bias chapters).

* :mod:`.cases`            the construction: :class:`Case`, :func:`build`, the fp64
  :func:`reference`
* :mod:`.implementations`  :func:`run_case` one implementation (named in
  :mod:`kernels.attention.registry`) on a built case, :func:`measure` its bias
* :mod:`.sweep`            the sweep over ties, gaps and V, and what it finds
* :mod:`.explorer`         :func:`lab`, one function of the sliders, and its widget
* :mod:`.figures`          the lab's plots
* :mod:`.slider_grid`      the fixes explorer's stored grid
  (``python -m kernels.rounding_lab.slider_grid``)
* :mod:`.site_explorers`   the explorers of chapters 5 and 6, for the website and for Jupyter
* :mod:`.gpu`              the GPU sweep (``python -m kernels.rounding_lab.gpu``)
* :mod:`.fixes`, :mod:`.fix_figures`, :mod:`.fixes_gpu`  chapter 6's fixes measured, drawn and
  timed on a GPU; :mod:`.chapter6_numbers` the numbers chapter 6's prose glues
* :mod:`.exercises`        the checks of the exercises of chapters 5 and 6
"""

from .cases import (
    EXP_ROUNDS_TO_ONE,
    PLACEMENTS,
    V_FAMILIES,
    Built,
    Case,
    VDist,
    build,
    reference,
    residual_in_ulps,
    small_lab_case,
)
from .explorer import (
    LabResult,
    lab,
    lab_text,
    largest_rm_rounding_to_one,
    near_midpoint,
    p_bar_of_tied,
    running_error,
    show,
    sum_errors,
    widget,
)
from .figures import FA2_FAMILY, PAPER_FAMILY, plot_lab
from .implementations import (
    EMULATED,
    GPU_ONLY,
    IMPLEMENTATIONS,
    fa2_fused_accumulation,
    measure,
    run_case,
)
from .sweep import (
    FAR_ULPS,
    SWEEP_GAPS,
    SWEEP_IMPLS,
    SWEEP_TIES,
    SWEEP_V,
    compare_devices,
    compare_settings,
    describe_cells,
    fixed_offset_bias,
    offset_rounding,
    print_compare,
    row_max_scan,
    save_cpu_sweep,
    sweep,
    sweep_cases,
    sweep_config,
    sweep_findings,
    sweep_table,
    tied_p_error,
    tied_rounding_scan,
)

__all__ = [n for n in dir() if not n.startswith("_")]
