"""Golden et al., "Is Flash Attention Stable?", reproduced with the book's kernels (chapter 8).

* :mod:`.implementations`  baselines and flash attentions in any format, rounding written out
* :mod:`.microbench`       the precision, sequence-length and tile sweeps of the forward output
"""
