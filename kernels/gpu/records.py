"""Chapter 10's measurements as records: ``results/perf_*.json`` (written by
``python -m kernels.gpu.perf`` on a GPU) and ``results/call_cost.json`` (``python -m
kernels.gpu.call_cost``).

:func:`load` returns what there is and never treats a CPU record (provenance without a GPU,
e.g. from ``--small``) as a GPU measurement. The implementations' labels come from
:mod:`kernels.attention.registry`.
"""

from __future__ import annotations

import numpy as np

from .. import results
from ..attention import TMA_MIN_HEAD_DIM
from ..attention.registry import group, label

# NVIDIA's datasheet for the H100 SXM5 80 GB, the GPU of the stored records (the H200 has the
# same compute): dense bf16 without sparsity (TFLOP/s), the ceiling of every speed; HBM3 (TB/s).
# A run measures what a large matmul and a copy reach below them (perf_host.json "ceilings").
PEAK_TFLOPS = 989.0
HBM_TB_S = 3.35
RECORDS = ("host", "speed", "memory", "ablation")
IMPL_ORDER = [label(name) for name in group("perf-legend")]
STYLE = dict(
    zip(
        IMPL_ORDER,
        (
            dict(color="tab:purple", marker="s"),
            dict(color="tab:orange", marker="o"),
            dict(color="tab:gray", marker="v"),
            dict(color="tab:blue", marker="D"),
            dict(color="tab:green", marker="^"),
        ),
    )
)
BOOK_OFF, BOOK_CROSS = label("triton"), label("triton/cross")
SETTINGS = [("bf16", True), ("bf16", False), ("fp16", True), ("fp16", False)]


def is_gpu_record(record) -> bool:
    return bool(record) and bool(record.get("provenance", {}).get("gpu"))


def load(directory=None) -> dict:
    """{"host", "speed", "memory", "ablation"} -> the GPU record of ``perf_<name>.json`` in
    ``directory`` (default ``results/``), or None where there is none (or only a CPU one)."""
    found = {}
    for name in RECORDS:
        try:
            record = results.load(f"perf_{name}", directory=directory)
        except FileNotFoundError:
            record = None
        found[name] = record if is_gpu_record(record) else None
    return found


def call_cost_record(directory=None) -> dict:
    """``call_cost.json`` (``python -m kernels.gpu.call_cost``): the first call at a new length
    and the host time of a call, eager and as a CUDA graph. Raises if it was not made on a
    GPU."""
    record = results.load("call_cost", directory=directory)
    if not is_gpu_record(record):
        raise ValueError("results/call_cost.json holds no GPU measurement")
    return record


def first_call_times(first: dict) -> list[tuple[str, float]]:
    """(label, seconds) per measured first call, in the order they ran: the bucket's tuning,
    new lengths of the tuned bucket with ``tune_by_bucket`` on and off, and lengths of untuned
    buckets that borrow the nearest tuned one's configuration (``nearest_bucket``), then (in
    records that have them) lengths of families never tuned in the process, which start from
    the stored benchmark's picks (``stored_tuning``) or, without one, tune."""
    bars = [(f"N={first['warm_up']['n']:,}: tunes its bucket", first["warm_up"]["seconds"])]
    if "warm_up_serial" in first:
        serial = first["warm_up_serial"]
        bars.append((f"N={serial['n']:,}: tunes, one compile at a time", serial["seconds"]))
    for switch, words in (("on", "same bucket"), ("off", "same bucket, retuned")):
        bars += [(f"N={r['n']:,}: {words}", r["seconds"]) for r in first[switch]]
    seen = set()
    for r in first["nearest"]:
        words = "same new bucket" if r["bucket"] in seen else "new bucket, borrows"
        sixteen = ", a multiple of 16" if r["n"] % 16 == 0 else ""
        bars.append((f"N={r['n']:,}: {words}{sixteen}", r["seconds"]))
        seen.add(r["bucket"])
    for r in first.get("stored", ()):
        family = f"{r['dtype']}{'' if r['causal'] else ' full'} D={r['d']}"
        words = "stored pick" if r["stored"] else "tunes, none stored"
        serial = "" if r.get("parallel", True) else ", one at a time"
        bars.append((f"N={r['n']:,} {family}: {words}{serial}", r["seconds"]))
    return bars


# the ways call_cost times the forward's loads (its "tma" rows): the speed-ups of each
LOADS = {
    "pointers": dict(tma=False, tma_narrow=False),
    "TMA at D = 128": dict(tma=True, tma_narrow=False),
    "TMA at every D": dict(tma=True, tma_narrow=True),
}


def reads_descriptors(loads: str, d: int, min_head_dim=TMA_MIN_HEAD_DIM) -> bool:
    """Whether the forward read K and V through descriptors with the switches ``LOADS[loads]``
    at head dim ``d`` (as :func:`kernels.attention.tma_usable` decides)."""
    switches = LOADS[loads]
    return switches["tma"] and (d >= min_head_dim or switches["tma_narrow"])


def tma_ratios(rows, min_head_dim=TMA_MIN_HEAD_DIM) -> list[dict]:
    """Per shape of the ``tma`` rows of ``call_cost.json`` (``n``, ``d``): the book's forward
    TFLOP/s over cuDNN's, every timing, split by how K and V were actually read
    (``"pointers"``, ``"descriptors"``: a list each, since the default, descriptors from
    ``min_head_dim`` on, times the same kernel as one of the other two rows), and its
    forward + backward over cuDNN's (``fb``)."""
    shapes = list(dict.fromkeys((r["n"], r["d"]) for r in rows))
    out = []
    for n, d in shapes:
        here = [r for r in rows if (r["n"], r["d"]) == (n, d) and r.get("tflops")]
        cudnn = {r["mode"]: r["tflops"] for r in here if r["loads"] is None}
        entry = dict(n=n, d=d, pointers=[], descriptors=[])
        for r in here:
            if r["loads"] is None:
                continue
            if r["mode"] == "fwd+bwd":
                entry["fb"] = r["tflops"] / cudnn["fwd+bwd"]
                continue
            tma = reads_descriptors(r["loads"], d, min_head_dim)
            entry["descriptors" if tma else "pointers"].append(r["tflops"] / cudnn["fwd"])
        out.append(entry)
    return out


def _mean(values):
    return sum(values) / len(values)


def tma_summary(rows, min_head_dim=TMA_MIN_HEAD_DIM) -> list[dict]:
    """Per shape of the ``tma`` rows: ``change``, descriptors against pointers (the mean of
    each one's timings, − 1); ``default``, the forward ÷ cuDNN's as the kernel reads by
    default (descriptors from ``min_head_dim`` on); ``fb``, forward + backward ÷ cuDNN's."""
    out = []
    for t in tma_ratios(rows, min_head_dim):
        reads = t["descriptors"] if t["d"] >= min_head_dim else t["pointers"]
        change = _mean(t["descriptors"]) / _mean(t["pointers"]) - 1
        out.append(dict(n=t["n"], d=t["d"], change=change, default=_mean(reads), fb=t["fb"]))
    return out


def tma_against_speed(tma_rows, speed_rows, min_head_dim=TMA_MIN_HEAD_DIM) -> list[dict]:
    """Per shape of the ``tma`` rows of ``call_cost.json`` (one run), the same shape of the speed
    matrix beside it (``speed_rows``, from ``perf_speed.json``: another run), bf16, causal: the
    book's forward (as it reads by default) and forward + backward over cuDNN's in each
    (``fwd``, ``fb``; ``speed_fwd``, ``speed_fb``), and cuDNN's forward + backward TFLOP/s in
    each (``cudnn_fb``, ``speed_cudnn_fb``)."""
    cudnn = label("sdpa-cudnn")

    def matrix(impl, n, d, mode):
        return next(
            r["tflops"]
            for r in speed_rows
            if (r["impl"], r["n"], r["d"], r["dtype"], r["mode"]) == (impl, n, d, "bf16", mode)
            and r["causal"]
            and r.get("tflops")
        )

    out = []
    for t in tma_summary(tma_rows, min_head_dim):
        n, d = t["n"], t["d"]
        here = next(
            r["tflops"]
            for r in tma_rows
            if (r["n"], r["d"], r["loads"], r["mode"]) == (n, d, None, "fwd+bwd")
        )
        book, other = (
            {m: matrix(impl, n, d, m) for m in ("fwd", "fwd+bwd")} for impl in (BOOK_OFF, cudnn)
        )
        out.append(
            dict(
                n=n,
                d=d,
                fwd=t["default"],
                fb=t["fb"],
                speed_fwd=book["fwd"] / other["fwd"],
                speed_fb=book["fwd+bwd"] / other["fwd+bwd"],
                cudnn_fb=here,
                speed_cudnn_fb=other["fwd+bwd"],
            )
        )
    return out


def runs_numbers(compared: list) -> dict:
    """Chapter 10's numbers on the two runs that timed the book against cuDNN, by glue name,
    from :func:`tma_against_speed`'s rows. Raises if they no longer say what the prose says
    (the runs differ most in forward + backward at the smallest N, where cuDNN's timing was
    slower in ``call_cost.json``'s run than in the speed matrix)."""
    small = min(compared, key=lambda c: c["n"])
    big = [c for c in compared if c["n"] > small["n"]]
    gap = max(abs(c[a] - c["speed_" + a]) for c in big for a in ("fwd", "fb"))
    if not abs(small["fb"] - small["speed_fb"]) > gap:
        raise ValueError("the prose says the runs differ most at the smallest N")
    if not small["cudnn_fb"] < small["speed_cudnn_fb"]:
        raise ValueError("the prose says cuDNN's forward + backward was slower in call_cost's run")
    return {
        "c10_runs_gap": gap,
        "c10_runs_small_fb": small["fb"],
        "c10_runs_small_speed_fb": small["speed_fb"],
        "c10_runs_cudnn_fb": small["cudnn_fb"],
        "c10_runs_speed_cudnn_fb": small["speed_cudnn_fb"],
    }


def repeat_spread(rows) -> float:
    """The largest relative gap between two timings of one kernel among the ``tma`` rows
    (pointers at a small head dim, descriptors at a large one are each timed twice)."""
    timed = [v for t in tma_ratios(rows) for v in (t["pointers"], t["descriptors"]) if len(v) > 1]
    return max(max(v) / min(v) - 1 for v in timed)


def specialisation(data) -> dict:
    """From ``call_cost.json``'s data: the first call at N = 2,000 with the lengths
    specialised and not (seconds), and per (shape, mode) the TFLOP/s of both (``rows``:
    n, d, mode, specialised, plain)."""
    spec = data["specialisation"]
    first = {r["n"]: r["seconds"] for r in data["first_call"]["nearest"]}
    plain = {r["n"]: r["seconds"] for r in spec["not_specialised"]["first_call"]["nearest"]}
    rows = [
        dict(n=a["n"], d=a["d"], mode=a["mode"], specialised=a["tflops"], plain=b["tflops"])
        for a, b in zip(spec["specialised"]["speed"], spec["not_specialised"]["speed"])
    ]
    return dict(first_specialised=first[2000], first_plain=plain[2000], rows=rows)


def speed_rows(record) -> list:
    return [r for r in record["data"]["rows"] if r.get("tflops")]


def select(rows, dtype, causal, mode):
    return [
        r
        for r in rows
        if r["dtype"] == dtype
        and bool(r["causal"]) == causal
        and r["mode"] == mode
        and r.get("tflops")
    ]


def impls_in(rows) -> list:
    seen = {r["impl"] for r in rows}
    return [name for name in IMPL_ORDER if name in seen]


def setting(dtype, causal) -> str:
    return f"{dtype}, {'causal' if causal else 'no mask'}"


def host_label(row):
    if row["direct_launch"] is None:
        return row["impl"]
    return "book, direct launch" if row["direct_launch"] else "book, as before"


FIRST_CALL_TARGET_S = 3.0  # the target a first call at a new shape should meet


def first_call_numbers(first: dict, again: dict) -> dict:
    """Chapter 10's numbers on first calls, by glue name, from the ``first_call`` section of
    ``call_cost.json`` and ``again`` ({N: seconds}, the GPU check's run of the nearest
    bucket). Raises if the record no longer says what the prose says (a new length in a
    tuned bucket costs far less than tuning; the parallel tuning beats the serial one; the
    stored pick starts faster in parallel than one kernel after the other)."""
    borrow = {r["n"]: r["seconds"] for r in first["nearest"]}
    par = [r["seconds"] for r in first["stored"] if r["parallel"]]
    ser = [r["seconds"] for r in first["stored"] if not r["parallel"]]
    numbers = {
        "c10_fc_tune": first["warm_up"]["seconds"],
        "c10_fc_same_ms": 1e3 * max(r["seconds"] for r in first["on"]),
        "c10_fc_retune": max(r["seconds"] for r in first["off"]),
        "c10_fc_borrow_ms": 1e3 * borrow[2001],
        "c10_fc_compile": borrow[2000],
        "c10_fc_compile_again": again[2000],
        "c10_fc_serial": first["warm_up_serial"]["seconds"],
        "c10_fc_stored_lo": min(par),
        "c10_fc_stored_hi": max(par),
        "c10_fc_stored_ser_lo": min(ser),
        "c10_fc_stored_ser_hi": max(ser),
        "c10_fc_stored_over": sum(s > FIRST_CALL_TARGET_S for s in par),
        "c10_fc_stored_of": len(par),
    }
    if not numbers["c10_fc_same_ms"] / 1e3 < numbers["c10_fc_tune"] / 10:
        raise ValueError("the prose says a new length in a tuned bucket costs little")
    if not numbers["c10_fc_tune"] < numbers["c10_fc_serial"]:
        raise ValueError("the prose says tuning in threads beats one configuration at a time")
    if not min(par) < min(ser):
        raise ValueError("the prose says the backward compiled in background threads is faster")
    return numbers


def call_host_numbers(calls: list, book: str, flash: str) -> dict:
    """Chapter 10's numbers on one call issued eagerly and replayed as a CUDA graph, by glue
    name, from the ``host`` rows of ``call_cost.json`` (``book``, ``flash``: the labels of the
    book's kernel and SDPA flash). Raises if the record no longer says what the prose says
    (a replayed call is issued faster than an eager one)."""
    row = {(r["impl"], r["issued"]): r for r in calls}
    book_graph, flash_graph = (row[impl, "CUDA graph"] for impl in (book, flash))
    if not book_graph["host_us"] < row[book, "eager"]["host_us"]:
        raise ValueError("the prose says a replayed call is issued faster than an eager one")
    return {
        "c10_graph_host": book_graph["host_us"],
        "c10_eager_host": row[book, "eager"]["host_us"],
        "c10_graph_wall": book_graph["wall_us"],
        "c10_graph_wall_flash": flash_graph["wall_us"],
        "c10_eager_wall_flash": row[flash, "eager"]["wall_us"],
        "c10_graph_speedup": flash_graph["wall_us"] / book_graph["wall_us"],
    }


def tma_numbers(tma: list) -> dict:
    """Chapter 10's numbers on tensor descriptors, by glue name, from :func:`tma_summary`'s
    rows. Raises if they no longer say what the prose says (descriptors slow the forward
    down at every head dim under 128)."""
    narrow = [t["change"] for t in tma if t["d"] < 128]
    wide = [t["change"] for t in tma if t["d"] >= 128]
    if not max(narrow) < 0:
        raise ValueError("the prose says descriptors slow the forward down at d < 128")
    return {
        "c10_tma_narrow_lo": -max(narrow),
        "c10_tma_narrow_hi": -min(narrow),
        "c10_tma_wide_lo": min(wide),
        "c10_tma_wide_hi": max(wide),
    }


FLOOR_ROWS = ("autograd alone, nothing allocated", "autograd alone, outputs allocated")


def host_floor_record(directory=None) -> dict:
    """``host_floor.json`` (``python -m kernels.gpu.host_cost --gpu``): host µs per eager
    forward + backward of each implementation and of autograd alone. Raises if it was not
    made on a GPU."""
    record = results.load("host_floor", directory=directory)
    if not is_gpu_record(record):
        raise ValueError("results/host_floor.json holds no GPU measurement")
    return record


def host_floor_numbers(host_us: dict, book: str, flash: str) -> dict:
    """Chapter 10's numbers on the floor of an eager call, by glue name, from the record's
    ``host_us`` (one value per round; the medians are compared). Raises if the record no
    longer says what the prose says (no implementation is issued faster than the floor)."""
    median = {name: float(np.median(us)) for name, us in host_us.items()}
    floor = [u for name in FLOOR_ROWS for u in host_us[name]]
    kernels = [name for name in host_us if name not in FLOOR_ROWS]
    if not min(min(host_us[name]) for name in kernels) > max(floor):
        raise ValueError("the prose says every implementation costs more than the floor")
    allocated = median[FLOOR_ROWS[1]]
    return {
        "c10_floor_lo": min(floor),
        "c10_floor_hi": max(floor),
        "c10_floor_book_over": median[book] - allocated,
        "c10_floor_flash_over": median[flash] - allocated,
    }
