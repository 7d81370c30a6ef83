"""The monitor as a practitioner uses it (issue 27): each test here failed before its fix.
detach() and sinks that never start a file over; attention layouts the monitor does not
know refused, GPTBigCode read right; a SummaryWriter or any callable as a sink; compile
after attach caught with one warning; step() idempotent within a step; a warning when a
padding mask is seen. CPU only, tiny models, fresh random inputs each run."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import kernels  # noqa: F401  (sets the Triton interpreter switch first)
from kernels.gpt2 import GPT, GPTConfig
from kernels.monitor import AttentionMonitor, layer_table, read_rows
from kernels.monitor.sinks import FileSink

FORWARD = ("ties_bf16", "p1_fa2", "wq_norm", "max_logit")


def book_model(n_layer=2, attn="sdpa"):
    return GPT(GPTConfig(block_size=24, n_layer=n_layer, n_head=2, n_embd=32, attn=attn))


def train_pass(model, batch=2):
    idx = torch.randint(0, 256, (batch, 24))
    model(idx, idx.roll(-1, 1))[1].backward()
    return idx


def fp64_max_logit(q, k, scale):
    s = q.double() @ k.double().transpose(-1, -2) * scale
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return [float(s[:, h][s[:, h].isfinite()].abs().max()) for h in range(s.shape[1])]


# ---------------------------------------------------------------------- detach, files
def test_close_detaches_and_later_steps_are_refused(tmp_path):
    path = tmp_path / "m.csv"
    model = book_model()
    mon = AttentionMonitor.attach(model, every=1, path=path)
    steps = int(np.random.randint(2, 5))
    for step in range(steps):
        mon.step(step)
        train_pass(model)
    mon.close()
    rows = len(read_rows(path))
    assert rows == steps * 2 * 2 * len(FORWARD) == len(mon.rows)
    with pytest.raises(RuntimeError, match="detached.*attach a new monitor"):
        mon.step(steps)
    train_pass(model)
    assert len(read_rows(path)) == rows  # the file kept every row
    assert all(len(m._forward_hooks) + len(m._forward_pre_hooks) == 0 for m in model.modules())


def test_detach_leaves_no_hook_on_an_armed_step():
    model = book_model()
    mon = AttentionMonitor.attach(model, every=1)
    assert mon.step(0) is True
    assert sum(len(m._forward_hooks) for m in model.modules()) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the step armed but never run
        mon.detach()
    assert all(len(m._forward_hooks) + len(m._forward_pre_hooks) == 0 for m in model.modules())
    assert mon.detached and not mon.enabled


def test_a_closed_file_sink_refuses_to_start_over(tmp_path):
    path = tmp_path / "m.csv"
    sink = FileSink(path)
    n = int(np.random.randint(2, 9))
    sink.write([(s, 0, 0, "max_logit", float(s)) for s in range(n)])
    sink.close()
    with pytest.raises(RuntimeError, match="was closed.*append=True"):
        sink.write([(n, 0, 0, "max_logit", 1.0)])
    assert len(read_rows(path)) == n


# ------------------------------------------------------------------------- layouts
class Unknown(nn.Module):
    """c_attn and c_proj with nanoGPT's shapes, in a class the monitor does not know."""

    def __init__(self, c=32, n_head=2):
        super().__init__()
        self.n_head = n_head
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)


def test_unknown_layout_is_refused_naming_the_module():
    model = nn.ModuleDict({"block": nn.ModuleDict({"mixer": Unknown()})})
    with pytest.raises(ValueError, match="layer 'block.mixer' is a Unknown.*layout='qkv'"):
        AttentionMonitor.attach(model)
    assert AttentionMonitor.attach(model, layout="qkv").layers[0].layout == "qkv"
    with pytest.raises(ValueError, match="layout must be one of"):
        AttentionMonitor.attach(model, layout="kqv")


def bigcode(multi_query):
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM

    cfg = GPTBigCodeConfig(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=64,
        multi_query=multi_query,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    return GPTBigCodeForCausalLM(cfg)


@pytest.mark.parametrize("multi_query", [False, True])
def test_gptbigcode_is_read_in_its_own_layout(multi_query):
    """The largest logit and ‖W_Q‖ of each head against q and k cut from c_attn's output
    exactly as GPTBigCodeAttention cuts them (per head [q; k; v], or one k/v head)."""
    model = bigcode(multi_query)
    with torch.no_grad():
        for block in model.transformer.h:  # larger logits than at init
            block.attn.c_attn.weight.mul_(float(np.random.uniform(4, 8)))
    got_qkv = {}
    for i, block in enumerate(model.transformer.h):
        block.attn.c_attn.register_forward_hook(
            lambda m, inp, out, i=i: got_qkv.__setitem__(i, out.detach().clone())
        )
    mon = AttentionMonitor.attach(model, every=1)
    assert [layer.layout for layer in mon.layers] == ["mqa" if multi_query else "per_head"] * 2
    mon.step(0)
    idx = torch.randint(0, 64, (2, 20))
    model(idx, labels=idx).loss.backward()
    got = {(l, h, m): v for s, l, h, m, v in mon.rows}
    for i, block in enumerate(model.transformer.h):
        qkv, d = got_qkv[i], 16
        b, n, _ = qkv.shape
        w = block.attn.c_attn.weight.detach().double()
        if multi_query:
            q, k, _ = qkv.split((32, d, d), dim=-1)
            q = q.reshape(b, n, 2, d).transpose(1, 2)
            k = k.reshape(b, n, 1, d).transpose(1, 2).expand(b, 2, n, d)
            rows = [w[h * d : (h + 1) * d] for h in range(2)]
        else:
            q, k, _ = qkv.view(b, n, 2, 3 * d).transpose(1, 2).split(d, dim=-1)
            rows = [w[h * 3 * d : h * 3 * d + d] for h in range(2)]
        want = fp64_max_logit(q, k, block.attn.scaling)
        for h in range(2):
            assert got[(i, h, "max_logit")] == pytest.approx(want[h], rel=1e-5)
            assert got[(i, h, "wq_norm")] == pytest.approx(
                float(torch.linalg.svdvals(rows[h])[0]), rel=1e-9
            )


def test_grouped_query_heads_are_refused():
    module = book_model().blocks[0].attn
    module.num_key_value_heads = 1
    with pytest.raises(ValueError, match="num_key_value_heads = 1.*grouped-query"):
        AttentionMonitor.attach(nn.ModuleList([module]))


# --------------------------------------------------------------------------- sinks
class FakeWriter:
    """What the monitor may use of torch's SummaryWriter."""

    def __init__(self):
        self.scalars, self.closed, self.flushed = [], False, 0

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        self.flushed += 1

    def close(self):
        self.closed = True


@pytest.mark.parametrize("option", ["tensorboard", "path"])
def test_a_summary_writer_is_written_to_not_taken_for_a_path(tmp_path, monkeypatch, option):
    monkeypatch.chdir(tmp_path)
    writer = FakeWriter()
    model = book_model()
    mon = AttentionMonitor.attach(model, every=1, **{option: writer})
    step = int(np.random.randint(1, 1000))
    mon.step(step)
    train_pass(model)
    mon.close()
    assert list(tmp_path.iterdir()) == []  # no folder named after a repr
    assert len(writer.scalars) == 2 * 2 * len(FORWARD) and writer.flushed >= 1
    assert {s for _, _, s in writer.scalars} == {step}
    assert not writer.closed  # the reader's writer stays open


def test_any_callable_is_a_sink():
    seen = []
    model = book_model()
    mon = AttentionMonitor.attach(model, every=2, sink=seen.append)
    for step in range(4):
        mon.step(step)
        train_pass(model)
    mon.close()
    assert [len(rows) for rows in seen] == [2 * 2 * len(FORWARD)] * 2
    assert [row for rows in seen for row in rows] == mon.rows
    with pytest.raises(TypeError, match="tensorboard= takes a file path.*got int"):
        AttentionMonitor.attach(model, tensorboard=3)


# -------------------------------------------------------------------------- compile
def _compile_run(make):
    """Attach, compile as ``make`` says, train four steps; the warnings raised."""
    model = book_model(n_layer=2)
    mon = AttentionMonitor.attach(model, every=1)
    run = make(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            mon.step(step)
            idx = torch.randint(0, 256, (2, 24))
            run(idx, idx)[1].backward()
        mon.close()
    return mon, [str(w.message) for w in caught]


def whole(model):
    return torch.compile(model, backend="eager")


def whole_fullgraph(model):
    return torch.compile(model, backend="eager", fullgraph=True)


def per_block(model):
    for i, block in enumerate(model.blocks):
        model.blocks[i] = torch.compile(block, backend="eager")
    return model


@pytest.mark.parametrize(
    "make", [whole, whole_fullgraph, per_block], ids=["whole model", "fullgraph", "per block"]
)
def test_compile_after_attach_switches_the_monitor_off_once(make):
    torch._dynamo.reset()
    mon, messages = _compile_run(make)
    assert mon.enabled is False and mon.rows == []
    off = [m for m in messages if "disables itself" in m]
    assert len(off) == 1 and "after the monitor was attached" in off[0]
    assert not [m for m in messages if "armed but no training" in m]


# ------------------------------------------------------------------ once per step
def test_step_is_idempotent_within_a_step():
    """Lightning calls back once per micro-batch: step(s) repeated within step s reads
    the first micro-batch once, and writes no duplicate row."""
    model = book_model()
    mon = AttentionMonitor.attach(model, every=2)
    micro = int(np.random.randint(2, 4))
    read = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(4):
            for _ in range(micro):
                read.append(mon.step(step))
                train_pass(model)
    mon.close()
    assert read == [True] * micro + [False] * micro + [True] * micro + [False] * micro
    assert len(mon.rows) == 2 * 2 * 2 * len(FORWARD)
    assert len({row[:4] for row in mon.rows}) == len(mon.rows)


def test_layer_table_warns_about_repeated_rows():
    rows = [(0, 0, 0, "max_logit", 1.0), (0, 0, 0, "max_logit", 3.0)]
    with pytest.warns(UserWarning, match="repeat a \\(step, layer, head, metric\\)"):
        table = layer_table(rows)
    assert table.loc[(0, 0)].max_logit == 3.0


# -------------------------------------------------------------------------- padding
def hf_gpt2(implementation):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=32,
            vocab_size=64,
            n_positions=64,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_implementation=implementation,
        )
    )


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_mask_warns_once(implementation):
    model = hf_gpt2(implementation)
    mon = AttentionMonitor.attach(model, every=1)
    idx = torch.randint(0, 64, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no padding: no warning
        mon.step(0)
        model(idx, attention_mask=torch.ones_like(idx), labels=idx).loss.backward()
    mask = torch.ones_like(idx)
    mask[1, int(np.random.randint(8, 16)) :] = 0  # right padding
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):
            mon.step(step)
            model(idx, attention_mask=mask, labels=idx).loss.backward()
    padding = [w for w in caught if "padding" in str(w.message)]
    assert len(padding) == 1 and "transformer.h.0.attn" in str(padding[0].message)
    assert sorted({row[0] for row in mon.rows}) == [0, 1, 2]
