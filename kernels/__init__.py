"""Code for the book *Why low-precision flash attention fails*.

Importing this package first decides whether Triton runs natively or in its CPU interpreter
(:mod:`kernels.interpreter`), so it must be imported before anything else imports triton.

The layers, each importing only from the ones above it (``tests/tools/test_layout.py`` checks
that there are at most five and no import cycle between files):

1. :mod:`kernels.exercise_rules` the rules every exercise check follows; :mod:`kernels.tools` book
   tooling (setup cells, showing source, figure style); :mod:`kernels.interpreter` Triton's CPU
   interpreter, switched on without a GPU and mended; :mod:`kernels.triton_intro` chapter 2's
   first kernels; :mod:`kernels.reduction_guard` the guard of exercise ch2-rowmax (the grader's
   worker loads the same file); :mod:`kernels.results` measurements with provenance
2. :mod:`kernels.env` where we run (and seeding); :mod:`kernels.numerics` formats, rounding
   (NumPy, torch, Triton), statistics; :mod:`kernels.timing` how every measurement times;
   :mod:`kernels.triton_exercises` chapter 2's exercise checks
3. :mod:`kernels.attention` options, Triton kernels, emulator, fp64 reference, autograd, and
   :mod:`kernels.attention.registry`, the one place an implementation is named;
   :mod:`kernels.monitor` the attention
   monitor readers attach to their own training (and the pure metrics it shares with the GPT-2
   trainer); :mod:`kernels.course_lab` the course lab (``python -m kernels.course_lab build``)
4. the experiments: :mod:`kernels.rounding_lab` (the rounding lab), :mod:`kernels.gpt2` (the
   small GPT-2), :mod:`kernels.gpu` (GPU measurements, chapter 10); siblings that never import
   each other; and this package's own ``__init__``
5. :mod:`kernels.golden` chapter 8, built on the lab's cases and the GPT-2 trainer

Why this shape: the numbers (numerics) are defined once and everything else rounds with them;
the attention package is the numerics contract (kernel and emulator side by side, one options
object); the experiments sit on top and can change without touching the kernels.
"""

import os as _os

# OpenMP threads that spin while they wait thrash a busy machine: on 2 cores shared with one
# other busy process, a torch loop took 1.52 s with spinning threads and 0.29 s without. This
# must be set before torch (and its OpenMP runtime) loads; a reader's own setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Progress bars print text (tqdm.std), redrawn at most every 5 s: an executed notebook keeps
# every redraw as a line of its output, and 5 s keeps that to a start and an end for short work.
# tqdm reads TQDM_* settings when it is first imported, so this too must come first.
_os.environ.setdefault("TQDM_MININTERVAL", "5")

from .interpreter import configure_triton as _configure_triton  # noqa: E402

_configure_triton()

from .attention import flash_attention  # noqa: E402
from .env import setup  # noqa: E402
