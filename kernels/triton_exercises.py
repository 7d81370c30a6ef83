"""Checks of chapter 2's exercises (rules: :mod:`kernels.exercise_rules`).

* ``ch2-grid`` :func:`check_launch_grid`: programs and masked lanes of a 1-D launch
* ``ch2-rowmax`` :func:`check_row_max`: a Triton kernel for the maximum of each row

The row-maximum check makes sure a Triton kernel does the work: while the reader's function
runs, PyTorch's reductions (``amax``, ``max``, ``sort``, ...) raise, and at least one Triton
launch must happen.
"""

from __future__ import annotations

import torch

from . import exercise_rules as ck
from .interpreter import interpreting
from .reduction_guard import triton_only


# ----------------------------------------------------------------------------------------------
# Exercise ``ch2-grid``: Programs and masked lanes
# ----------------------------------------------------------------------------------------------
def _launch_grid_expected(n: int, block: int) -> tuple[int, int]:
    programs = -(-n // block)
    return programs, programs * block - n


def check_launch_grid(fn, thorough: bool = False) -> None:
    """Exercise ``ch2-grid``: ``fn(n, block) -> (programs, masked_lanes)`` for ``vector_add``'s
    launch.

    Fresh (n, block) pairs: n a multiple of block, n below block, and n anywhere."""
    ck.need_function(fn, "launch_grid")
    ck.forbid(fn, "ch2-grid")
    rng = ck.fresh_rng()
    count = 300 if thorough else 30
    blocks = 2 ** rng.integers(4, 11, count)  # 16 ... 1024
    ns = rng.integers(1, 200_000, count)
    ns[: count // 3] = blocks[: count // 3] * rng.integers(1, 50, count // 3)  # no remainder
    ns[count // 3 : count // 2] = rng.integers(1, blocks[count // 3 : count // 2])  # n < block
    for n, block in zip(ns.tolist(), blocks.tolist()):
        got = ck.call(fn, "launch_grid", n, block)
        try:
            programs, masked = (int(v) for v in got)
        except (TypeError, ValueError):
            ck.fail(f"launch_grid should return a pair (programs, masked_lanes), got {got!r}")
        want_programs, want_masked = _launch_grid_expected(n, block)
        if programs != want_programs:
            if programs == n // block:
                ck.fail(
                    "too few programs when n is not a multiple of block: the last, partly "
                    "filled block needs a program too"
                )
            ck.fail(
                "wrong number of programs: one program per block of `block` lanes, and "
                "together they must cover all n elements"
            )
        if masked != want_masked:
            if masked == n % block:
                ck.fail(
                    "the masked lanes are the ones past n in the last program, not the ones "
                    "it keeps"
                )
            ck.fail(
                "wrong number of masked lanes: count the lanes of all programs, then the ones "
                "at index n or beyond"
            )
    ck.correct(f"{count} fresh launches (n up to 200,000, block 16 to 1,024)")


# ----------------------------------------------------------------------------------------------
# Exercise ``ch2-rowmax``: A row maximum in Triton
# ----------------------------------------------------------------------------------------------
def _negative_rows(n_rows, n_cols, gen, device):
    """Every entry in (-11, -1): a lane that reads 0 instead of -inf wins the maximum."""
    return (-torch.rand(n_rows, n_cols, generator=gen) * 10 - 1).to(device)


def _rows_with_larger_neighbours(n_rows, n_cols, gen, device):
    """Contiguous rows in which the element just past the end of each row (the next row's
    first, or one spare element after the last row) is larger than anything in the row: a mask
    that lets one lane too many through returns that neighbour."""
    buffer = -torch.rand(n_rows + 1, n_cols, generator=gen) * 10 - 1
    buffer[1:, 0] = -0.9 + 1e-3 * torch.arange(1, n_rows + 1)  # increasing, still negative
    buffer = buffer.to(device)
    return buffer[:n_rows]  # a contiguous view


def check_row_max(fn, thorough: bool = False, device=None) -> None:
    """Exercise ``ch2-rowmax``: ``fn(x) -> (rows,)`` holds the maximum of each row of the 2-D fp32
    ``x``, computed by a Triton kernel (one program per row).

    Fresh rows of lengths that are not powers of two, all negative; and rows whose next element
    in memory is larger than all of theirs. ``thorough`` (the grader's hidden test) adds more
    and longer rows and a single column."""
    ck.need_function(fn, "row_max")
    ck.forbid(fn, "ch2-rowmax")
    device = device or ("cpu" if interpreting() or not torch.cuda.is_available() else "cuda")
    gen, rng = ck.fresh_generator(), ck.fresh_rng()
    lengths = [int(n) for n in rng.integers(3, 200, 6 if thorough else 3)]
    lengths = [n + 1 if n & (n - 1) == 0 else n for n in lengths]  # never a power of two
    if thorough:
        lengths += [1, 128, int(rng.integers(700, 1500))]
    cases = []
    for n_cols in lengths:
        n_rows = int(rng.integers(2, 9))
        cases.append(("negative", _negative_rows(n_rows, n_cols, gen, device)))
        cases.append(("neighbour", _rows_with_larger_neighbours(n_rows, n_cols, gen, device)))
    for kind, x in cases:
        want = x.amax(dim=1)
        launches: list = []
        with triton_only(launches):
            got = ck.call(fn, "row_max", x)
        launches += getattr(fn, "remote_launches", [])  # the grader's worker counted them
        if not launches:
            ck.fail(
                "row_max launched no Triton kernel: write the kernel and launch it with "
                "kernel[grid](...)"
            )
        ck.need_tensor(
            got,
            "row_max",
            want.shape,
            f"for x of shape {tuple(x.shape)} row_max should return one value per row, "
            f"shape {tuple(want.shape)}",
        )
        got = got.to(device=want.device, dtype=want.dtype)
        if torch.equal(got, want):
            continue
        rows = f"rows of {x.shape[1]} entries"
        if kind == "negative" and bool((got == 0).any()):
            ck.fail(
                f"on {rows}, all negative, some maximum came out as 0: what do the masked "
                "lanes read?"
            )
        if bool((got > want).any()):
            ck.fail(
                f"on {rows} some maximum is larger than every entry of its row: does the mask "
                "let one lane read past the end of the row?"
            )
        ck.fail(
            f"wrong maxima on {rows}: check the pointer of each row (row index times the "
            "row stride) and the mask"
        )
    ck.correct(f"{len(cases)} fresh tensors ({len(lengths)} row lengths) match torch.amax exactly")
