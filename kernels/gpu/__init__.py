"""GPU measurements; every one times with :mod:`kernels.timing` and names its implementations
in :mod:`kernels.attention.registry`.

* :mod:`.check`     ``python -m kernels.gpu.check``: the whole-GPU check (unit tests natively,
  explicit against native rounding, errors, a speed and a memory table)
* :mod:`.perf`      ``python -m kernels.gpu.perf``: chapter 10's speed, memory, host-overhead
  and ablation measurements (:mod:`.precompile` fills Triton's cache first)
* :mod:`.call_cost` ``python -m kernels.gpu.call_cost``: what a call costs besides its kernels,
  the first call at a new length (:mod:`.first_call`, also part of the check) and the host time
  of a call issued eagerly and replayed as a CUDA graph
* :mod:`.host_cost` the host cost of one call with the GPU taken out
  (``python -m kernels.gpu.host_cost``), and torch's floor on a GPU (``--gpu``)
* :mod:`.host_profile` ``python -m kernels.gpu.host_profile``: where an eager call's host time
  goes, function by function, and what the ``lean_launch`` speed-up saves (``host_profile.json``)
* :mod:`.memory`    the memory of naive and flash attention (on any device, or peak on a GPU)
* :mod:`.compiled`  the kernels compiled for an H100 on any machine: their PTX's multiply-adds
  (``python -m kernels.gpu.compiled``)
* :mod:`.chapters`  ``python -m kernels.gpu.chapters``: every chapter executed on this machine,
  its status and seconds (``chapter_times.json``)
* :mod:`.practitioner`  ``python -m kernels.gpu.practitioner``: Hugging Face GPT-2 trained with
  SDPA and with the book's fix, eager and compiled, in steps/s (``practitioner_step.json``)
* :mod:`.perf_report`  what chapter 10 imports: :mod:`.records`, :mod:`.perf_figures`,
  :mod:`.roofline`, :mod:`.speed_targets` and its tables; :mod:`.exercises` the chapter's checks

Results go to ``results/*.json`` with provenance (:mod:`kernels.results`).
"""

from ..interpreter import configure_triton as _configure_triton

_configure_triton()  # the interpreter switch, before a module here imports triton
