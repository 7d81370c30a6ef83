"""kernels.gpu.compiled: the sm_90 PTX of the book's kernels (compiled on the CPU) leaves the
assembler no multiply-add to fuse at its own discretion, with the causal split on or off."""

from __future__ import annotations

import random

from kernels.gpu import compiled


def test_unfused_multiply_adds_are_counted():
    """A product that is then added or subtracted counts; a product stored, an add of two
    loaded values and an explicit fma do not (fresh register numbers each run)."""
    r = random.sample(range(10, 999), 8)
    ptx = "\n".join(
        [
            f"\tmul.f32 \t%r{r[0]}, %r{r[1]}, 0f3F317218;",
            f"\tadd.f32 \t%r{r[2]}, %r{r[3]}, %r{r[0]};",
            f"\tsub.f32 \t%r{r[4]}, %r{r[0]}, %r{r[5]};",
            f"\tadd.f32 \t%r{r[6]}, %r{r[3]}, %r{r[5]};",
            f"\tfma.rn.f32 \t%r{r[7]}, %r{r[1]}, %r{r[3]}, %r{r[5]};",
        ]
    )
    assert compiled.unfused_multiply_adds(ptx) == 2
    assert compiled.unfused_multiply_adds(ptx.replace("mul.f32", "mul.rn.f32")) == 0


def test_kernels_leave_no_multiply_add_to_the_assembler():
    rows = compiled.census()
    assert {(r["kernel"], r["split"]) for r in rows} == {
        (k, s) for k in compiled.KERNELS for s in (True, False)
    }
    for r in rows:
        assert r["fused"] > 0, f"{r['kernel']} split={r['split']}: no fma at all?"
        assert r["unfused"] == 0, f"{r['kernel']} split={r['split']}: {r['unfused']} unfused"
