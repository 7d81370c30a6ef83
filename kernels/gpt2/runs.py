"""The stored GPT-2 runs (``results/gpt2_*.json``) and their names: loading a search record,
gathering the real-BF16 and control runs stored over several files, a run's name in words, and a
logged series (a variant's name and colour are views of :data:`.plans.VARIANT_TABLE`).
:mod:`.report` measures the runs, :mod:`.figures` draws them; both read them through here.
"""

from __future__ import annotations

import numpy as np

from ..results import load, stored_names
from .plans import VARIANT_COLOURS, VARIANT_NAMES  # noqa: F401  (views of plans.VARIANT_TABLE)

FONT = 9  # smallest font size in the chapter's figures (points): legible at 720 px


def load_search(plan: str) -> dict:
    """The stored record of ``python -m kernels.gpt2.search --plan <plan>``."""
    return load(f"gpt2_{plan}")


def describe_files(prefix: str, plan: str, directory=None, width: int = 80) -> str:
    """Where the stored files ``results/<prefix>*.json`` were measured, in a few lines instead of
    one per file: the plan's command, how many files, the GPUs, versions and dates (each file's
    exact command, with the runs it trained, is in results/README.md)."""
    import textwrap

    records = [load(stem, directory) for stem in stored_names(prefix, directory)]
    gpus = sorted({r["provenance"]["gpu"] for r in records})
    versions = sorted({f"torch {r['provenance']['torch']}, triton {r['provenance']['triton']}"
                       for r in records})  # fmt: skip
    dates = sorted({r["provenance"]["date"][:10] for r in records})
    text = (
        f"stored: {len(records)} files of `python -m kernels.gpt2.search --plan {plan}`, "
        f"measured on {' and '.join(gpus)} ({'; '.join(versions)}) on {', '.join(dates)}; "
        "each file's command and runs: results/README.md"
    )
    return textwrap.fill(text, width, subsequent_indent="  ", break_on_hyphens=False)


def real_bf16_runs(directory=None) -> dict:
    """Every stored long real-BF16 run (``results/gpt2_bf16_real_long*.json``) as
    {(variant, seed): run}; a run stored in two files counts where it went further."""
    found: dict = {}
    for stem in stored_names("gpt2_bf16_real_long", directory):
        for name, run in load(stem, directory)["data"]["runs"].items():
            _, variant, seed = parse_name(name)
            old = found.get((variant, seed))
            if old is None or run["summary"]["steps_done"] > old["summary"]["steps_done"]:
                found[variant, seed] = run
    return found


def control_runs(directory=None) -> dict:
    """Every stored run of plan ``controls`` (``results/gpt2_controls*.json``: one file per
    sitting that made some of them) as {name: run}."""
    found: dict = {}
    for stem in stored_names("gpt2_controls", directory):
        found.update(load(stem, directory)["data"]["runs"])
    return found


def parse_name(name: str) -> tuple[str, str, str]:
    """'f-const3e-3-U-s1' -> ('f-const3e-3', 'U', 's1')."""
    config, variant, seed = name.rsplit("-", 2)
    return config, variant, seed


def run_label(name: str, run: dict | None = None, schedule: bool = False) -> str:
    """A run in words, for tables and legends: 'Ō with 4 bits, seed 1' or 'BF16, seed 0'
    (``run`` gives the width of Ō; without it the name's prefix does). ``schedule``: name a
    schedule other than the usual 20,000 steps ('BF16, seed 0, 60k-step schedule')."""
    config, _, seed = parse_name(name)
    bits = (
        obits_of(run)
        if run is not None
        else (int(config[1]) if config[:1] == "k" and config[1:2].isdigit() else 7)
    )
    label = f"{'BF16' if bits == 7 else f'Ō with {bits} bits'}, seed {seed[1:]}"
    steps = schedule_steps(run) if run is not None else 20_000
    if schedule and steps != 20_000:
        label += f", {steps // 1000}k-step schedule"
    return label


def schedule_steps(run: dict) -> int:
    """The length of a run's learning-rate schedule in steps (its decay, else its step count)."""
    return run["config"].get("decay_steps") or run["config"]["steps"]


def last_loss(run: dict, steps: int = 500) -> float:
    """The mean training loss over a run's last ``steps`` steps."""
    step = np.asarray(run["history"]["step"])
    loss = np.asarray(run["history"]["loss"], dtype=float)
    return float(np.mean(loss[step > step[-1] - steps]))


def first_divergence(run_a: dict, run_b: dict):
    """The first logged step at which two runs' training losses differ (None if they agree at
    every step both logged): where two trainings of one seed part ways."""
    loss_b = dict(zip(run_b["history"]["step"], run_b["history"]["loss"]))
    for step, loss in zip(run_a["history"]["step"], run_a["history"]["loss"]):
        if step in loss_b and loss_b[step] != loss:
            return int(step)
    return None


def gpus_of(runs) -> list[str]:
    """The GPUs a collection of stored runs trained on, as their records name them."""
    return sorted({run.get("gpu") or "no GPU recorded" for run in runs})


def smooth(steps, values, width: int = 10):
    """Moving average over ``width`` points, only where the window is full (no edge artefacts);
    returns the steps at the window centres and the averages."""
    steps, values = np.asarray(steps), np.asarray(values, dtype=float)
    width = max(1, min(width, len(values)))
    averaged = np.convolve(values, np.ones(width) / width, mode="valid")
    return steps[(width - 1) // 2 :][: len(averaged)], averaged


def monitor_series(run: dict, key: str, layer: int | None = None):
    """(steps, values) of a per-layer diagnostic; ``layer=None`` gives the maximum over layers.
    ``key='wq'`` reads ‖W_Q‖₂ (largest head of the layer); other keys are the probe's stats."""
    steps, values = [], []
    for m in run["monitor"]:
        if key == "wq":
            per_layer = [max(w) for w in m["wq_norms"]]
        elif key in ("rows_tied_bf16", "rows_p1_fa2"):
            per_layer = [100.0 * st[key] / st["rows"] for st in m["layers"]]  # percent of rows
        else:
            per_layer = [st.get(key) for st in m["layers"]]
        if any(v is None for v in per_layer):
            continue
        steps.append(m["step"])
        values.append(max(per_layer) if layer is None else per_layer[layer])
    return np.array(steps), np.array(values, dtype=float)


def obits_of(run: dict) -> int:
    """Mantissa bits of Ō in a run (7 = bf16; fewer = the amplifier)."""
    from .attention import parse_spec

    return parse_spec(run["config"]["attn"]).obits
