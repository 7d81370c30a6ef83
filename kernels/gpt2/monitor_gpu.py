"""Chapter 9's GPU measurements, in one command (sized for under 5 minutes on an H100)::

    python -m kernels.gpt2.monitor_gpu --out DIR        # writes DIR/monitor_gpu.json

1. **What the monitor costs on a GPU.** Chapter 7's GPT-2 (4 layers, width 256, 4 heads,
   context 256, SDPA attention), 64 sequences per step under BF16 autocast, AdamW. Whole
   training steps (``monitor.step``, forward, backward, optimizer) are timed with
   ``torch.cuda.synchronize()`` before the clock starts and before it stops, so the GPU
   work the monitor queues is counted: without the monitor, and with it reading every 1,
   10 and 100 steps, with and without δ. Each round runs a block of ``block`` steps of
   every setting in a random order (a busy GPU slows all alike); the overhead is the
   mean step time over the mean step time without the monitor, minus 1, per round.
2. **The fix in a stock Hugging Face GPT-2.** ``GPT2LMHeadModel`` from a small config (no
   download: 4 layers, width 256, context 256, byte vocabulary), 200 steps on the book's
   bytes of Python under BF16 autocast with ``attn_implementation="sdpa"`` and with the
   book's attention with δ from rowsum(dP∘P) (:mod:`kernels.attention.hf_attention`), seeds 0 and
   1, the
   same batches. The fix matches SDPA "within noise" when, for each seed, its smoothed
   loss curve stays as close to SDPA's of the same seed as SDPA's two seeds stay to each
   other (:func:`curve_gap`).

The command fails (after writing the file) when the fix does not match SDPA within noise
or a loss is not finite: on a GPU it is the test that the fix trains a stock model.
``--small`` runs both at tiny sizes on the CPU (the test of this script): its numbers
are no measurement and its file says so (``small``: true, no GPU in the provenance).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

# the measurement's sizes: (full run, --small smoke test)
_SIZES = {
    "n_layer": (4, 1),
    "n_head": (4, 2),
    "n_embd": (256, 32),
    "block_size": (256, 16),
    "batch": (64, 2),
    "block": (100, 6),
    "rounds": (5, 3),
    "warmup": (20, 2),
    "every": ((1, 10, 100), (1, 2, 3)),
    "hf_steps": (200, 6),
    "hf_batch": (32, 2),
    "hf_width": (20, 2),
    "seeds": ((0, 1), (0, 1)),
}
FULL = {key: full for key, (full, _) in _SIZES.items()}
SMALL = {key: small for key, (_, small) in _SIZES.items()}


def _model_sizes(sizes) -> dict:
    """The sizes both models are built with (the book's GPT, transformers' GPT-2)."""
    return {key: sizes[key] for key in ("n_layer", "n_head", "n_embd")}


def _sync(device):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _autocast(device):
    return (
        torch.autocast(device, dtype=torch.bfloat16)
        if device == "cuda"
        else contextlib.nullcontext()
    )


def _data(sizes, steps, seed):
    from .data import BatchOrder, load_corpus

    corpus = load_corpus("stdlib", max_bytes=4_000_000 if sizes is FULL else 200_000)
    order = BatchOrder.draw(
        len(corpus.train), steps, sizes["batch"], sizes["block_size"], seed=seed
    )
    return corpus, order


# ------------------------------------------------------------------------- overhead
def overhead_stage(sizes, device, seed=0) -> dict:
    """Seconds per synchronised training step, without the monitor and with it."""
    from ..monitor import AttentionMonitor
    from .model import GPT, GPTConfig

    torch.manual_seed(seed)
    cfg = GPTConfig(**_model_sizes(sizes), block_size=sizes["block_size"], attn="sdpa")
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95))
    n_batches = 8
    corpus, order = _data(sizes, n_batches, seed)
    batches = [
        order.batch(corpus.train, i, sizes["block_size"], device=device) for i in range(n_batches)
    ]
    sync = _sync(device)
    settings = {"off": None}
    for every in sizes["every"]:
        for delta in (True, False):
            settings[f"every {every}" + ("" if delta else ", no delta")] = (every, delta)
    monitors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # alerts of a model at initialisation
        for name, setting in settings.items():
            if setting is not None:
                monitors[name] = AttentionMonitor.attach(model, every=setting[0], delta=setting[1])

    def one(monitor, step):
        x, y = batches[step % n_batches]
        sync()
        start = time.perf_counter()
        read = monitor.step(step) if monitor is not None else False
        with _autocast(device):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        return time.perf_counter() - start, read

    rng = random.Random(seed)
    times = {name: [] for name in settings}
    per_round = {name: [] for name in settings}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(sizes["warmup"]):
            one(None, i)
        for r in range(sizes["rounds"]):
            names = list(settings)
            rng.shuffle(names)
            for name in names:
                block = [
                    one(monitors.get(name), r * sizes["block"] + i) for i in range(sizes["block"])
                ]
                times[name].extend(block)
                per_round[name].append(float(np.mean([t for t, _ in block])))
        for monitor in monitors.values():
            monitor.detach()
    off = np.array(per_round["off"])
    rows = []
    for name, setting in settings.items():
        values = np.array([t for t, _ in times[name]])
        read = np.array([r for _, r in times[name]], dtype=bool)
        paired = np.array(per_round[name]) / off - 1
        rows.append(
            {
                "setting": name,
                "every": None if setting is None else setting[0],
                "delta": None if setting is None else setting[1],
                "mean_ms": 1e3 * float(values.mean()),
                "median_ms": 1e3 * float(np.median(values)),
                "reading_median_ms": 1e3 * float(np.median(values[read])) if read.any() else None,
                "between_median_ms": 1e3 * float(np.median(values[~read]))
                if (~read).any()
                else None,
                "steps_read": int(read.sum()),
                "steps": int(len(values)),
                "overhead_median": float(np.median(paired)),
                "overhead_min": float(paired.min()),
                "overhead_max": float(paired.max()),
            }
        )
    return {
        "model": {k: sizes[k] for k in ("n_layer", "n_head", "n_embd", "block_size", "batch")},
        "autocast": "bf16" if device == "cuda" else None,
        "rounds": sizes["rounds"],
        "block": sizes["block"],
        "rows": rows,
    }


# --------------------------------------------------------------- the fix in HF GPT-2
def smoothed(values, width):
    """Moving average over ``width`` steps where the window is full."""
    values = np.asarray(values, dtype=float)
    width = max(1, min(int(width), len(values)))
    return np.convolve(values, np.ones(width) / width, mode="valid")


def curve_gap(a, b, width, start=None) -> float:
    """Mean |a − b| of two loss curves smoothed over ``width`` steps, from step ``start``
    (default: the second half)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(
            f"two loss curves of one length are needed, got shapes {a.shape} and {b.shape}"
        )
    start = len(a) // 2 if start is None else int(start)
    sa, sb = smoothed(a[start:], width), smoothed(b[start:], width)
    return float(np.abs(sa - sb).mean())


def within_noise(curves: dict, width, seeds) -> dict:
    """``curves[(implementation, seed)]``: the fix matches SDPA when, for every seed, its
    gap to SDPA of that seed is at most SDPA's gap between the two seeds."""
    s0, s1 = seeds
    noise = curve_gap(curves[("sdpa", s0)], curves[("sdpa", s1)], width)
    gaps = {str(s): curve_gap(curves[("fix", s)], curves[("sdpa", s)], width) for s in seeds}
    return {
        "noise_between_seeds": noise,
        "gap_to_sdpa": gaps,
        "within_noise": all(g <= noise for g in gaps.values()),
    }


def hf_stage(sizes, device) -> dict:
    from transformers import logging as hf_logging

    from ..attention import hf_attention

    hf_logging.set_verbosity_error()
    name = hf_attention.register()
    steps, n = sizes["hf_steps"], sizes["block_size"]
    corpus, _ = _data(sizes, 1, 0)
    from .data import BatchOrder

    order = BatchOrder.draw(len(corpus.train), steps, sizes["hf_batch"], n, seed=123)
    curves, seconds = {}, {}
    from ..attention import speedups

    with speedups(wide_tuning=False):  # a short autotuning: the 5-minute budget
        _train_hf(sizes, device, name, corpus, order, curves, seconds)
    verdict = within_noise(curves, sizes["hf_width"], sizes["seeds"])
    return {
        "implementation": name,
        "steps": steps,
        "batch": sizes["hf_batch"],
        "context": n,
        "width": sizes["n_embd"],
        "layers": sizes["n_layer"],
        "heads": sizes["n_head"],
        "smoothing": sizes["hf_width"],
        "autotuning": "narrow",
        "losses": {f"{impl}, seed {seed}": values for (impl, seed), values in curves.items()},
        "seconds": seconds,
        **verdict,
        "finite": all(np.isfinite(v).all() for v in curves.values()),
    }


def _train_hf(sizes, device, name, corpus, order, curves, seconds):
    from transformers import GPT2Config, GPT2LMHeadModel

    steps, n = sizes["hf_steps"], sizes["block_size"]
    for seed in sizes["seeds"]:
        for implementation in ("sdpa", "fix"):
            torch.manual_seed(seed)
            cfg = GPT2Config(
                **_model_sizes(sizes),
                n_positions=n,
                vocab_size=256,
                attn_pdrop=0.0,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                bos_token_id=0,
                eos_token_id=0,
                attn_implementation="sdpa" if implementation == "sdpa" else name,
            )
            model = GPT2LMHeadModel(cfg).to(device)
            opt = torch.optim.AdamW(
                model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0
            )
            losses = []
            start = time.perf_counter()
            for step in range(steps):
                for group in opt.param_groups:
                    group["lr"] = 1e-3 * min(1.0, (step + 1) / max(1, steps // 10))
                x, _ = order.batch(corpus.train, step, n, device=device)
                with _autocast(device):
                    loss = model(x, labels=x).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                losses.append(loss.item())
            _sync(device)()
            curves[(implementation, seed)] = losses
            seconds[f"{implementation}, seed {seed}"] = time.perf_counter() - start


def stored(directory=None) -> dict | None:
    """The stored GPU record (``results/monitor_gpu.json``), or None while no GPU has made it
    (absent, or a ``--small`` CPU test run, which is no measurement)."""
    from .. import results

    try:
        record = results.load("monitor_gpu", directory=directory)
    except FileNotFoundError:
        return None
    if record["data"]["small"] or not record["provenance"]["gpu"]:
        return None
    return record


def plot_overhead(ax, data: dict):
    """How much slower a training step is with the monitor (median over rounds, bars from
    the fastest to the slowest round) against ``every``, with and without δ."""
    from matplotlib.ticker import FuncFormatter

    rows = [r for r in data["overhead"]["rows"] if r.get("every") is not None]
    top = max(100 * r["overhead_max"] for r in rows)
    for delta, label, colour in (
        (True, "reading δ too (delta=True)", "tab:red"),
        (False, "without δ", "tab:blue"),
    ):
        part = sorted((r for r in rows if r["delta"] == delta), key=lambda r: r["every"])
        mid = np.array([100 * r["overhead_median"] for r in part])
        low = mid - np.array([100 * r["overhead_min"] for r in part])
        high = np.array([100 * r["overhead_max"] for r in part]) - mid
        every = [r["every"] for r in part]
        ax.errorbar(every, mid, yerr=[low, high], marker="o", capsize=3, color=colour, label=label)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_ylim(top=2 * top)  # room above the highest bar on the symlog axis
    ax.set(
        xscale="log",
        yscale="symlog",
        xlabel="every: steps between two readings",
        ylabel="slower than without\nthe monitor (%)",
    )
    ax.set_xticks([1, 10, 100], ["1", "10", "100"])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.legend()


def overhead_lines(data: dict) -> list[str]:
    """The overhead table in words: ms per step without the monitor and per setting, each
    number named by its statistic: the ms per step are means over all timed steps, the
    overhead the median over paired steps of (with ÷ without − 1), the reading step a
    median. The two need not agree: a mean ratio is not the median of the paired ones."""
    rows = data["overhead"]["rows"]
    off = next(r for r in rows if r["setting"] == "off")
    lines = [
        f"without the monitor: mean {off['mean_ms']:.2f} ms per training step",
        f"{'setting':22s}{'mean ms/step':>13s}{'median overhead':>17s}{'median reading':>16s}",
    ]
    for r in rows:
        if r.get("every") is None:
            continue
        name = f"every {int(r['every'])}, {'with δ' if r['delta'] else 'without δ'}"
        overhead = f"{100 * r['overhead_median']:+.1f} %"
        reading = f"{r['reading_median_ms']:.1f} ms"
        lines.append(f"{name:22s}{r['mean_ms']:13.2f}{overhead:>17s}{reading:>16s}")
    return lines


def plot_hf_losses(ax, data: dict):
    """Smoothed loss of the stock Hugging Face GPT-2 with SDPA and with the fix, per seed."""
    hf = data["hf"]
    for key, values in hf["losses"].items():
        implementation, seed = key.split(", seed ")
        sdpa = implementation == "sdpa"
        line = smoothed(values, hf["smoothing"])
        ax.plot(
            np.arange(len(values) - len(line), len(values)),
            line,
            color="tab:blue" if sdpa else "tab:purple",
            ls="-" if seed == "0" else "--",
            label=f"{'SDPA' if sdpa else 'δ from dP∘P'}, seed {seed}",
        )
    ax.set(xlabel="training step", ylabel="loss (nats/byte)")
    ax.legend()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes on the CPU (a test)")
    parser.add_argument("--out", default=None, help="directory for the JSON (default results/)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    from .. import results

    device = "cuda" if torch.cuda.is_available() and not args.small else "cpu"
    if device == "cpu" and not args.small:
        raise SystemExit(
            "kernels.gpt2.monitor_gpu measures on a CUDA GPU; on a CPU run it with "
            "--small (a test of the script, not a measurement)"
        )
    sizes = SMALL if args.small else FULL
    begin = time.time()
    data = {"small": bool(args.small), "device": device, "overhead": overhead_stage(sizes, device)}
    data["overhead_seconds"] = time.time() - begin
    data["hf"] = hf_stage(sizes, device)
    data["seconds"] = time.time() - begin
    command = "python -m kernels.gpt2.monitor_gpu" + (" " + " ".join(argv) if argv else "")
    out = Path(args.out) if args.out else None
    path = results.save("monitor_gpu", data, command, directory=out)
    print(f"wrote {path} in {data['seconds']:.0f} s")
    for row in data["overhead"]["rows"]:
        print(
            f"  {row['setting']:22s} {row['mean_ms']:8.2f} ms/step, overhead "
            f"{100 * row['overhead_median']:+.1f} %"
        )
    hf = data["hf"]
    print(
        f"  HF GPT-2 with {hf['implementation']}: gap to SDPA {hf['gap_to_sdpa']}, "
        f"SDPA seed to seed {hf['noise_between_seeds']:.4f}: within noise "
        f"{hf['within_noise']}"
    )
    if not args.small and not (hf["within_noise"] and hf["finite"]):
        raise SystemExit(
            f"the fix did not train as SDPA does (stored in {path}): its loss "
            f"curve left SDPA's by more than SDPA's two seeds differ"
        )
    return out if out is not None else Path(path).parent


if __name__ == "__main__":
    main()
