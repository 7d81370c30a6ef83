"""GPU-only measurements: kernel speed and memory (:mod:`.bench`), the whole-GPU check (:mod:`.check`).

``python -m kernels.gpu.check`` runs the kernel tests natively, compares the explicit-rounding path
with hardware bf16, and benchmarks; it writes JSON with provenance to ``results/``.
"""
