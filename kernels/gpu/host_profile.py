"""Where an eager attention call's host time goes, function by function (cProfile), and what
the ``lean_launch`` speed-up saves of it.

:func:`python_profile` profiles any function on any machine (the CPU tests use it on the book's
wrapper with its launches stubbed out). On a CUDA GPU, :func:`gpu_profile` profiles one eager
forward + backward at GPT-2's shape for the book's kernel (δ from rowsum(dP∘P)), the same with
``lean_launch`` on, and SDPA flash; times the three's host µs per call, taking turns; and checks
that ``lean_launch`` moves no bit. ``python -m kernels.gpu.host_profile [OUT]`` runs it on a
GPU and stores ``host_profile.json``.
"""

from __future__ import annotations

import os

from .host_cost import GPT2_SHAPE, _host_us

PROFILE_COMMAND = "python -m kernels.gpu.host_profile"


def python_profile(fn, calls=300, top=20) -> list[dict]:
    """Where the host's time per call of ``fn()`` goes, function by function (cProfile over
    ``calls`` calls after five unmeasured ones): the ``top`` functions by their own time, each
    as {"function", "calls" (per call of fn), "own_us", "total_us" (µs per call of fn)}. The
    profiler's own cost inflates every row alike; read the shares, not the sum."""
    import cProfile
    import pstats

    for _ in range(5):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    rows = []
    for (path, line, name), (_, ncalls, own, total, _) in pstats.Stats(profiler).stats.items():
        where = f"{os.path.basename(path)}:{line}({name})" if line else name
        rows.append(
            dict(function=where, calls=ncalls / calls, own_us=own / calls * 1e6,
                 total_us=total / calls * 1e6)
        )  # fmt: skip
    rows.sort(key=lambda r: -r["own_us"])
    return rows[:top]


def gpu_profile(shape=GPT2_SHAPE, calls=300, rounds=3) -> dict:
    """On a CUDA GPU, :func:`python_profile` of one eager forward + backward (bf16, causal) at
    ``shape``: the book's kernel (δ from rowsum(dP∘P), as the practitioner's loop runs it), the
    same with ``lean_launch`` on, and SDPA flash, so the book's excess host time can be read
    function by function; ``host_us``: per round, host µs per call (the best of 15 runs of 200
    calls), the three measured one after the other."""
    import torch

    from .. import timing
    from ..attention import speedups
    from ..attention.registry import label, runner

    q, k, v, grad = timing.inputs(shape, torch.bfloat16, "cuda")
    steps = {
        label(impl): timing.step(runner(impl, causal=True, **options), q, k, v, grad, "fwd+bwd")
        for impl, options in (("triton", {"delta_source": "dp"}), ("sdpa-flash", {}))
    }
    book, lean = label("triton"), label("triton") + ", lean launch"
    out = {name: python_profile(step, calls) for name, step in steps.items()}
    with speedups(lean_launch=True):
        out[lean] = python_profile(steps[book], calls)
    host = []
    for _ in range(rounds):
        measured = _host_us(steps, 200, 15)
        with speedups(lean_launch=True):
            measured[lean] = _host_us({lean: steps[book]}, 200, 15)[lean]
        host.append(measured)
    torch.cuda.synchronize()
    same = lean_same_bits(q, k, v, grad)
    what = python_profile.__doc__.split(".")[0]
    return dict(shape=list(shape), calls=calls, what=what, profiles=out, host_us=host,
                lean_same_bits=same)  # fmt: skip


def lean_same_bits(q, k, v, grad) -> bool:
    """Whether the book's output and gradients (δ from rowsum(dP∘P), causal) are bit for bit the
    same with the ``lean_launch`` speed-up on and off."""
    import torch

    from ..attention import flash_attention, speedups

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=True, delta_source="dp")
        return [out, *torch.autograd.grad(out, leaves, grad)]

    run()  # plans made, kernels compiled
    base = run()
    with speedups(lean_launch=True):
        run()
        lean = run()
    return all(torch.equal(a, b) for a, b in zip(base, lean))


def profile_table(rows: list[dict], title: str, width: int = 60) -> str:
    """:func:`python_profile`'s rows as text: own and total µs per call, calls per call."""
    lines = [f"{title}: µs per call (own, with callees), calls per call"]
    for r in rows:
        lines.append(
            f"  {r['function'][:width]:{width}s} {r['own_us']:7.1f} {r['total_us']:7.1f} "
            f"{r['calls']:5.1f}"
        )
    return "\n".join(lines)


def main(argv) -> None:
    from .. import results
    from ..timing import on_gpu

    if not on_gpu():
        raise SystemExit("python -m kernels.gpu.host_profile measures on a CUDA GPU")

    data = gpu_profile()
    for name, rows in data["profiles"].items():
        print(profile_table(rows, name))
    for name in data["profiles"]:
        rounds = [r[name] for r in data["host_us"]]
        print(f"  {name:30s} host µs per call: " + ", ".join(f"{u:.0f}" for u in rounds))
    print("lean launch gives the same bits:", data["lean_same_bits"])
    out = argv[0] if argv else None
    print("saved", results.save("host_profile", data, PROFILE_COMMAND, out))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
