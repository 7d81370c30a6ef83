"""What the GPU compiler makes of the book's kernels, read on any machine.

Triton compiles a kernel for an H100 (sm_90) without a GPU, down to PTX, NVIDIA's assembly
language: :func:`compile_ptx`. In PTX a multiply and an add written as ``mul.f32`` and
``add.f32`` (no rounding modifier) may be fused by the assembler into one multiply-add, at its
own discretion; ``fma.rn.f32`` is one rounding, always. So ``a·b + c`` can come out with one
rounding in one kernel and two in another, and their last bits differ.

Chapter 10 met this: a first version of the exp2 rewrite kept the offset m in base-2 units
and computed L = m·ln 2 + log ℓ, and the compiler fused that multiply-add in the kernel with
the causal split but not in the kernel that masks every tile, so the two gave different L and
different gradients. The kernels now keep m in natural units and write the multiply-add of
every score as ``tl.fma``. :func:`census` compiles the three kernels with the
split on and off and counts their fused multiply-adds and :func:`unfused_multiply_adds`.

``python -m kernels.gpu.compiled`` prints the census (as JSON with ``--json``).
"""

from __future__ import annotations

import json
import os
import re
import sys

KERNELS = ("forward", "dK/dV", "dQ")
POINTERS_BF16 = {"Q", "K", "V", "O", "DO", "DK", "DV", "DQ"}
POINTERS_FP32 = {"LSE", "ROW_OFFSET", "PARAMS", "DELTA"}

_MUL = re.compile(r"\s*mul\.f32\s+(%r\d+),")
_ADD = re.compile(r"\s*(?:add|sub)\.f32\s+%r\d+,\s*([^,]+),\s*([^;]+);")


def unfused_multiply_adds(ptx: str) -> int:
    """How many ``add.f32``/``sub.f32`` instructions take the result of a ``mul.f32``: the
    multiply-adds the assembler may fuse or not (one rounding or two)."""
    products, count = set(), 0
    for line in ptx.splitlines():
        mul = _MUL.match(line)
        if mul:
            products.add(mul.group(1))
            continue
        add = _ADD.match(line)
        if add and {a.strip() for a in add.groups()} & products:
            count += 1
    return count


def _constexprs(kernel: str, split: bool, head_dim: int) -> dict:
    import torch

    from ..attention import current_speedups
    from ..attention.options import LOW_CODES, STABLE_OFF

    now = current_speedups()

    common = dict(
        HEAD_DIM=head_dim,
        CAUSAL=True,
        LOW=LOW_CODES[torch.bfloat16],
        EXPLICIT=False,
        SPLIT=split,
        LOG2=now.exp2,  # FA2 numerics, bf16: base two exactly when exp2 is on
    )
    if kernel == "forward":
        return dict(
            common,
            STABLE=STABLE_OFF,
            CAP=False,
            PAPER=False,
            ROUND_OUT=True,
            ELL_ROUNDED=False,
            STORE_OFFSET=False,
            TMA=False,
            MAX_FIRST=now.max_first,
            BLOCK_M=128,
            BLOCK_N=64,
        )
    if kernel == "dK/dV":
        return dict(common, BLOCK_M=64, BLOCK_N=128)
    return dict(common, DELTA_ONLY=False, BLOCK_M=128, BLOCK_N=64)


def compile_ptx(kernel: str, split: bool, head_dim: int = 64) -> str:
    """The PTX of one of :data:`KERNELS` (bf16, causal, FA2 numerics, rule off, the switches
    of :func:`kernels.attention.current_speedups`) for an sm_90 GPU, 4 warps, 3 stages. Needs
    Triton's compiler: a process without ``TRITON_INTERPRET=1`` (see :func:`census`)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ..attention import flash_bwd, flash_fwd

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    fn = {
        "forward": flash_fwd._flash_fwd_kernel,
        "dK/dV": flash_bwd._bwd_dkdv_kernel,
        "dQ": flash_bwd._query_tile_kernel,
    }[kernel]
    const = _constexprs(kernel, split, head_dim)
    signature = {}
    for name in fn.arg_names:
        if name in const:
            signature[name] = "constexpr"
        elif name in POINTERS_BF16:
            signature[name] = "*bf16"
        elif name in POINTERS_FP32:
            signature[name] = "*fp32"
        elif name.startswith("strides"):
            signature[name] = ("i32",) * 4
        else:
            signature[name] = "i32"
    compiled = triton.compile(
        ASTSource(fn, signature, const),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=4, num_stages=3),
    )
    return compiled.asm["ptx"]


def _census_here(head_dim: int) -> list[dict]:
    rows = []
    for kernel in KERNELS:
        for split in (True, False):
            ptx = compile_ptx(kernel, split, head_dim)
            rows.append(
                dict(
                    kernel=kernel,
                    split=split,
                    fused=ptx.count("fma.rn.f32") + ptx.count("fma.rn.ftz.f32"),
                    unfused=unfused_multiply_adds(ptx),
                )
            )
    return rows


def census(head_dim: int = 64) -> list[dict]:
    """For each of :data:`KERNELS`, with the causal split on and off: the fused multiply-adds
    (``fma.rn``) of its sm_90 PTX and the :func:`unfused_multiply_adds`. Compiles in a child
    process where this one runs the Triton interpreter (no GPU needed either way)."""
    from ..env import run_module_json
    from ..interpreter import interpreting

    if not interpreting():
        return _census_here(head_dim)
    env = dict(os.environ, TRITON_INTERPRET="0", CUDA_VISIBLE_DEVICES="")
    report, _ = run_module_json(
        "kernels.gpu.compiled", "--json", str(head_dim), env=env, what="the PTX census"
    )
    return report


def print_census(rows) -> None:
    print(f"{'sm_90 PTX, bf16, causal':24s}{'split':>7s}{'fused':>8s}{'unfused':>9s}")
    for r in rows:
        print(
            f"  {r['kernel']:22s}{'on' if r['split'] else 'off':>7s}{r['fused']:8d}"
            f"{r['unfused']:9d}"
        )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    from ..interpreter import configure_triton

    if configure_triton():
        raise SystemExit("compiling for a GPU needs TRITON_INTERPRET=0")
    head_dim = int(argv[1]) if len(argv) > 1 else 64
    rows = _census_here(head_dim)
    if argv[:1] == ["--json"]:
        print(json.dumps(rows))
    else:
        print_census(rows)


if __name__ == "__main__":
    main()
