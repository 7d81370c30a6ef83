"""The host side of a call (kernels.attention.launcher, options): what is cached, and that
caching and the speed-ups change no number.

* keyword options become one validated AttentionOptions per distinct set; bad ones still fail
  with a clear message (also after a look-alike good one was cached);
* the Launcher: the first call of a plan key goes through Triton and is remembered, later calls
  reuse it (on CUDA: the compiled kernel launched directly, with every argument in signature
  order); a new key, the interpreter and the "as before" switch behave as documented;
* tuning by bucket: only the first length of a power-of-two bucket is autotuned, later lengths
  launch with its configuration; another bucket, dtype or constexpr tunes again; with the
  switch off every new key tunes; clear_plans forgets the buckets;
* the causal split (unmasked tiles run without a mask) changes no bit of any output or gradient;
* the host-cost harness runs, and with Triton's real launch path every plan launches directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random

import pytest
import torch
import triton

import kernels  # noqa: F401
from kernels import flash_attention
from kernels.attention import speedups
from kernels.attention.launcher import plans as launching, tuning
from kernels.attention.options import DELTA_SOURCES, AttentionOptions, options_from
from kernels.env import native_bf16

ON_GPU = native_bf16()
DEVICE = "cuda" if ON_GPU else "cpu"


# --- options ---------------------------------------------------------------------------
def test_keyword_options_are_validated_once_per_set():
    first = options_from(dict(causal=True, stable="cross"))
    assert options_from(dict(stable="cross", causal=True)) is first
    assert options_from(dict(causal=True)) is not first
    assert first.kernel is first.kernel  # the kernels' view is computed once


def test_bad_options_still_fail_after_a_look_alike_was_cached():
    assert options_from(dict(stable=True)).stable == "cross"
    with pytest.raises(ValueError, match="stable must be"):
        options_from(dict(stable=1))  # 1 == True, but it is not a valid value
    with pytest.raises(TypeError, match="scale must be a number"):
        options_from(dict(scale=[0.1]))  # unhashable: validated, not cached
    with pytest.raises(ValueError, match="exists only in the emulator"):
        _ = AttentionOptions(stable="always").kernel
    q = torch.randn(1, 1, 8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="exists only in the emulator"):
        flash_attention(q, q, q, stable="offset")


# --- the Launcher, with a stand-in kernel ------------------------------------------------
class FakeCompiled:
    """What Triton returns from a launch: indexing it with a grid gives a launcher."""

    def __init__(self):
        self.launched = []

    def __getitem__(self, grid):
        return lambda *args: self.launched.append((grid, args))


class FakeKernel:
    arg_names = ["X", "Y", "N", "A", "BLOCK_M", "BLOCK_N"]

    def __init__(self, compiled=None):
        self.calls = []
        self.compiled = FakeCompiled() if compiled is None else compiled

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append((grid, args, kwargs))
            return self.compiled

        return run


class FakeConfig:
    kwargs = dict(BLOCK_M=128, BLOCK_N=64)

    def all_kwargs(self):
        return dict(self.kwargs, num_warps=8, num_stages=3)


class FakeTuned(FakeKernel):
    best_config = FakeConfig()

    def __getitem__(self, grid_of):
        return super().__getitem__(grid_of(self.best_config.kwargs))


@pytest.fixture
def switch():
    """``switch(name=value, ...)``: the speed-ups changed until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(speedups(**changes))


@pytest.fixture
def on_cuda(monkeypatch, switch):
    """The Launcher as on a CUDA machine (the interpreter off), all speed-ups on."""
    monkeypatch.setattr(launching, "interpreting", lambda: False)
    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    switch(direct_launch=True)


FIXED_BLOCKS = (("BLOCK_M", 32), ("BLOCK_N", 16))


def how(counter, blocks=FIXED_BLOCKS, tuned=None, **options):
    blocks = dict(blocks) if blocks is not None else None

    def first():
        counter.append(1)
        return launching.Launch(
            dict(A=7), lambda meta: (100 // meta["BLOCK_M"], 3), blocks, tuned, **options
        )

    return first


def test_first_call_goes_through_triton_then_launches_directly(on_cuda):
    kernel = FakeKernel()
    made, firsts = launching.Launcher(kernel), []
    made("key", ("x", "y", 100), how(firsts, num_stages=1))
    assert kernel.calls == [
        ((3, 3), ("x", "y", 100), dict(A=7, BLOCK_M=32, BLOCK_N=16, num_stages=1))
    ]
    made("key", ("x2", "y2", 100), how(firsts))
    made("key", ("x3", "y3", 100), how(firsts))
    assert len(kernel.calls) == 1 and len(firsts) == 1, "a known key must not launch anew"
    # every argument in signature order: the runtime ones, then the constexprs; grid in 3-D
    assert kernel.compiled.launched == [
        ((3, 3, 1), ("x2", "y2", 100, 7, 32, 16)),
        ((3, 3, 1), ("x3", "y3", 100, 7, 32, 16)),
    ]
    made("other key", ("x", "y", 100), how(firsts))
    assert len(kernel.calls) == 2 and len(firsts) == 2


def test_autotuned_plans_keep_the_chosen_configuration(on_cuda):
    tuned = FakeTuned()
    made, firsts = launching.Launcher(FakeKernel()), []
    made("key", ("x", "y", 100), how(firsts, blocks=None, tuned=tuned))
    made("key", ("x", "y", 100), how(firsts, blocks=None, tuned=tuned))
    plan = made.plans[made.plan_key("key", ("x", "y", 100))]
    assert plan.grid == (100 // 128, 3)
    assert plan.kwargs == dict(A=7, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    assert tuned.compiled.launched == [((0, 3, 1), ("x", "y", 100, 7, 128, 64))]


def test_without_direct_launch_every_call_is_a_first_call(on_cuda, monkeypatch, switch):
    switch(direct_launch=False)
    kernel = FakeKernel()
    made, firsts = launching.Launcher(kernel), []
    for _ in range(3):
        made("key", ("x", "y", 100), how(firsts))
    assert len(kernel.calls) == 3 and len(firsts) == 3 and made.plans == {}


def test_interpreter_plans_launch_through_triton(monkeypatch, switch):
    monkeypatch.setattr(launching, "interpreting", lambda: True)
    switch(direct_launch=True)
    kernel = FakeKernel()
    made, firsts = launching.Launcher(kernel), []
    for _ in range(3):
        made("key", ("x", "y", 100), how(firsts))
    assert len(firsts) == 1 and len(kernel.calls) == 3
    assert kernel.calls[2] == ((3, 3), ("x", "y", 100), dict(A=7, BLOCK_M=32, BLOCK_N=16))
    assert kernel.compiled.launched == []


def test_a_launch_that_returns_nothing_usable_falls_back(on_cuda):
    kernel = FakeKernel(compiled=object())  # no __getitem__: no direct launcher
    made, firsts = launching.Launcher(kernel), []
    made("key", ("x", "y", 100), how(firsts))
    made("key", ("x", "y", 100), how(firsts))
    assert (
        made.plans[made.plan_key("key", ("x", "y", 100))].runner is None and len(kernel.calls) == 2
    )


def test_clear_plans_forgets_every_plan():
    q = torch.randn(1, 1, 20, 16, device=DEVICE)
    flash_attention(q, q, q, block_m=16, block_n=16)
    assert any(made.plans for made in launching._LAUNCHERS)
    launching.clear_plans()
    assert not any(made.plans for made in launching._LAUNCHERS)


# --- tuning by bucket ------------------------------------------------------------------------
def test_n_bucket_rounds_up_to_a_power_of_two_from_128():
    rng = random.Random(28)
    for n in [1, 127, 128, 129, 1000, 1024, 1025, *(rng.randrange(1, 1 << 22) for _ in range(500))]:
        bucket = launching.n_bucket(n)
        assert bucket & (bucket - 1) == 0 and bucket >= max(n, launching.MIN_BUCKET), n
        assert bucket == launching.MIN_BUCKET or bucket // 2 < n, n  # the smallest such
    assert [launching.n_bucket(n) for n in (1, 128, 129, 1000, 1024, 1025)] == [
        128,
        128,
        256,
        1024,
        1024,
        2048,
    ]


class BucketTuned(FakeTuned):
    """A stand-in autotuner: every launch through it is an autotuning run (recorded in
    ``calls``) that picks ``best_config``, a real triton.Config."""

    def __init__(self):
        super().__init__()
        self.best_config = triton.Config(dict(BLOCK_M=128, BLOCK_N=64), num_warps=8, num_stages=3)


TUNED_KWARGS = dict(A=7, BLOCK_M=128, BLOCK_N=64, num_warps=8, num_ctas=1, num_stages=3)


def call_tuned(made, tuned, n, dtype=torch.bfloat16, a=7):
    """One call of ``made`` at sequence length ``n`` (plan key: n, dtype, a) whose first
    launch autotunes with ``tuned``, bucketed by (n, n)."""
    x = torch.zeros(1, dtype=dtype)
    first = lambda: launching.Launch(
        dict(A=a), lambda meta: (launching.cdiv(n, meta["BLOCK_M"]), 3), None, tuned, lengths=(n, n)
    )
    made((n, dtype, a), (x, "y", n), first)


def lengths_of(calls):
    return [args[2] for _, args, _ in calls]


def test_only_the_first_length_of_a_bucket_autotunes(on_cuda, monkeypatch, switch):
    switch(nearest_bucket=False)  # each bucket tuned for itself
    tuned, kernel = BucketTuned(), FakeKernel()
    made = launching.Launcher(kernel)
    for n in (1000, 1010, 1020, 1024):  # one bucket: 1024
        call_tuned(made, tuned, n)
    assert lengths_of(tuned.calls) == [1000]  # (a) the first autotunes
    # (b) the others launch (compile) once with its configuration, not through the autotuner
    assert [(grid, args[1:], kwargs) for grid, args, kwargs in kernel.calls] == [
        ((launching.cdiv(n, 128), 3), ("y", n), TUNED_KWARGS) for n in (1010, 1020, 1024)
    ]
    call_tuned(made, tuned, 1010)  # a known key: launched directly, nothing new
    assert len(tuned.calls) == 1 and len(kernel.calls) == 3
    assert kernel.compiled.launched[-1][1][1:] == ("y", 1010, 7, 128, 64)
    # (c) another bucket, another dtype or another constexpr value autotunes again
    call_tuned(made, tuned, 1025)
    call_tuned(made, tuned, 1020, dtype=torch.float16)
    call_tuned(made, tuned, 1020, a=8)
    assert lengths_of(tuned.calls) == [1000, 1025, 1020, 1020] and len(kernel.calls) == 3
    assert len(made.buckets) == 4


def test_a_new_bucket_borrows_the_nearest_tuned_configuration(on_cuda, monkeypatch, switch):
    switch(nearest_bucket=True)
    tuned, kernel = BucketTuned(), FakeKernel()
    made = launching.Launcher(kernel)
    call_tuned(made, tuned, 1000)  # tunes bucket 1024
    for n in (1500, 3000, 300):  # buckets 2048, 4096 and 512: one or two powers of two away
        call_tuned(made, tuned, n)
    assert lengths_of(tuned.calls) == [1000]
    assert [(grid, args[1:], kwargs) for grid, args, kwargs in kernel.calls] == [
        ((launching.cdiv(n, 128), 3), ("y", n), TUNED_KWARGS) for n in (1500, 3000, 300)
    ]
    assert len(made.buckets) == 1  # a borrowed pick is not stored as the bucket's own
    other = triton.Config(dict(BLOCK_M=64, BLOCK_N=64), num_warps=4, num_stages=3)
    tuned.best_config = other
    call_tuned(made, tuned, 5000)  # bucket 8192: three powers of two away, so tuned
    call_tuned(made, tuned, 1500, dtype=torch.float16)  # another family: tuned
    assert lengths_of(tuned.calls) == [1000, 5000, 1500]
    call_tuned(made, tuned, 7000)  # bucket 8192's own pick, no tuning
    assert len(tuned.calls) == 3 and kernel.calls[-1][1][2] == 7000
    # of two tuned buckets the nearer lends: 16384 borrows 8192's pick, 512 borrows 1024's
    assert made.nearest(bucket_of(made, tuned, 12000)) is other
    assert made.nearest(bucket_of(made, tuned, 400)) is not other
    assert made.nearest(bucket_of(made, tuned, 40000)) is None  # 65536: too far from 8192
    switch(nearest_bucket=False)
    assert made.nearest(bucket_of(made, tuned, 12000)) is None


def bucket_of(made, tuned, n, a=7):
    """The bucket key ``call_tuned`` gives length ``n``."""
    how = launching.Launch(dict(A=a), lambda meta: (1, 1), None, tuned, lengths=(n, n))
    return made.bucket((torch.zeros(1, dtype=torch.bfloat16), "y", n), how)


@pytest.mark.parametrize("name", ["tune_by_bucket", "direct_launch"])
def test_without_bucket_tuning_every_new_length_autotunes(on_cuda, monkeypatch, switch, name):
    switch(**{name: False})  # (d) either switch off: as before
    tuned, kernel = BucketTuned(), FakeKernel()
    made = launching.Launcher(kernel)
    for n in (1000, 1010, 1020):
        call_tuned(made, tuned, n)
    assert lengths_of(tuned.calls) == [1000, 1010, 1020]
    assert kernel.calls == [] and made.buckets == {}


def test_clear_plans_forgets_the_buckets(on_cuda, monkeypatch):
    monkeypatch.setattr(launching, "_LAUNCHERS", [])
    tuned = BucketTuned()
    made = launching.launcher(FakeKernel())
    call_tuned(made, tuned, 1000)
    call_tuned(made, tuned, 1010)
    assert lengths_of(tuned.calls) == [1000] and made.buckets
    launching.clear_plans()  # (e)
    assert made.buckets == {} and made.plans == {}
    call_tuned(made, tuned, 1020)
    assert lengths_of(tuned.calls) == [1000, 1020]


# --- the speed-ups change no number ---------------------------------------------------------
SPLIT_CASES = [
    (True, 70, dict(block_m=16, block_n=32)),
    (True, 70, dict(block_m=32, block_n=16)),
    (False, 45, dict(block_m=16, block_n=16)),
    (True, 33, dict(block_m=16, block_n=16, delta_source="dp")),
    (True, 48, dict(block_m=16, block_n=16, stable="cross")),
]


@pytest.mark.parametrize(
    "causal,n,options",
    SPLIT_CASES,
    ids=[
        f"{'causal' if c else 'full'}-n{n}-{'-'.join(map(str, o.values()))}"
        for c, n, o in SPLIT_CASES
    ],
)
def test_causal_split_changes_no_bit(causal, n, options, monkeypatch, switch):
    """Unmasked tiles visit the same keys in the same order as masked ones: every output and
    gradient is bit-identical with the split on and off."""
    gen = torch.Generator(device=DEVICE).manual_seed(n)
    q, k, v, grad = (
        torch.randn(2, 2, n, 32, device=DEVICE, generator=gen).bfloat16() for _ in range(4)
    )
    got = {}
    for split in (True, False):
        switch(causal_split=split)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=causal, **options)
        got[split] = [out.detach(), *torch.autograd.grad(out, leaves, grad)]
    for a, b in zip(got[True], got[False]):
        assert not torch.isnan(a).any()
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_plans_follow_the_memory_layout():
    """Same shape, other strides: another plan, the same numbers."""
    q, k, v = (torch.randn(1, 2, 40, 16, device=DEVICE).bfloat16() for _ in range(3))
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    a = flash_attention(q, k, v, causal=True, block_m=16, block_n=16)
    b = flash_attention(strided, k, v, causal=True, block_m=16, block_n=16)
    assert torch.equal(a, b)


# --- the host-cost harness ------------------------------------------------------------------
@pytest.mark.skipif(ON_GPU, reason="measures the CPU-side path; a GPU runs kernels.gpu.perf")
def test_host_cost_harness_runs_and_launches_directly():
    from kernels.gpu.host_cost import host_cost, table

    stub = host_cost("stub", calls=5, repeats=2)
    assert stub["forward+backward"]["best_us"] > stub["forward"]["best_us"] > 0
    real = host_cost("triton", calls=10, repeats=2)
    assert real["plans"] == dict(total=4, direct=4, lean=0), real["plans"]  # fwd, δ, dK/dV, dQ
    lean = host_cost("triton", calls=10, repeats=2, speedups=dict(lean_launch=True))
    assert lean["plans"] == dict(total=4, direct=4, lean=4), lean["plans"]
    before = host_cost("triton", calls=10, repeats=2, speedups=dict(direct_launch=False))
    assert before["plans"]["total"] == 0
    assert "forward+backward" in table(real, "title")
    with pytest.raises(ValueError, match="mode must be"):
        host_cost("gpu")


def test_python_profile_counts_calls_and_names_the_wrapper():
    """The host profile counts each function's calls per call of the profiled function, and on
    the stubbed wrapper its rows name the book's own functions (flash_forward among them)."""
    from kernels.gpu.host_cost import launches_stubbed
    from kernels.gpu.host_profile import profile_table, python_profile

    times = random.randint(2, 7)  # fresh each run: the count must follow it

    def helper():
        return sum(range(50))

    def fn():
        for _ in range(times):
            helper()

    rows = python_profile(fn, calls=20, top=50)
    found = [r for r in rows if r["function"].endswith("(helper)")]
    assert len(found) == 1 and found[0]["calls"] == times, rows
    assert all(r["total_us"] >= r["own_us"] >= 0 for r in rows)
    q, k, v, grad = (torch.randn(1, 2, 32, 16) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def step():
        out = flash_attention(*leaves, causal=True)
        torch.autograd.grad(out, leaves, grad)

    with launches_stubbed():
        rows = python_profile(step, calls=10, top=200)
    names = [r["function"] for r in rows]
    assert any(n.endswith("(flash_forward)") for n in names), names
    assert "(flash_forward)" in profile_table(rows, "book")


def test_a_lean_launch_passes_addresses_and_yields_to_launch_hooks(monkeypatch):
    """``lean_launch``: the compiled kernel's launcher gets the grid, the current stream, the
    kernel's function and metadata, no hooks, and every tensor as its address (other arguments
    and the constexpr tail as they are); with a launch hook set, Triton's runner launches."""
    from triton import knobs
    from triton.runtime import driver

    from kernels.attention.launcher.plans import _lean_runner

    stream = random.randint(1, 10**6)  # fresh each run: the launcher must be given it

    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return stream

    calls, fallback = [], []

    class Compiled:
        function, packed_metadata = "the kernel", ("warps", "ctas")

        def run(self, *args):
            calls.append(args)

    monkeypatch.setattr(driver, "_active", Driver())
    q, k = torch.randn(3, 4), torch.randn(5)
    args = (q, random.randint(1, 99), k, (4, 1))
    launch = _lean_runner(lambda *a: fallback.append(a), Compiled(), (7, 2), args)
    launch(*args, "TAIL")  # Triton 3.6's hook chains are there, but empty
    head = (7, 2, 1, stream, "the kernel", ("warps", "ctas"), None, None, None)
    assert calls == [head + (q.data_ptr(), args[1], k.data_ptr(), (4, 1), "TAIL")], calls
    assert fallback == []
    knobs.runtime.launch_enter_hook.add(print)  # a profiler's hook
    try:
        launch(*args, "TAIL")
    finally:
        knobs.runtime.launch_enter_hook.remove(print)
    assert len(calls) == 1 and fallback == [args + ("TAIL",)]
    launch(*args, "TAIL")  # the chain empty again: the lean launch
    assert len(calls) == 2 and len(fallback) == 1


def test_a_new_family_starts_from_the_stored_picks(on_cuda, monkeypatch, switch):
    """What one process tuned (``tuned_entries``), stored as JSON and read back (``table_of``),
    spares a later process the tuning: a family it never tuned compiles the stored pick of the
    nearest lengths; another family, or the switch off, tunes as before."""
    switch(nearest_bucket=False)
    tuned, made = BucketTuned(), launching.Launcher(FakeKernel())
    picks = {}
    for n, (bm, warps) in zip((1000, 4000), ((128, 8), (64, 4))):  # buckets 1024 and 4096
        tuned.best_config = triton.Config(dict(BLOCK_M=bm, BLOCK_N=64), num_warps=warps)
        call_tuned(made, tuned, n)
        picks[n] = dict(A=7, BLOCK_M=bm, BLOCK_N=64, num_warps=warps)
    monkeypatch.setattr(launching, "_LAUNCHERS", [made])
    entries = json.loads(json.dumps(launching.tuned_entries()))
    assert [e["lengths"] for e in entries] == [[1024, 1024], [4096, 4096]]
    monkeypatch.setattr(tuning, "stored_table", lambda device: tuning.table_of(entries))

    later_tuned, kernel = BucketTuned(), FakeKernel()
    later = launching.Launcher(kernel)
    n_near_1024 = random.randint(300, 1500)  # 512, 1024 or 2048: nearest to 1024
    n_near_4096 = random.randint(3000, 40000)  # 4096 .. 65536: nearest to 4096
    for n in (n_near_1024, n_near_4096):
        call_tuned(later, later_tuned, n)
    assert later_tuned.calls == [] and later.buckets == {}  # nothing tuned, nothing claimed
    for (_, _, kwargs), want in zip(kernel.calls, (picks[1000], picks[4000])):
        assert {k: kwargs[k] for k in want} == want
    call_tuned(later, later_tuned, 1500, dtype=torch.float16)  # a family never stored: tuned
    switch(stored_tuning=False)
    call_tuned(later, later_tuned, 2500)  # the switch off: tuned
    assert lengths_of(later_tuned.calls) == [1500, 2500]


def test_the_stored_picks_serve_every_gpu_of_their_architecture(monkeypatch, tmp_path):
    """``stored_table`` reads ``results/perf_tuning.json`` once per GPU model and serves it to
    the model named in its provenance and to any GPU of the same compute capability (an
    H100's picks on an H200); another architecture and the CPU get nothing (they tune). An
    older record without the capability is placed by its GPU's name."""
    entry = dict(
        kernel="k",
        choices="c",
        consts=dict(HEAD_DIM=64),
        dtypes=["torch.bfloat16"],
        lengths=[2048],
        config=dict(kwargs=dict(BLOCK_M=128, BLOCK_N=64), num_warps=8, num_stages=3),
    )
    stored = tmp_path / "perf_tuning.json"
    monkeypatch.setattr(tuning, "RESULTS_DIR", tmp_path)
    cuda = torch.device("cuda", 0)
    gpus = {"GPU A": (9, 0), "GPU B": (9, 0), "GPU C": (8, 0), "NVIDIA H200": (9, 0)}
    for provenance in (dict(gpu="GPU A", capability="9.0"), dict(gpu="NVIDIA H100 80GB HBM3")):
        stored.write_text(json.dumps(dict(provenance=provenance, data=dict(entries=[entry]))))
        monkeypatch.setattr(tuning, "_STORED", {})
        for gpu, want in (("GPU A", 1), ("GPU B", 1), ("GPU C", 0), ("NVIDIA H200", 1)):
            if provenance["gpu"] != "GPU A" and gpu.startswith("GPU"):
                continue  # an older H100 record: no capability, placed by its name
            monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, gpu=gpu: gpu)
            monkeypatch.setattr(
                torch.cuda, "get_device_capability", lambda device, gpu=gpu: gpus[gpu]
            )
            assert len(tuning.stored_table(cuda)) == want, (provenance, gpu)
    stored.unlink()
    monkeypatch.setattr(tuning, "_STORED", {"NVIDIA H200": tuning._STORED["NVIDIA H200"]})
    ((family, [(lengths, config)]),) = tuning.stored_table(cuda).items()  # read once per model
    assert family == ("k", "c", (("HEAD_DIM", 64),), ("torch.bfloat16",)) and lengths == (2048,)
    assert (config.kwargs, config.num_warps, config.num_stages) == (entry["config"]["kwargs"], 8, 3)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "GPU D")
    assert tuning.stored_table(cuda) == {}  # no file
    assert tuning.stored_table(torch.device("cpu")) == {}
    assert tuning.record_capability(dict(gpu="Tesla T4")) is None


def test_routes_say_what_each_gpu_gets_by_the_launchers_own_rules(monkeypatch, tmp_path):
    """``routes`` (chapter 10's table for Colab's GPUs) answers with the rules the launch uses:
    bf16 instructions from sm_80, TMA from sm_90, the stored picks where ``stored_table`` would
    serve them, and nothing stored where no file is."""
    from kernels.attention import routes
    from kernels.env import path_for

    stored = tmp_path / "perf_tuning.json"
    monkeypatch.setattr(tuning, "RESULTS_DIR", tmp_path)
    major = random.choice([8, 9, 10])
    provenance = dict(gpu="GPU X", capability=f"{major}.0")
    stored.write_text(json.dumps(dict(provenance=provenance, data=dict(entries=[]))))
    for cap in ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0)):
        got = routes(cap)
        native = "gpu-native" if cap >= (8, 0) else "gpu-explicit"
        assert got["numerics"] == path_for(cap) == native
        assert got["tma"] == (cap[0] >= 9)
        assert got["stored_picks"] == (cap == (major, 0)) and got["picks_from"] == "GPU X"
    stored.unlink()
    nothing_stored = dict(numerics="gpu-native", tma=True, stored_picks=False, picks_from=None)
    assert routes((9, 0)) == nothing_stored
    assert path_for(None) == "cpu-emulation"


def test_stored_picks_need_the_same_choices():
    """A stored pick names its autotuner's choices: the wide and the narrow lists differ."""
    from kernels.attention import flash_bwd, flash_fwd

    ids = {tuning.choices_id(t) for t in (flash_fwd._flash_fwd_tuned, flash_fwd._flash_fwd_narrow)}
    assert len(ids) == 2 and tuning.choices_id(flash_fwd._flash_fwd_tuned) == tuning.choices_id(
        flash_fwd._tuned(flash_fwd._WIDE)
    )
    assert tuning.choices_id(flash_bwd._bwd_dkdv_tuned) not in ids


class WarmKernel(FakeKernel):
    """A FakeKernel that also records ``warmup`` (compile without launching) and the thread
    that asked; ``fail`` names a BLOCK_M whose compile raises."""

    def __init__(self, fail=None):
        super().__init__()
        self.warmed, self.fail = [], fail

    def warmup(self, *args, grid, **kwargs):
        import threading

        if kwargs.get("BLOCK_M") == self.fail:
            raise RuntimeError("out of shared memory")
        self.warmed.append((grid, args, kwargs, threading.get_ident()))


def test_compile_ahead_warms_every_job_and_leaves_failures_to_the_launch(
    on_cuda, monkeypatch, switch
):
    kernel = WarmKernel(fail=32)
    blocks = random.sample([16, 32, 64, 128, 256], 4)
    jobs = [(kernel, ("x", i), (i, 1), dict(BLOCK_M=bm)) for i, bm in enumerate(blocks)]
    tuning.compile_ahead(jobs)
    want = [(grid, args, kw) for _, args, grid, kw in jobs if kw["BLOCK_M"] != 32]
    assert [w[:3] for w in kernel.warmed] == want
    kernel.warmed.clear()
    tuning.compile_ahead(jobs[:1])  # one job: its launch compiles it, no threads
    switch(parallel_compile=False)
    tuning.compile_ahead(jobs)
    assert kernel.warmed == []


def test_a_first_launch_compiles_its_choices_ahead(on_cuda, monkeypatch, switch):
    """An autotuned first launch hands every choice left after pruning to ``compile_ahead``;
    one with a known configuration or fixed tiles hands one; a known key none."""
    handed = []
    monkeypatch.setattr(tuning, "compile_ahead", lambda jobs: handed.append(jobs))
    switch(nearest_bucket=False)
    switch(stored_tuning=False)
    tuned, kernel = BucketTuned(), FakeKernel()
    sizes = random.sample([16, 32, 64, 128], 3)
    tuned.configs = [triton.Config(dict(BLOCK_M=m, BLOCK_N=64), num_warps=4) for m in sizes]
    tuned.early_config_prune = lambda configs, named, **consts: [
        c for c in configs if c.kwargs["BLOCK_M"] != sizes[0]
    ]
    made = launching.Launcher(kernel)
    call_tuned(made, tuned, 1000)
    (jobs,) = handed
    assert [kw["BLOCK_M"] for _, _, _, kw in jobs] == sizes[1:]
    assert all(
        kw["A"] == 7 and grid == (launching.cdiv(1000, kw["BLOCK_M"]), 3) for _, _, grid, kw in jobs
    )
    call_tuned(made, tuned, 1000)  # a known key
    call_tuned(made, tuned, 1010)  # the tuned bucket's configuration
    assert len(handed) == 2 and [kw["BLOCK_M"] for _, _, _, kw in handed[1]] == [128]
    counter = []
    fixed = how(counter)
    jobs, first = made.pending(("fixed",), ("x", "y", 5), fixed)
    assert [kw for _, _, _, kw in jobs] == [dict(A=7, BLOCK_M=32, BLOCK_N=16)]
    assert first() is first() and len(counter) == 1  # the Launch is built once


def test_forget_compiled_empties_kernels_and_autotuners(monkeypatch):
    class Tuner:
        cache = {("key",): "config"}

    kernel = FakeKernel()
    kernel.device_caches = {0: "compiled"}
    monkeypatch.setattr(launching, "_LAUNCHERS", [launching.Launcher(kernel)])
    monkeypatch.setattr(launching, "_AUTOTUNERS", [Tuner()])
    launching.forget_compiled()
    assert kernel.device_caches == {} and Tuner.cache == {}


# every δ source but "o_fp32", whose backward runs a second forward pass and is not compiled ahead
@pytest.mark.parametrize("delta_source", [s for s in DELTA_SOURCES if s != "o_fp32"])
def test_the_backward_compiled_ahead_is_the_backward_that_runs(delta_source):
    """The launches :func:`backward_launches` plans for a dO laid out like O (what the forward
    has the launcher compile in the background on a GPU) are the very launches the backward
    then makes: same kernels, grids and compile-time arguments; planning launches nothing."""
    from kernels.attention import flash_bwd
    from kernels.attention.flash_fwd import flash_forward

    n = random.randint(40, 130)
    q, k, v, do = (torch.randn(1, 2, n, 16).bfloat16() for _ in range(4))
    opts = options_from(dict(causal=True, delta_source=delta_source))
    out, lse, _ = flash_forward(q, k, v, opts, explicit=True)
    launchers = (flash_bwd._DELTA, flash_bwd._DKDV, flash_bwd._DQ)
    for made in launchers:
        made.plans.clear()
    _, calls = flash_bwd.backward_launches(q, k, v, out, out, lse, opts, explicit=True)
    jobs = [job for made, key, args, first in calls for job in made.pending(key, args, first)[0]]
    assert all(not made.plans for made in launchers)  # nothing launched
    kernels_listed = [kernel for kernel, _, _, _ in jobs]
    first = flash_bwd._query_tile_kernel if delta_source == "dp" else flash_bwd._delta_from_o_kernel
    assert kernels_listed == [first, flash_bwd._bwd_dkdv_kernel, flash_bwd._query_tile_kernel]
    flash_bwd.flash_backward(q, k, v, out, do, lse, opts, explicit=True)
    made_plans = [(p.grid, p.kwargs) for made in launchers for p in made.plans.values()]
    assert sorted(map(repr, made_plans)) == sorted(repr((grid, kw)) for _, _, grid, kw in jobs)


def test_background_compiles_finish_before_a_backward_waits_past_them(on_cuda, monkeypatch, switch):
    """``compile_in_background`` warms its jobs in another thread, even a single one;
    ``wait_for_background`` returns only when it is done; switched off, nothing runs."""
    import threading

    kernel, gate = WarmKernel(), threading.Event()
    warm = kernel.warmup

    def slow_warmup(*args, grid, **kwargs):
        gate.wait(5)
        warm(*args, grid=grid, **kwargs)

    kernel.warmup = slow_warmup
    jobs = [(kernel, ("x",), (1, 1), dict(BLOCK_M=random.choice([16, 64])))]
    tuning.compile_in_background(jobs)
    assert kernel.warmed == [] and tuning._BACKGROUND  # still compiling
    gate.set()
    tuning.wait_for_background()
    assert [w[:3] for w in kernel.warmed] == [(g, a, kw) for _, a, g, kw in jobs]
    assert kernel.warmed[0][3] != threading.get_ident() and not tuning._BACKGROUND
    switch(parallel_compile=False)
    tuning.compile_in_background(jobs)
    assert not tuning._BACKGROUND and len(kernel.warmed) == 1


# --- the speed-ups: one value, one environment variable ---------------------------------------
def test_lpfa_off_names_the_speedups_a_process_starts_without(monkeypatch):
    """``LPFA_OFF`` is a comma list of speed-ups; an unknown name is refused, not ignored."""
    from kernels.attention import OFF_VARIABLE, Speedups
    from kernels.attention.launcher import switches

    assert switches.switched_off(" exp2, fused ,") == {"exp2", "fused"}
    with pytest.raises(ValueError, match="unknown speed-up"):
        switches.switched_off("exp2,warp_drive")
    monkeypatch.setenv(OFF_VARIABLE, "exp2,specialise_lengths")
    started = switches._from_environment()
    assert not started.exp2 and not started.specialise_lengths
    assert started.plan_key == Speedups(exp2=False).plan_key  # what compiles: exp2 off


def test_tune_every_bucket_holds_inside_its_block_and_for_the_processes_it_starts(monkeypatch):
    from kernels.attention import OFF_VARIABLE, current_speedups, tune_every_bucket

    monkeypatch.setenv(OFF_VARIABLE, "fused")
    before = current_speedups()
    with tune_every_bucket() as now:
        assert now is current_speedups()
        assert not now.nearest_bucket and not now.stored_tuning
        assert os.environ[OFF_VARIABLE] == "nearest_bucket,stored_tuning,fused"
    assert current_speedups() is before and os.environ[OFF_VARIABLE] == "fused"
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.exp2 = False  # changed only through speedups(...)
