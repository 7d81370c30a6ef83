"""What an attention call costs besides its kernels, on a GPU, in one run:

    python -m kernels.gpu.call_cost --out DIR        # writes DIR/call_cost.json

1. ``first_call``: the first forward + backward at a new length (:mod:`kernels.gpu.first_call`):
   tuning a bucket, a new length in a tuned bucket, a length of an untuned bucket that borrows
   the nearest tuned configuration.
2. ``host``: one forward + backward at GPT-2's shape (B8 H12 N1024 D64, bf16, causal), issued
   eagerly through autograd and replayed as a CUDA graph (:func:`graphed_step`: the call's
   kernels recorded once, then launched by one call), for the book's kernel and SDPA flash: the
   host µs to issue a call, the wall µs per call of a stream of calls, the GPU µs of its
   kernels, and whether the replay's output and gradients equal the eager call's bit for bit.
3. ``specialisation``: Triton compiles separate kernels for a length divisible by 16 (see
   the ``specialise_lengths`` field of :class:`kernels.attention.Speedups`). The first calls of
   1. and the speed of the book's kernel at two shapes (forward, forward + backward), in this
   process (lengths specialised, the default) and in a child process started with
   ``LPFA_OFF=specialise_lengths`` (one kernel for every length) and its own empty Triton cache.
4. ``tma``: the forward at chapter 10's five shapes (bf16, causal) with K and V read through
   pointers, through tensor descriptors (TMA) where :func:`kernels.attention.tma_usable`
   allows by default (head dim 128), and through descriptors at every head dim
   (``tma_narrow``); SDPA cuDNN's forward and forward + backward beside the book's, the
   targets' yardstick (forward >= 0.8x cuDNN, forward + backward >= 0.7x).

A graph replays fixed addresses: new inputs are copied into the recorded ones, as a training
step does (:mod:`kernels.gpt2.graphed_step`). The eager host time is what a plain PyTorch loop pays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from kernels import results, timing
from kernels.attention import OFF_VARIABLE, clear_plans, speedups, tune_every_bucket
from kernels.attention.registry import label, runner
from kernels.env import run_module_json
from kernels.gpu import first_call
from kernels.gpu.perf import SHAPES as FIVE_SHAPES
from kernels.gpu.records import LOADS  # the forward's loads in section 4, as switches

COMMAND = "python -m kernels.gpu.call_cost"
GPT2 = (8, 12, 1024, 64)  # (B, H, N, D), chapter 10's smallest shape
IMPLS = ("triton", "sdpa-flash")
SPEED_SHAPES = ((4, 16, 4096, 64), (2, 16, 8192, 128))  # two of chapter 10's five


def graphed_step(attn, q, k, v, grad, warmup=3):
    """(replay, outputs): forward + backward of ``attn`` recorded as a CUDA graph after
    ``warmup`` eager calls on a side stream (compiling, tuning and plans happen there);
    ``replay()`` reruns it and ``outputs`` (O, dQ, dK, dV) hold its results."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            torch.autograd.grad(attn(*leaves), leaves, grad)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attn(*leaves)
        grads = torch.autograd.grad(out, leaves, grad)
    return graph.replay, (out.detach(), *grads)


def eager_outputs(attn, q, k, v, grad):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = attn(*leaves)
    return (out.detach(), *torch.autograd.grad(out, leaves, grad))


def host_rows(shape=GPT2, calls=200, log=print) -> list[dict]:
    """One row per implementation and way of issuing (eager, CUDA graph); see the docstring."""
    tensors = timing.inputs(shape, torch.bfloat16, "cuda")
    rows = []
    for name in IMPLS:
        attn = runner(name, causal=True)
        eager = timing.step(attn, *tensors, "fwd+bwd")
        replay, outputs = graphed_step(attn, *tensors)
        replay()
        reference = eager_outputs(attn, *tensors)
        same = all(torch.equal(a, b) for a, b in zip(outputs, reference))
        # SDPA flash's backward accumulates dQ with atomics: two eager calls can differ too
        repeat = all(torch.equal(a, b) for a, b in zip(reference, eager_outputs(attn, *tensors)))
        _, _, kernel_us = timing.profile_kernels(eager, 10)
        for how, call in (("eager", eager), ("CUDA graph", replay)):
            for _ in range(3):
                call()
            timed = [timing.host_and_wall_us(call, calls) for _ in range(2)]
            row = dict(
                impl=label(name),
                issued=how,
                mode="fwd+bwd",
                shape=list(shape),
                host_us=min(h for h, _ in timed),
                wall_us=min(w for _, w in timed),
                kernel_us=kernel_us,
                graph_equals_eager=same,
                eager_repeats_exactly=repeat,
            )
            rows.append(row)
            log(
                f"{row['impl']:16s} {how:10s} host {row['host_us']:7.1f} µs  wall "
                f"{row['wall_us']:7.1f} µs  kernels {kernel_us:6.1f} µs  replay = eager: {same}"
            )
    return rows


def speed_rows(shapes=SPEED_SHAPES, log=print) -> list[dict]:
    """TFLOP/s of the book's kernel (rule off, bf16, causal), forward and forward + backward."""
    rows = []
    for shape in shapes:
        tensors = timing.inputs(shape, torch.bfloat16, "cuda")
        for mode in timing.MODES:
            attn = runner("triton", causal=True)
            row = timing.speed_row(
                label("triton"), attn, tensors, shape, "bf16", True, mode, warmup=10, rep=50
            )
            rows.append(row)
            log(f"N={shape[2]} D={shape[3]} {mode:7s} {row['tflops'] or 0:6.1f} TFLOP/s")
    return rows


def tma_rows(shapes=FIVE_SHAPES, log=print) -> list[dict]:
    """Section 4 of the module docstring: one row per shape, mode and way of loading."""
    rows = []
    for shape in shapes:
        tensors = timing.inputs(shape, torch.bfloat16, "cuda")
        cases = [(label("triton"), "triton", loads, "fwd") for loads in LOADS]
        cases += [(label("triton"), "triton", "TMA at D = 128", "fwd+bwd")]
        cases += [(label("sdpa-cudnn"), "sdpa-cudnn", None, mode) for mode in timing.MODES]
        for name, impl, loads, mode in cases:
            with speedups(**LOADS.get(loads, {})):
                attn = runner(impl, causal=True)
                row = timing.speed_row(
                    name, attn, tensors, shape, "bf16", True, mode, warmup=10, rep=50
                )
            row["loads"] = loads
            rows.append(row)
            log(
                f"N={shape[2]:5d} D={shape[3]} {mode:7s} {name:16s} {loads or '':15s} "
                f"{row['tflops'] or 0:6.1f} TFLOP/s"
            )
        del tensors
        torch.cuda.empty_cache()
    return rows


def unspecialised_child() -> dict:
    """:func:`first_call.first_calls` and :func:`speed_rows` in a child process whose kernels
    do not specialise on the lengths (``LPFA_OFF=specialise_lengths``), with an empty Triton
    cache of its own (nothing compiled or tuned by this process is reused)."""
    off = ",".join(filter(None, [os.environ.get(OFF_VARIABLE, ""), "specialise_lengths"]))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, **{OFF_VARIABLE: off})
        report, log = run_module_json(
            "kernels.gpu.call_cost", "--child", env=env, what="the unspecialised child", timeout=420
        )
    print(log[-2000:], end="")  # its log
    return report


def _child():
    def log(*parts):
        print("[lengths not specialised]", *parts, file=sys.stderr, flush=True)

    first = first_call.first_calls(log=log)
    clear_plans()
    with tune_every_bucket():
        print(json.dumps(dict(first_call=first, speed=speed_rows(log=log))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for call_cost.json (default results/)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not timing.on_gpu():
        raise SystemExit("kernels.gpu.call_cost needs a CUDA GPU")
    if args.child:
        return _child()
    first = first_call.first_calls()
    clear_plans()  # the host rows tune their own bucket, as chapter 10's benchmark does
    with tune_every_bucket() as now:
        data = dict(first_call=first, host=host_rows(), speedups=now.as_dict())
        data["tma"] = tma_rows()
        results.save("call_cost", data, COMMAND, directory=args.out)  # kept if the child fails
        data["specialisation"] = dict(
            specialised=dict(speed=speed_rows()),  # its first calls: first_call above
            not_specialised=unspecialised_child(),
        )
    path = results.save("call_cost", data, COMMAND, directory=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
