"""Golden et al., "Is Flash Attention Stable?", with the book's kernels and emulator
(chapter 8).

* :mod:`.implementations`  baselines and flash attentions (FA1 and FA2, fp32
  accumulation or every tensor in the format) in BF16, FP16, FP32 and FP64, the golden
  value, and a counter of the emulator's running-maximum growths
* :mod:`.microbench`       the precision, sequence-length and tile sweeps of the forward
  output
* :mod:`.training`         weight distances (max difference, Wasserstein) between runs
  trained in lock-step that differ in one thing
* :mod:`.stored`           the same measure on the GPT-2 chapter's stored logs (‖W_Q‖
  per head)
* :mod:`.figures`, :mod:`.report`  the chapter's figures and tables, and the stored GPU
  results
* :mod:`.exercises`        the chapter's exercise checks
* :mod:`.gpu`              the GPU script (``python -m kernels.golden.gpu``)

It sits on top of :mod:`kernels.attention`, :mod:`kernels.rounding_lab` (the sink rows) and
:mod:`kernels.gpt2` (the trainer and its stored runs); nothing imports from it.
"""
