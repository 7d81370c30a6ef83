"""Tests of the attention monitor (kernels.monitor): it finds the layers of the book's
GPT-2 and of Hugging Face's GPT-2, reads the right numbers (known answers and fp64
references), changes nothing the model computes (bit-identical outputs and gradients),
writes what it says, and refuses bad input with a clear error. CPU only, tiny models,
fresh random inputs each run."""

import copy
import math
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import kernels  # noqa: F401  (sets the Triton interpreter switch first)
from kernels.gpt2 import GPT, GPTConfig, diagnostics as dg
from kernels.monitor import (
    COLUMNS,
    METRICS,
    AttentionMonitor,
    ceiling_and_lead,
    layer_table,
    metrics,
    read_rows,
    time_steps,
)

FORWARD_METRICS = ("ties_bf16", "p1_fa2", "wq_norm", "max_logit")


def book_model(attn="paper:delta=o", qk_norm=False, n_layer=2, n_head=2, n_embd=32, block=24):
    return GPT(
        GPTConfig(
            block_size=block,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            attn=attn,
            qk_norm=qk_norm,
        )
    )


def hf_model(dropout=0.0):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=64,
        attn_pdrop=dropout,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg)


def book_loss(model, idx, autocast=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits, loss = model(idx, idx.roll(-1, dims=1))
    return logits, loss


def hf_loss(model, idx, autocast=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(idx, labels=idx)
    return out.logits, out.loss


class Reference:
    """What the test reads by itself, with its own hooks: q, k, v of every layer, the
    output O the layer produced and its gradient dO (the monitor's numbers are checked
    against these)."""

    def __init__(self, layers):
        self.qkv, self.out, self.d_out, self.handles = {}, {}, {}, []
        for i, (module, _) in enumerate(layers):
            self.handles.append(module.c_attn.register_forward_hook(self._qkv(i)))
            self.handles.append(module.c_proj.register_forward_pre_hook(self._out(i)))
        self.n_head = [h for _, h in layers]

    def _qkv(self, i):
        def hook(mod, inp, out):
            self.qkv[i] = out.detach().clone()

        return hook

    def _out(self, i):
        def hook(mod, inp):
            self.out[i] = inp[0].detach().clone()
            inp[0].register_hook(lambda g: self.d_out.__setitem__(i, g.detach().clone()))

        return hook

    def heads(self, i, t):
        b, n, c = t.shape
        return t.double().reshape(b, n, self.n_head[i], -1).transpose(1, 2)

    def remove(self):
        for h in self.handles:
            h.remove()


def fp64_scores(q, k, scale):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    n = s.shape[-1]
    return s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)


def table(monitor, step):
    """{(layer, head, metric): value} of one step."""
    return {(l, h, m): v for s, l, h, m, v in monitor.rows if s == step}


# ----------------------------------------------------------------------------- one home
def test_diagnostics_use_the_monitors_functions():
    for name in (
        "spectral_norm",
        "wq_head_norms",
        "causal_scores",
        "max_logit",
        "rows_rounding_to_one",
        "rows_with_tied_max",
        "delta_error",
    ):
        assert getattr(dg, name) is getattr(metrics, name), name
        assert getattr(dg, name).__module__ == "kernels.monitor.metrics", name


def test_head_readings_on_constructed_rows():
    """Head 0: every score 0 (all visible keys tied); head 1: strictly increasing."""
    n = int(np.random.randint(4, 12))
    q = torch.zeros(1, 2, n, 4)
    k = torch.zeros(1, 2, n, 4)
    q[0, 1, :, 0] = 1.0
    k[0, 1, :, 0] = torch.arange(n, dtype=torch.float32) * 4.0  # scores 0, 2, 4, ...
    r = metrics.head_readings(q, k)
    assert r["ties_bf16"] == [(n - 1) / n, 0.0] and r["p1_fa2"] == [(n - 1) / n, 0.0]
    assert r["max_logit"] == [0.0, pytest.approx(2.0 * (n - 1))]
    scale = float(np.random.uniform(0.1, 2))
    assert metrics.head_readings(q, k, scale=scale)["max_logit"][1] == pytest.approx(
        4.0 * (n - 1) * scale
    )


def test_exact_output_matches_fp64():
    q, k, v = (torch.randn(2, 3, 17, 8) for _ in range(3))
    ref = torch.softmax(fp64_scores(q, k, 8**-0.5), -1) @ v.double()
    assert torch.allclose(metrics.exact_output(q, k, v).double(), ref, atol=1e-6)


# ----------------------------------------------------------------------- finding layers
def test_finds_the_layers_of_both_models():
    mon = AttentionMonitor.attach(book_model(n_layer=3), every=10)
    assert mon.layer_names == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
    assert [layer.n_head for layer in mon.layers] == [2, 2, 2]
    mon = AttentionMonitor.attach(hf_model(), every=10)
    assert mon.layer_names == ["transformer.h.0.attn", "transformer.h.1.attn"]
    assert [layer.scale for layer in mon.layers] == [16**-0.5] * 2


def test_model_without_attention_is_refused():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(ValueError, match="found no attention layer in Sequential"):
        AttentionMonitor.attach(model)


def test_missing_layer_index_is_refused():
    for bad in (2, -1, 7):
        with pytest.raises(
            ValueError,
            match=f"layer index {bad} does not exist: the model has 2 attention layers, 0 to 1",
        ):
            AttentionMonitor.attach(book_model(), layers=[0, bad])


def test_other_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="every must be a positive"):
        AttentionMonitor.attach(book_model(), every=0)
    with pytest.raises(ValueError, match="path must end in .csv or .jsonl"):
        AttentionMonitor.attach(book_model(), path=tmp_path / "m.txt")
    module = book_model().blocks[0].attn
    del module.n_head
    with pytest.raises(ValueError, match="no head count"):
        AttentionMonitor.attach(nn.ModuleList([module]))


# -------------------------------------------------------------------------- the numbers
def test_known_answers_through_the_hooks():
    """Head 0's keys are zero (every score 0: each row with ≥ 2 visible keys is tied
    under both rules, largest logit 0); head 1's W_Q is a diagonal with a known largest
    entry."""
    model = book_model(attn="math32", n_head=2, n_embd=32)
    c = 32
    top = float(np.random.uniform(0.5, 3))
    with torch.no_grad():
        w = model.blocks[0].attn.c_attn.weight
        w[c : c + 16].zero_()  # W_K of head 0
        model.blocks[0].attn.c_attn.bias[c : c + 16].zero_()
        w[16:32].zero_()
        w[16:32, :16] = torch.diag(torch.linspace(0.1, top, 16))  # W_Q of head 1
    mon = AttentionMonitor.attach(model, every=1, layers=[0])
    mon.step(0)
    idx = torch.randint(0, 256, (3, 24))
    book_loss(model, idx)[1].backward()
    got = table(mon, 0)
    assert got[(0, 0, "ties_bf16")] == got[(0, 0, "p1_fa2")] == pytest.approx(23 / 24)
    assert got[(0, 0, "max_logit")] == 0.0
    assert got[(0, 1, "wq_norm")] == pytest.approx(top, rel=1e-6)
    assert {key[0] for key in got} == {0}  # only the layer asked for


@pytest.mark.parametrize("kind", ["book-paper-bf16", "book-qknorm", "hf"])
def test_readings_match_an_fp64_reference(kind):
    autocast = kind == "book-paper-bf16"
    if kind == "hf":
        model, loss_of = hf_model(), hf_loss
        layers = [(b.attn, 2) for b in model.transformer.h]
        idx = torch.randint(0, 64, (3, 20))
        weights = [b.attn.c_attn.weight.T for b in model.transformer.h]
    else:
        model = book_model(
            attn="paper:delta=o" if autocast else "sdpa", qk_norm=kind == "book-qknorm"
        )
        loss_of, idx = book_loss, torch.randint(0, 256, (3, 24))
        layers = [(b.attn, 2) for b in model.blocks]
        weights = [b.attn.c_attn.weight for b in model.blocks]
    mon = AttentionMonitor.attach(model, every=3, delta=True)
    ref = Reference(layers)
    mon.step(3)
    loss_of(model, idx, autocast)[1].backward()
    ref.remove()
    got = table(mon, 3)
    assert len(got) == 2 * 2 * len(METRICS)
    for i, (module, n_head) in enumerate(layers):
        q, k, v = (ref.heads(i, t) for t in ref.qkv[i].split(32, dim=-1))
        if kind == "book-qknorm":
            with torch.no_grad():
                q = module.q_norm(q.float()).double()
                k = module.k_norm(k.float()).double()
        s = fp64_scores(q, k, 16**-0.5)
        o_hp = torch.softmax(s, -1) @ v
        err = (ref.heads(i, ref.d_out[i]) * (ref.heads(i, ref.out[i]) - o_hp)).sum(-1)
        size = (ref.heads(i, ref.d_out[i]) * ref.heads(i, ref.out[i])).abs()
        size = size.sum((-1, -2))
        for h in range(n_head):
            finite = s[:, h][torch.isfinite(s[:, h])]
            assert got[(i, h, "max_logit")] == pytest.approx(float(finite.abs().max()), rel=1e-5)
            w_q = weights[i][h * 16 : (h + 1) * 16].detach().double()
            assert got[(i, h, "wq_norm")] == pytest.approx(
                float(torch.linalg.svdvals(w_q)[0]), rel=1e-9
            )
            for metric in ("ties_bf16", "p1_fa2"):
                assert 0.0 <= got[(i, h, metric)] <= 1.0
            if kind == "book-paper-bf16":  # a real δ error: it matches the fp64 one
                scale = float(err[:, h].abs().sum(-1).mean())
                assert scale > 1e-4 * float(size[:, h].mean())
                assert got[(i, h, "delta_abs")] == pytest.approx(scale, rel=1e-2)
                assert (
                    abs(got[(i, h, "delta_err")] - float(err[:, h].sum(-1).mean())) <= 1e-2 * scale
                )
            else:  # exact attention: only fp32 noise left
                assert got[(i, h, "delta_abs")] < 1e-5 * float(size[:, h].mean())


def test_tie_shares_match_a_direct_count():
    """The monitor's shares equal a row-by-row count made here from the reference q, k.
    No position embedding and 4 distinct tokens: a repeated token repeats its key, so
    layer 0 has exact ties (both rules) next to rows without."""
    model = book_model(attn="sdpa")
    with torch.no_grad():
        model.wpe.weight.zero_()
        for b in model.blocks:
            b.attn.c_attn.weight[:64] *= 3.0  # larger logits: W_Q and W_K
    mon = AttentionMonitor.attach(model, every=1)
    ref = Reference([(b.attn, 2) for b in model.blocks])
    mon.step(0)
    book_loss(model, torch.randint(0, 4, (2, 24)))[1].backward()
    got = table(mon, 0)
    for h in range(2):
        assert 0 < got[(0, h, "ties_bf16")] < 1 and 0 < got[(0, h, "p1_fa2")] < 1
    for i in range(2):
        q, k, _ = (ref.heads(i, t).float() for t in ref.qkv[i].split(32, dim=-1))
        raw = (q @ k.transpose(-1, -2)).bfloat16().float()
        s_low = (raw * 0.25).bfloat16().float()
        s32 = q @ k.transpose(-1, -2) * 0.25
        for h in range(2):
            tied = one = 0
            for b in range(2):
                for t in range(24):
                    row_low, row32 = s_low[b, h, t, : t + 1], s32[b, h, t, : t + 1]
                    tied += int((row_low == row_low.max()).sum() >= 2)
                    p_bar = torch.exp(row32 - row32.max()).bfloat16()
                    one += int((p_bar == 1.0).sum() >= 2)
            assert got[(i, h, "ties_bf16")] == tied / 48
            assert got[(i, h, "p1_fa2")] == one / 48


# ---------------------------------------------------------------------- changes nothing
@pytest.mark.parametrize("kind", ["book-paper", "book-sdpa", "hf"])
@pytest.mark.parametrize("autocast", [False, True])
def test_outputs_and_gradients_are_bit_identical(kind, autocast):
    """Six training steps, the monitor reading steps 0, 2, 4 with δ: the same logits,
    losses, gradients and (after AdamW) weights as the same model without it, bit for
    bit."""
    if kind == "hf":  # dropout on: the monitor must draw no random numbers
        plain, loss_of, vocab = hf_model(dropout=0.1), hf_loss, 64
    else:
        plain = book_model(attn="paper:delta=o" if kind == "book-paper" else "sdpa")
        loss_of, vocab = book_loss, 256
    watched = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropout warning of delta=True
        mon = AttentionMonitor.attach(watched, every=2, delta=True)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (plain, watched)]
    for step in range(6):
        idx = torch.randint(0, vocab, (3, 20))
        seed = int(torch.randint(0, 2**31, ()))
        results = []
        for model, opt, monitor in ((plain, opts[0], None), (watched, opts[1], mon)):
            if monitor is not None:
                monitor.step(step)
            torch.manual_seed(seed)
            opt.zero_grad()
            logits, loss = loss_of(model, idx, autocast)
            loss.backward()
            results.append(
                (logits.detach(), loss.detach(), [p.grad.clone() for p in model.parameters()])
            )
            opt.step()
        (la, lossa, ga), (lb, lossb, gb) = results
        assert torch.equal(la, lb) and torch.equal(lossa, lossb), step
        assert all(torch.equal(a, b) for a, b in zip(ga, gb)), step
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)
    assert sorted({row[0] for row in mon.rows}) == [0, 2, 4]
    assert {row[3] for row in mon.rows} == set(METRICS)


def test_no_hooks_between_monitoring_steps():
    model = book_model()
    mon = AttentionMonitor.attach(model, every=5, delta=True)
    count = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    assert mon.step(1) is False and count() == 0
    assert mon.step(5) is True and count() == 2 * 3  # c_attn, c_proj, the layer
    book_loss(model, torch.randint(0, 256, (2, 24)))[1].backward()
    assert count() == 0 and len(mon.rows) == 2 * 2 * len(METRICS)


# ------------------------------------------------------------------------- what is read
def test_only_the_first_training_pass_of_a_step_is_read():
    model = book_model(attn="sdpa")
    mon = AttentionMonitor.attach(model, every=1)
    mon.step(0)
    with torch.no_grad():  # an evaluation pass: not read
        model(torch.zeros(1, 24, dtype=torch.long))
    assert mon.rows == []
    first, second = torch.randint(0, 256, (2, 2, 24))
    ref = Reference([(b.attn, 2) for b in model.blocks])
    book_loss(model, first)[1].backward()  # micro-batch 1: read
    q0 = ref.qkv[0].clone()
    book_loss(model, second)[1].backward()  # micro-batch 2: not read
    ref.remove()
    got = table(mon, 0)
    q, k, _ = (ref.heads(0, t) for t in q0.split(32, dim=-1))
    s = fp64_scores(q, k, 0.25)
    assert got[(0, 0, "max_logit")] == pytest.approx(
        float(s[:, 0][s[:, 0].isfinite()].abs().max()), rel=1e-5
    )


def test_armed_step_without_a_pass_warns():
    model = book_model()
    mon = AttentionMonitor.attach(model, every=1)
    mon.step(0)
    with pytest.warns(RuntimeWarning, match="step 0 was armed but no training forward"):
        mon.step(1)


def test_step_counter_and_every():
    model = book_model(attn="sdpa")
    mon = AttentionMonitor.attach(model, every=3)
    read = []
    for _ in range(7):
        read.append(mon.step())
        book_loss(model, torch.randint(0, 256, (1, 24)))[1].backward()
    mon.close()
    assert read == [True, False, False, True, False, False, True]
    assert sorted({row[0] for row in mon.rows}) == [0, 3, 6]


def test_sequences_limits_what_is_read():
    """sequences=1 reads the first sequence of the batch only: its largest logit and δ
    error are those of that sequence (fp64 reference), not of the whole batch."""
    model = book_model(attn="paper:delta=o")
    mon = AttentionMonitor.attach(model, every=1, delta=True, sequences=1)
    ref = Reference([(b.attn, 2) for b in model.blocks])
    mon.step(0)
    book_loss(model, torch.randint(0, 256, (4, 24)))[1].backward()
    ref.remove()
    got = table(mon, 0)
    for i in range(2):
        q, k, v = (ref.heads(i, t)[:1] for t in ref.qkv[i].split(32, dim=-1))
        s = fp64_scores(q, k, 0.25)
        err = (
            ref.heads(i, ref.d_out[i])[:1]
            * (ref.heads(i, ref.out[i])[:1] - torch.softmax(s, -1) @ v)
        ).sum(-1)
        for h in range(2):
            assert got[(i, h, "max_logit")] == pytest.approx(
                float(s[0, h][s[0, h].isfinite()].abs().max()), rel=1e-5
            )
            assert got[(i, h, "delta_abs")] == pytest.approx(float(err[0, h].abs().sum()), rel=1e-2)


# ---------------------------------------------------------------------- where it writes
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_files_hold_every_row(tmp_path, suffix):
    path = tmp_path / "sub" / f"monitor{suffix}"
    model = book_model()
    with AttentionMonitor.attach(model, every=2, path=path, delta=True) as mon:
        for step in range(5):
            mon.step(step)
            book_loss(model, torch.randint(0, 256, (2, 24)))[1].backward()
    rows = read_rows(path)
    assert list(rows.columns) == list(COLUMNS)
    assert len(rows) == 3 * 2 * 2 * len(METRICS) == len(mon.rows)
    assert [tuple(r) for r in rows.itertuples(index=False)] == mon.rows  # all digits
    if suffix == ".csv":
        assert path.read_text().splitlines()[0] == ",".join(COLUMNS)


def test_append_continues_a_file(tmp_path):
    path = tmp_path / "m.csv"
    model = book_model(attn="sdpa")
    for start, append in ((0, False), (10, True)):
        with AttentionMonitor.attach(model, every=1, path=path, append=append) as mon:
            mon.step(start)
            book_loss(model, torch.randint(0, 256, (1, 24)))[1].backward()
    rows = read_rows(path)
    assert sorted(set(rows.step)) == [0, 10]
    assert path.read_text().count("step,layer") == 1


def test_tensorboard_missing_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(
        ImportError, match="needs the 'tensorboard' package.*pip install tensorboard"
    ):
        AttentionMonitor.attach(book_model(), tensorboard=tmp_path / "tb")


def test_tensorboard_gets_every_row(tmp_path, monkeypatch):
    written = []

    class FakeWriter:
        def __init__(self, log_dir):
            written.append(("dir", log_dir))

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def flush(self):
            pass

        def close(self):
            written.append(("closed",))

    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    model = book_model(attn="sdpa")
    mon = AttentionMonitor.attach(model, every=1, tensorboard=tmp_path / "tb")
    mon.step(7)
    book_loss(model, torch.randint(0, 256, (1, 24)))[1].backward()
    mon.close()
    assert written[0] == ("dir", str(tmp_path / "tb")) and written[-1] == ("closed",)
    scalars = {tag: (value, step) for tag, value, step in written[1:-1]}
    assert len(scalars) == 2 * 2 * len(FORWARD_METRICS)
    assert scalars["wq_norm/layer1/head0"] == (table(mon, 7)[(1, 0, "wq_norm")], 7)


# ------------------------------------------------------------------------- DDP, compile
def test_only_rank_zero_writes(tmp_path, monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    model = book_model(attn="sdpa")
    with AttentionMonitor.attach(model, every=1, path=tmp_path / "m.csv") as mon:
        assert mon.step(0) is False
        book_loss(model, torch.randint(0, 256, (1, 24)))[1].backward()
    assert mon.rows == [] and not (tmp_path / "m.csv").exists()
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    with AttentionMonitor.attach(model, every=1, path=tmp_path / "m.csv") as mon:
        assert mon.step(0) is True
        book_loss(model, torch.randint(0, 256, (1, 24)))[1].backward()
    assert len(read_rows(tmp_path / "m.csv")) == 2 * 2 * len(FORWARD_METRICS)


DDP_SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import kernels
from kernels.gpt2 import GPT, GPTConfig
from kernels.monitor import METRICS, AttentionMonitor, read_rows

folder = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=0, world_size=1)
try:
    config = GPTConfig(block_size=24, n_layer=2, n_head=2, n_embd=32, attn="sdpa")
    model = DDP(GPT(config))
    with AttentionMonitor.attach(model, every=1, path=f"{folder}/m.csv", delta=True) as mon:
        assert mon.layer_names == ["module.blocks.0.attn", "module.blocks.1.attn"], mon.layer_names
        mon.step(0)
        logits, _ = model(torch.randint(0, 256, (2, 24)))
        logits.float().pow(2).mean().backward()
    print("rows", len(read_rows(f"{folder}/m.csv")), "metrics", len(METRICS))
finally:
    dist.destroy_process_group()
"""


def test_ddp_gloo_single_process(tmp_path):
    """The monitor under DistributedDataParallel (gloo, one rank), in a process of its own: a
    process group in the test runner's process once waited forever after a thousand other
    tests, and a fresh process is how DDP runs anyway."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", DDP_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"rows {2 * 2 * len(METRICS)} metrics {len(METRICS)}" in done.stdout, done.stdout


def test_torch_compile_disables_the_monitor(tmp_path):
    model = book_model(attn="sdpa")
    compiled = torch.compile(model, backend="eager")
    with pytest.warns(UserWarning, match="disables itself: the model is compiled"):
        mon = AttentionMonitor.attach(compiled, every=1, path=tmp_path / "m.csv")
    assert mon.enabled is False and mon.step(0) is False
    book_loss(compiled, torch.randint(0, 256, (1, 24)))[1].backward()
    mon.close()
    assert mon.rows == [] and not (tmp_path / "m.csv").exists()
    # compiled in place after the monitor was attached: the next step says so and stops
    model = book_model(attn="sdpa")
    mon = AttentionMonitor.attach(model, every=1)
    model.compile(backend="eager")
    with pytest.warns(UserWarning, match="compiled with torch.compile after the"):
        assert mon.step(0) is False
    assert mon.enabled is False


def test_delta_with_attention_dropout_warns():
    dropping, plain = hf_model(dropout=0.1), hf_model(dropout=0.0)
    with pytest.warns(UserWarning, match="attention dropout \\(p = 0.1\\)"):
        AttentionMonitor.attach(dropping, delta=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AttentionMonitor.attach(dropping, delta=False)
        AttentionMonitor.attach(plain, delta=True)


# ----------------------------------------------------------------------------- readings
def test_time_steps_reports_medians():
    model = book_model(attn="sdpa")
    idx = torch.randint(0, 256, (2, 24))
    mon = AttentionMonitor.attach(model, every=10)
    out = time_steps(model, lambda: book_loss(model, idx)[1], mon, repeats=3, warmup=0)
    assert set(out) == {"off", "between", "reading", "call", "paired"}
    assert out["call"]["median"] < out["off"]["median"]
    assert all(out[k]["median"] > 0 and out[k]["iqr"] >= 0 for k in ("off", "between", "reading"))
    assert sorted({row[0] for row in mon.rows}) == [10, 20, 30]  # calls read nothing
    with pytest.raises(ValueError, match="every=1"):
        time_steps(model, lambda: book_loss(model, idx)[1], AttentionMonitor.attach(model, every=1))


def test_time_steps_synchronises_around_every_pass():
    """sync (torch.cuda.synchronize on a GPU) runs before the clock starts and before it
    stops: twice per timed pass, three passes per round."""
    model = book_model(attn="sdpa")
    idx = torch.randint(0, 256, (2, 24))
    calls = []
    repeats, warmup = int(np.random.randint(3, 5)), int(np.random.randint(0, 2))
    time_steps(
        model,
        lambda: book_loss(model, idx)[1],
        AttentionMonitor.attach(model, every=10),
        repeats=repeats,
        warmup=warmup,
        sync=lambda: calls.append(1),
    )
    assert len(calls) == 2 * 3 * (repeats + warmup)


def test_ceiling_and_lead():
    steps = np.arange(0, 1000, 100)
    level = float(np.random.uniform(1, 5))
    healthy = [(steps, np.full(10, level)), (steps, np.r_[np.full(9, level / 2), np.nan])]
    rising = level * 2.0 ** (steps / 300)  # passes the level after step 0
    never = np.full(10, level * 0.9)
    out = ceiling_and_lead(healthy, [(steps, rising, 700), (steps, never, 500)])
    assert out["ceiling"] == level and out["crossed"] == 1 and out["failing"] == 2
    assert out["leads"] == [600] and out["lead_min"] == out["lead_max"] == 600
    with pytest.raises(ValueError, match="no finite value"):
        ceiling_and_lead([(steps, np.full(10, np.nan))], [])


def test_layer_table_combines_heads():
    model = book_model(attn="paper:delta=o")
    mon = AttentionMonitor.attach(model, every=1, delta=True)
    mon.step(4)
    book_loss(model, torch.randint(0, 256, (2, 24)))[1].backward()
    got, per_layer = table(mon, 4), layer_table(mon)
    assert list(per_layer.index) == [(4, 0), (4, 1)]
    for layer in range(2):
        row = per_layer.loc[(4, layer)]
        heads = {m: [got[(layer, h, m)] for h in range(2)] for m in METRICS}
        assert row.ties_bf16 == pytest.approx(np.mean(heads["ties_bf16"]))
        assert row.wq_norm == max(heads["wq_norm"])
        assert row.max_logit == max(heads["max_logit"])
        assert row.delta_err == pytest.approx(sum(heads["delta_err"]))


@pytest.mark.parametrize("implementation", [None, "eager"])
def test_hugging_face_gpt2_as_configured_by_default(implementation):
    """The model exactly as a reader builds it (default dropout 0.1, SDPA or eager
    attention): found, read against fp64, and its gradients unchanged by the monitor."""
    from transformers import GPT2Config, GPT2LMHeadModel

    extra = {} if implementation is None else {"attn_implementation": implementation}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # token ids outside the tiny vocabulary
        plain = GPT2LMHeadModel(
            GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=64, **extra)
        )
    watched = copy.deepcopy(plain)
    mon = AttentionMonitor.attach(watched, every=1)
    ref = Reference([(b.attn, 2) for b in watched.transformer.h])
    idx = torch.randint(0, 64, (2, 30))
    grads = []
    for model in (plain, watched):
        if model is watched:
            mon.step(0)
        torch.manual_seed(1)  # the same dropout masks
        model(idx, labels=idx).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    got = table(mon, 0)
    assert len(got) == 2 * 2 * len(FORWARD_METRICS)
    for i in range(2):
        q, k, _ = (ref.heads(i, t) for t in ref.qkv[i].split(32, dim=-1))
        s = fp64_scores(q, k, 16**-0.5)
        for h in range(2):
            assert got[(i, h, "max_logit")] == pytest.approx(
                float(s[:, h][s[:, h].isfinite()].abs().max()), rel=1e-5
            )
