"""The monitor and the fix where practitioners train: a Hugging Face Trainer and a
Lightning Trainer with the monitor's callbacks (short CPU runs), and the book's attention
with δ from rowsum(dP∘P) registered with transformers and as nanoGPT's SDPA call. The
Triton interpreter is slow: tiny models (width 32, 2 heads of 16, 16 tokens)."""

import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels  # noqa: F401
from kernels.attention import hf_attention
from kernels.gpt2 import GPT, GPTConfig
from kernels.monitor import callbacks

TINY = dict(
    n_layer=2,
    n_head=2,
    n_embd=32,
    vocab_size=64,
    n_positions=32,
    attn_pdrop=0.0,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    bos_token_id=0,
    eos_token_id=0,
)


def hf_gpt2(implementation, **extra):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(**{**TINY, **extra}, attn_implementation=implementation))


# ---------------------------------------------------------------- the fix, registered
def test_registered_attention_trains_a_stock_gpt2_like_sdpa(monkeypatch):
    """fp32: the same loss and gradients as SDPA to rounding, three SGD steps apart
    by rounding only (AdamW's first step would move a weight whose gradient is ~0 by ±lr,
    the sign of a rounding error); every attention call goes through flash_attention with δ
    from dP∘P (a spy on the call counts them)."""
    name = hf_attention.register()
    calls = []
    real = hf_attention.flash_attention
    monkeypatch.setattr(
        hf_attention,
        "flash_attention",
        lambda q, k, v, opts: calls.append(opts) or real(q, k, v, opts),
    )
    torch.manual_seed(int(np.random.randint(0, 2**31)))
    ref = hf_gpt2("sdpa")
    fix = hf_gpt2(name)
    fix.load_state_dict(ref.state_dict())
    assert fix.config._attn_implementation == name
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, fix)]
    for step in range(3):
        idx = torch.randint(0, 64, (2, 16))
        losses, grads = [], []
        for model, opt in zip((ref, fix), opts):
            opt.zero_grad()
            loss = model(idx, labels=idx).loss
            loss.backward()
            losses.append(float(loss))
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
        assert losses[1] == pytest.approx(losses[0], rel=1e-5), step
        for a, b in zip(*grads):
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-6), step
    assert len(calls) == 3 * 2
    assert all(o.delta_source == "dp" and o.causal and o.scale == 16**-0.5 for o in calls)


def test_registered_attention_under_bf16_autocast():
    """Under BF16 autocast the kernels run in bf16: the loss is within bf16 rounding of
    SDPA's, and every gradient is finite."""
    name = hf_attention.register()
    ref, fix = hf_gpt2("sdpa"), hf_gpt2(name)
    fix.load_state_dict(ref.state_dict())
    idx = torch.randint(0, 64, (2, 16))
    losses = []
    for model in (ref, fix):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(idx, labels=idx).loss
        loss.backward()
        losses.append(float(loss))
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
    assert all(torch.isfinite(p.grad).all() for p in fix.parameters())


def test_registered_attention_refuses_what_it_cannot_do():
    name = hf_attention.register()
    idx = torch.randint(0, 64, (2, 16))
    mask = torch.ones_like(idx)
    mask[0, int(np.random.randint(4, 16)) :] = 0
    with pytest.raises(ValueError, match="attention mask with padding"):
        hf_gpt2(name)(idx, attention_mask=mask, labels=idx)
    dropping = hf_gpt2(name, attn_pdrop=0.1)
    with pytest.raises(ValueError, match="no attention dropout, got p = 0.1.*attn_pdrop=0"):
        dropping(idx, labels=idx)
    with pytest.raises(ValueError, match="head_dim 8 is not supported"):
        hf_gpt2(name, n_head=4)(idx, labels=idx)


def test_plain_causal_attention_gets_no_mask_and_compiles_without_graph_breaks():
    """A mask tensor under torch.compile would make the padding check a host sync: a graph
    break per layer. The registered mask function hands over no mask for plain causal
    attention even where SDPA's would build one (``allow_is_causal_skip=False``, as some
    transformers versions do while compiling), and still builds one for padding."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    n = int(np.random.randint(4, 32))
    plain = dict(batch_size=2, q_length=n, kv_length=n, mask_function=causal_mask_function)
    assert sdpa_mask(**plain, allow_is_causal_skip=False) is not None
    assert hf_attention.causal_or_sdpa_mask(**plain, allow_is_causal_skip=False) is None
    padding = torch.ones(2, n, dtype=torch.bool)
    padding[1, int(np.random.randint(1, n)) :] = False
    built = hf_attention.causal_or_sdpa_mask(**plain, attention_mask=padding)
    assert built is not None and not bool(built[1, 0, -1, -1])

    name = hf_attention.register()
    idx = torch.randint(0, 64, (2, 16))
    breaks = {}
    for implementation in ("sdpa", name):
        torch._dynamo.reset()
        model = hf_gpt2(implementation).transformer
        breaks[implementation] = torch._dynamo.explain(model)(idx).graph_break_count
    assert breaks[name] <= breaks["sdpa"], breaks


class NanoAttention(nn.Module):
    """nanoGPT's CausalSelfAttention, its SDPA call made switchable."""

    def __init__(self, attend, c=32, n_head=2):
        super().__init__()
        self.n_head, self.attend = n_head, attend
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x):
        b, n, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (t.view(b, n, self.n_head, c // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = self.attend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, n, c))


def test_nanogpt_drop_in():
    ref = NanoAttention(F.scaled_dot_product_attention)
    fix = NanoAttention(hf_attention.scaled_dot_product_attention)
    fix.load_state_dict(ref.state_dict())
    x = torch.randn(2, 16, 32)
    outs = [m(x) for m in (ref, fix)]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    grads = []
    for m, out in zip((ref, fix), outs):
        out.pow(2).sum().backward()
        grads.append(m.c_attn.weight.grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-3, atol=1e-5)
    q = torch.randn(1, 2, 16, 16)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        hf_attention.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(16, 16))
    with pytest.raises(ValueError, match="no dropout, got dropout_p=0.1"):
        hf_attention.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="grouped-query"):
        hf_attention.scaled_dot_product_attention(q, q[:, :1], q[:, :1])


# ------------------------------------------------------------------------ callbacks
class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, vocab=64, length=16):
        self.data = torch.randint(0, vocab, (n, length))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def test_hugging_face_trainer_callback(tmp_path):
    """Six optimizer steps of two micro-batches each, reading every 2: steps 0, 2, 4
    read once each, the file written, the monitor detached at the end."""
    from transformers import Trainer, TrainingArguments

    model = hf_gpt2("sdpa")
    callback = callbacks.MonitorTrainerCallback(every=2, path=tmp_path / "m.csv")
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=Tokens(24), callbacks=[callback]).train()
    mon = callback.monitor
    assert mon.detached and mon.layer_names == ["transformer.h.0.attn", "transformer.h.1.attn"]
    keys = [row[:4] for row in mon.rows]
    assert sorted({k[0] for k in keys}) == [0, 2, 4] and len(set(keys)) == len(keys)
    assert len(keys) == 3 * 2 * 2 * 4
    from kernels.monitor import read_rows

    assert len(read_rows(tmp_path / "m.csv")) == len(keys)


class LitGPT:
    """A LightningModule around the book's GPT-2, made on the installed Lightning."""

    @staticmethod
    def make(base):
        class Module(base):
            def __init__(self):
                super().__init__()
                self.model = GPT(
                    GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, attn="sdpa")
                )

            def training_step(self, batch, batch_idx):
                idx = batch["input_ids"]
                return self.model(idx, idx.roll(-1, 1))[1]

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters(), lr=1e-3)

        return Module()


def test_lightning_callback(tmp_path):
    """As the Hugging Face test, in Lightning: its on_train_batch_start runs once per
    micro-batch, with the same global_step for both micro-batches of a step."""
    import pytorch_lightning as pl  # pinned in requirements.txt

    cls = callbacks.lightning_callback_class("pytorch_lightning")
    assert issubclass(cls, pl.Callback)
    callback = cls(every=2, path=tmp_path / "m.jsonl")
    trainer = pl.Trainer(
        max_steps=6,
        accumulate_grad_batches=2,
        accelerator="cpu",
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    loader = torch.utils.data.DataLoader(Tokens(24, vocab=256), batch_size=2)
    trainer.fit(LitGPT.make(pl.LightningModule), loader)
    mon = callback.monitor
    assert mon is not None and mon.detached
    keys = [row[:4] for row in mon.rows]
    assert sorted({k[0] for k in keys}) == [0, 2, 4] and len(set(keys)) == len(keys)
    assert mon.layer_names == ["model.blocks.0.attn", "model.blocks.1.attn"]


def test_callbacks_without_the_packages(monkeypatch):
    callbacks._BUILT.clear()
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match="needs Lightning.*pip install lightning"):
        _ = callbacks.MonitorLightningCallback
    with pytest.raises(ValueError, match="package must be"):
        callbacks.lightning_callback_class("keras")
    callbacks._BUILT.clear()


def test_the_package_imports_neither_lightning_nor_transformers():
    """kernels.monitor (and its callbacks module) work without Lightning: nothing imports
    it, or transformers, until a callback or the registration is asked for."""
    import subprocess

    from kernels.env import REPO_ROOT

    code = (
        "import sys, kernels.monitor, kernels.monitor.callbacks; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"
