"""Tests of the chapter-6 GPT-2 package (CPU, small sizes, fresh random inputs each run)."""

import math

import numpy as np
import pytest
import torch

import kernels  # noqa: F401  (sets the Triton interpreter switch first)
from kernels.attention import AttentionOptions
from kernels.attention.options import DELTA_SOURCES, STABLE_OFF_ON
from kernels.gpt2 import (
    GPT,
    PLANS,
    BatchOrder,
    EmulatedAttention,
    GPTConfig,
    TrainConfig,
    Trainer,
    attend,
    data as gdata,
    diagnostics as dg,
    exact_attention,
    load_corpus,
    lr_at,
    parse_spec,
)
from kernels.interpreter import interpreting


def paper_opts(delta, stable):
    """The GPT-2 chapter's untiled causal attention in the paper's numerics (one tile holds
    every key of these short test sequences)."""
    return AttentionOptions(
        causal=True, numerics="paper", delta_source=delta, stable=stable, block_n=4096
    )


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("stdlib", max_bytes=300_000)


def _qkv(b=2, h=3, n=24, d=16, dtype=torch.float64):
    return [torch.randn(b, h, n, d, dtype=dtype, requires_grad=True) for _ in range(3)]


# ----------------------------------------------------------------------------- model
def test_model_forward_backward_shapes():
    cfg = GPTConfig(
        block_size=16, n_layer=2, n_head=2, n_embd=32, attn="paper", layer_attn={1: "sdpa"}
    )
    model = GPT(cfg)
    idx = torch.randint(0, 256, (3, 16))
    logits, loss = model(idx, torch.randint(0, 256, (3, 16)))
    assert logits.shape == (3, 16, 256) and loss.ndim == 0 and math.isfinite(loss.item())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape and torch.isfinite(p.grad).all(), name
    assert (
        str(model.blocks[0].attn.spec).startswith("paper")
        and str(model.blocks[1].attn.spec) == "sdpa"
    )


def test_model_rejects_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="layer_attn"):
        GPTConfig(n_layer=2, layer_attn={5: "paper"})
    with pytest.raises(ValueError, match="longer than the context"):
        GPT(GPTConfig(block_size=8, n_layer=1, n_head=1, n_embd=8))(
            torch.zeros(1, 9, dtype=torch.long)
        )


def test_parse_spec():
    spec = parse_spec("paper:delta=o_fp32,stable=cross,beta=4")
    assert (spec.kind, spec.delta, spec.stable, spec.beta) == ("paper", "o_fp32", "cross", 4.0)
    assert parse_spec("paper:obits=3").obits == 3 and str(parse_spec("paper:obits=3")).endswith(
        "obits=3"
    )
    assert "obits" not in str(parse_spec("paper"))
    assert parse_spec("paper:obits=3,oround=sr").oround == "sr"
    for bad in (
        "flash",
        "paper:delta=x",
        "paper:stable=always",
        "paper:foo=1",
        "paper:beta",
        "paper:obits=0",
        "paper:obits=8",
        "triton:obits=3",
        "paper:oround=sr",
        "paper:obits=3,oround=up",
    ):
        with pytest.raises(ValueError):
            parse_spec(bad)
    with pytest.raises(TypeError):
        parse_spec(3)


# ----------------------------------------------------------------------------- attention
def test_attention_variants_agree_in_fp32():
    q, k, v = (t.detach().float() for t in _qkv())
    ref = exact_attention(q.double(), k.double(), v.double())
    for kind in ("sdpa", "math32"):
        out = attend(q, k, v, parse_spec(kind))
        assert torch.allclose(out.double(), ref, atol=1e-5, rtol=1e-5), kind
    # the paper's path holds S, P̄, Ō, ℓ in bf16: agreement to bf16 precision (inputs rounded first)
    qb, kb, vb = (t.bfloat16().float() for t in (q, k, v))
    ref_b = exact_attention(qb.double(), kb.double(), vb.double())
    for spec in ("paper", "paper:stable=cross", "paper:block=8"):
        out = attend(qb, kb, vb, parse_spec(spec)).double()
        err = (out - ref_b).abs().max() / ref_b.abs().max()
        assert err < 3e-2, (spec, float(err))


def test_triton_kind_matches_reference():
    """The book's Triton FA2 plugged in as a layer (interpreter on the CPU, native on a GPU)."""
    device = "cpu" if interpreting() else "cuda"
    q, k, v = (t.detach().float().to(device).requires_grad_() for t in _qkv(b=1, h=2, n=32, d=16))
    d_out = torch.randn(q.shape, device=device)
    ref = exact_attention(q.double(), k.double(), v.double())
    grads_ref = torch.autograd.grad(ref, (q, k, v), d_out.double())
    out = attend(q, k, v, parse_spec("triton:delta=dp"))
    assert torch.allclose(out.double(), ref, atol=1e-4)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), d_out), grads_ref):
        assert torch.allclose(g.double(), r.double(), atol=1e-3)


def test_models_with_different_attention_agree():
    cfg = dict(block_size=16, n_layer=2, n_head=2, n_embd=32)
    a, b = GPT(GPTConfig(**cfg, attn="sdpa")), GPT(GPTConfig(**cfg, attn="math32"))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 256, (2, 16))
    assert torch.allclose(a(idx)[0], b(idx)[0], atol=1e-4)


@pytest.mark.parametrize("delta", DELTA_SOURCES)
@pytest.mark.parametrize("stable", STABLE_OFF_ON)
def test_paper_function_gradients_match_fp64_autograd(delta, stable):
    """In fp64 nothing is rounded, so Algorithm 2 must reproduce autograd of softmax attention."""
    q, k, v = _qkv()
    d_out = torch.randn(q.shape, dtype=torch.float64)
    ref = exact_attention(q, k, v)
    grads_ref = torch.autograd.grad(ref, (q, k, v), d_out)
    out = EmulatedAttention.apply(q, k, v, paper_opts(delta, stable))
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    assert torch.allclose(out, ref, atol=1e-12)
    for g, r, name in zip(grads, grads_ref, "qkv"):
        assert torch.allclose(g, r, atol=1e-10, rtol=1e-8), f"d{name} with delta={delta}"


def test_paper_function_bf16_gradients_close_to_fp64():
    q, k, v = (t.detach().bfloat16().float().requires_grad_() for t in _qkv())
    d_out = torch.randn(q.shape).bfloat16().float()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    grads_ref = torch.autograd.grad(exact_attention(q64, k64, v64), (q64, k64, v64), d_out.double())
    for delta in DELTA_SOURCES:
        out = EmulatedAttention.apply(q, k, v, paper_opts(delta, "off"))
        assert out.dtype == torch.float32
        grads = torch.autograd.grad(out, (q, k, v), d_out)
        for g, r in zip(grads, grads_ref):
            rel = (g.double() - r).norm() / r.norm()
            assert rel < 3e-2, (delta, float(rel))


def test_delta_sources_differ_only_through_o():
    """δ from the bf16 O differs from δ = rowsum(dP∘P); O recomputed in fp32 agrees with dP∘P."""
    q, k, v = (t.detach().bfloat16().float().requires_grad_() for t in _qkv(n=64))
    d_out = torch.randn(q.shape)
    g = {
        d: torch.autograd.grad(EmulatedAttention.apply(q, k, v, paper_opts(d, "off")), (q,), d_out)[
            0
        ]
        for d in DELTA_SOURCES
    }
    close = (g["dp"] - g["o_fp32"]).abs().max()
    far = (g["dp"] - g["o"]).abs().max()
    assert close < 1e-4 * g["dp"].abs().max() and far > 10 * close


# ----------------------------------------------------------------------------- data
def test_offline_corpus(corpus):
    assert corpus.vocab_size == 256 and len(corpus.train) > 100_000 and len(corpus.val) > 1000
    assert corpus.train.max() < 256 and "standard-library" in corpus.source
    again = load_corpus("stdlib", max_bytes=300_000)
    assert again.fingerprint == corpus.fingerprint
    assert b"def " in bytes(corpus.train[:50_000].astype(np.uint8))
    with pytest.raises(ValueError, match="source"):
        load_corpus("openwebtext")


def test_online_corpus_falls_back_offline(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(gdata, "download_gutenberg", no_network)
    c = load_corpus("gutenberg", max_bytes=50_000)
    assert "standard-library" in c.source and c.vocab_size == 256


def test_batch_order_replay(corpus, tmp_path):
    seed = int(np.random.randint(1 << 30))
    a = BatchOrder.draw(len(corpus.train), 5, 6, 32, seed)
    b = BatchOrder.draw(len(corpus.train), 5, 6, 32, seed)
    a.save(tmp_path / "order.npy")
    c = BatchOrder.load(tmp_path / "order.npy")
    assert a.fingerprint() == b.fingerprint() == c.fingerprint()
    for step in range(5):
        xa, ya = a.batch(corpus.train, step, 32)
        xc, yc = c.batch(corpus.train, step, 32)
        assert torch.equal(xa, xc) and torch.equal(ya, yc)
        assert torch.equal(xa[:, 1:], ya[:, :-1])  # targets are the next tokens
        # two DDP ranks together see exactly the global batch
        halves = [a.batch(corpus.train, step, 32, rank=r, world=2)[0] for r in (0, 1)]
        assert torch.equal(torch.stack(halves, 1).reshape(-1, 32), xa)
    other = BatchOrder.draw(len(corpus.train), 5, 6, 32, seed + 1)
    assert other.fingerprint() != a.fingerprint()
    with pytest.raises(IndexError):
        a.batch(corpus.train, 5, 32)


# ----------------------------------------------------------------------------- training
def _tiny(tmp_path, **kw):
    base = dict(
        name="t",
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=32,
        batch_size=4,
        steps=3,
        warmup=1,
        attn="paper",
        autocast="off",
        out_dir=str(tmp_path),
        log_every=1,
        monitor_every=2,
        progress=False,
    )
    return TrainConfig(**{**base, **kw})


def test_checkpoint_resume_reproduces_next_step(corpus, tmp_path):
    full = Trainer(_tiny(tmp_path, checkpoint_every=2), corpus)
    full.run()
    loss_step2 = full.history["loss"][full.history["step"].index(2)]
    resumed = Trainer(_tiny(tmp_path, resume=True), corpus)
    assert resumed.step == 2
    resumed.run()
    assert resumed.history["loss"][resumed.history["step"].index(2)] == loss_step2
    with pytest.raises(FileNotFoundError):
        Trainer(_tiny(tmp_path, name="missing", resume=True), corpus)


def test_training_logs_diagnostics(corpus, tmp_path):
    tr = Trainer(_tiny(tmp_path, steps=3, autocast="bf16"), corpus)
    summary = tr.run()
    assert summary["status"] == "finished" and summary["steps_done"] == 3
    assert [m["step"] for m in tr.monitor] == [0, 2]
    layer = tr.monitor[-1]["layers"][1]
    for key in (
        "max_logit",
        "rows_p1_fa2",
        "rows_tied_bf16",
        "delta_err",
        "delta_err_running",
        "rank1_token_cos",
        "rank1_step_cos",
    ):
        assert key in layer and layer[key] is not None, key
    assert len(tr.monitor[0]["wq_norms"]) == 2 and len(tr.monitor[0]["wq_norms"][0]) == 2
    assert (tmp_path / "t.csv").read_text().startswith("step,loss")


def test_lr_schedule_and_cli():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-5, warmup=10, steps=110)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(0.5 * (1e-3 + 1e-5)) and lr_at(
        110, cfg
    ) == pytest.approx(1e-5)
    from kernels.gpt2.train import parse_args

    parsed = parse_args(
        ["--attn", "paper:delta=dp", "--qk-norm", "--lr", "3e-3", "--layer-attn", "1=sdpa"]
    )
    assert parsed.attn == "paper:delta=dp" and parsed.qk_norm and parsed.lr == 3e-3
    assert parsed.model_config(256).layer_attn == {1: parse_spec("sdpa")}  # parsed once, here
    with pytest.raises(ValueError, match="autocast"):
        Trainer(TrainConfig(autocast="fp16"))


# ----------------------------------------------------------------------------- diagnostics
def test_spectral_norms_known_matrix():
    s = torch.rand(3) * 5 + 0.1
    u, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    w, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    a = u[:, :3] @ torch.diag(s.double()) @ w.T
    assert dg.spectral_norm(a) == pytest.approx(float(s.max()), rel=1e-9)
    weight = torch.zeros(12, 4)
    weight[0, 0], weight[3, 1] = 3.0, -7.0  # head 0 rows 0-1, head 1 rows 2-3 of W_Q
    assert dg.wq_head_norms(weight, 2) == pytest.approx([3.0, 7.0])
    with pytest.raises(ValueError):
        dg.wq_head_norms(torch.zeros(10, 4), 2)


def test_tie_counts_on_constructed_rows():
    m = float(np.random.uniform(1, 8))
    rows = torch.tensor(
        [
            [m, m, 0.0, -math.inf],  # exact tie: counted by both rules
            [
                m,
                m - 1e-4,
                0.0,
                -math.inf,
            ],  # near tie: P̄ = exp(-1e-4) rounds to 1.0 in bf16; not a tie
            [m, m - 0.1, 0.0, -math.inf],  # P̄ = 0.905: neither
            [m, -math.inf, -math.inf, -math.inf],  # one visible key: neither
        ]
    )
    assert dg.rows_with_tied_max(rows) == 1
    assert dg.rows_rounding_to_one(rows) == 2
    assert dg.max_logit(rows) == pytest.approx(m)


def test_causal_scores_and_delta_error():
    q, k = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 5, 4)
    s = dg.causal_scores(q, k)
    assert torch.isinf(s[0, 0, 0, 1:]).all() and torch.isfinite(s.tril()).all()
    assert torch.allclose(s[0, 0, 2, :3], (q[0, 0, 2] @ k[0, 0, :3].T) / 2)
    sb = dg.causal_scores(q, k, low=torch.bfloat16)
    assert torch.equal(sb.bfloat16().float(), sb)  # every entry is a bf16 value
    d_out, o = torch.ones(2, 3, 4), torch.randn(2, 3, 4)
    c = float(np.random.uniform(-1, 1))
    assert torch.allclose(dg.delta_error(d_out, o + c, o), torch.full((2, 3), 4 * c), atol=1e-5)


def test_rank1_similarity():
    u, x = torch.randn(1, 5), torch.randn(1, 7)
    assert dg.pairwise_rank1_cosine(u.repeat(4, 1), x.repeat(4, 1)) == pytest.approx(1.0)
    flipped = torch.cat([u, -u])  # uᵀx and (−u)ᵀx point in opposite directions
    assert dg.pairwise_rank1_cosine(flipped, x.repeat(2, 1)) == pytest.approx(-1.0)
    eye = torch.eye(3)
    assert dg.pairwise_rank1_cosine(eye, torch.randn(3, 4)) == pytest.approx(0.0, abs=1e-12)
    a = torch.randn(4, 6)
    assert dg.matrix_cosine(a, 3 * a) == pytest.approx(1.0) and dg.matrix_cosine(
        a, -a
    ) == pytest.approx(-1.0)


def test_find_explosion():
    steps = np.arange(0, 1000, 10)
    healthy = 3 * np.exp(-steps / 300) + 1 + 0.01 * np.random.randn(len(steps))
    assert dg.find_explosion(steps, healthy) is None
    boom = healthy.copy()
    boom[60:] += 3.0
    assert 550 <= dg.find_explosion(steps, boom) <= 640
    spike = healthy.copy()
    spike[40:45] += 5.0  # a spike that recovers is not an explosion
    assert dg.find_explosion(steps, spike) is None
    nan = healthy.copy()
    nan[70:] = np.nan
    assert dg.find_explosion(steps, nan) == 700


# -------------------------------------------------------------------------- search plans and report
@pytest.mark.parametrize("name", PLANS)
def test_every_plan_builds_valid_runs(name):
    from kernels.gpt2.plans import plan

    runs = plan(name)
    assert len({n for n, _ in runs}) == len(runs), "run names must be unique"
    for run_name, opts in runs:
        cfg = TrainConfig(**{k: v for k, v in opts.items() if k != "gpu_slot"})
        model_cfg = cfg.model_config(256)
        specs = [model_cfg.spec(i) for i in range(model_cfg.n_layer)]
        if name.startswith("amp") and "k7" not in run_name:
            assert all(s.obits < 7 for s in specs if s.kind == "paper"), run_name
        if "-R-" in run_name:
            assert any(s.oround == "sr" for s in specs)
        if "-L-" in run_name:
            assert specs[0].delta == "o" and all(s.delta == "o_fp32" for s in specs[1:])
        if "-B-" in run_name or "-N-" in run_name:  # F plus a δ control in every layer
            assert all(s.delta == "o_fp32" and s.controlled and s.obits == 4 for s in specs)
        if name in ("bf16_long", "amp_bits", "controls", "amp_fixes"):
            assert opts["checkpoint_every"] > 0, "GPU plans of the chapter must be resumable"


def test_matched_controls_use_the_stored_failing_runs():
    from kernels.gpt2 import report
    from kernels.gpt2.plans import MATCHED_K4, variant_options

    stats = report.matched_delta_stats(report.load_search("amp_seeds")["data"]["runs"])
    for key in ("mean", "mean_abs"):
        assert stats[key] == pytest.approx(MATCHED_K4[key], rel=1e-3), key
    assert all(m > 0 for m in stats["mean"])  # the failing runs' δ error leans positive
    layers = variant_options("B", 4)["layer_attn"].split(";")
    assert len(layers) == 4 and all("dshift=" in item for item in layers)
    with pytest.raises(ValueError, match="obits=4"):
        variant_options("N", 5)


def test_variants_and_gpu_dealing():
    from kernels.gpt2.plans import plan, variant_options
    from kernels.gpt2.search import assign_gpus

    with pytest.raises(ValueError, match="obits"):
        variant_options("R")
    assert (
        variant_options("U", 4)["attn"] == "paper:delta=o,obits=4"
        and variant_options("A", 4)["attn"] == "sdpa"
    )
    runs = [(f"r{i}", {"steps": i}) for i in range(5)]
    dealt = assign_gpus(runs, ["3", "5"])
    assert [g for _, _, g in dealt] == ["3", "5", "3", "5", "3"]
    assert [g for _, _, g in assign_gpus(runs, [])] == [None] * 5
    pinned = assign_gpus(plan("amp_final"), ["0", "1", "2", "3"])
    assert [g for _, _, g in pinned] == ["0", "1", "2", "2", "3", "3"]
    assert all("gpu_slot" not in opts for _, opts, _ in pinned)


def _fake_run(losses, steps=None, attn="paper:delta=o,obits=4"):
    steps = steps or list(range(0, 10 * len(losses), 10))
    return {
        "history": {"step": steps, "loss": losses, "wall_s": [s / 10 for s in steps]},
        "summary": {"steps_done": steps[-1] + 1, "steps_per_s": 10.0},
        "config": {"attn": attn},
    }


def test_report_outcome_finds_explosions_and_nans():
    from kernels.gpt2 import figures, report

    rng = np.random.default_rng()
    calm = list(2.0 - np.linspace(0, 1, 200) + 0.01 * rng.standard_normal(200))
    boom = calm[:100] + [4.0] * 100
    nan = calm[:50] + [math.nan] * 5
    assert report.outcome(_fake_run(calm))["event"] is None
    out = report.outcome(_fake_run(boom))
    assert out["event"] == "explosion" and 900 <= out["step"] <= 1000 and out["obits"] == 4
    assert out["wall_s"] == out["step"] / 10
    out = report.outcome(_fake_run(nan, attn="paper:delta=o"))
    assert out["event"] == "NaN" and out["step"] == 500 and out["obits"] == 7
    table = report.outcome_table({"k4-U-s1": _fake_run(boom), "k4-F-s1": _fake_run(calm)})
    assert list(table.event) == ["explosion", "none"] and list(table.variant) == ["U", "F"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    figures.plot_steps_to_failure(ax, table)
    # U failed and F did not: one filled and one open marker set, no empty legend entries
    assert ax.get_yscale() == "log" and len(ax.collections) == 2
    assert len(ax.get_legend().get_texts()) == 2
    plt.close(fig)


def test_amplified_variants_train_end_to_end(corpus, tmp_path):
    from kernels.gpt2.search import run_inline

    base = dict(
        n_layer=2,
        n_head=2,
        n_embd=32,
        block_size=32,
        batch_size=4,
        steps=4,
        warmup=1,
        monitor_every=2,
        autocast="off",
        log_every=1,
    )
    runs = run_inline(
        base, "URL", corpus=corpus, out_dir=tmp_path, progress=False, obits=3, prefix="amp"
    )
    assert set(runs) == {"amp-U-s0", "amp-R-s0", "amp-L-s0"}
    for name, rec in runs.items():
        assert rec["summary"]["status"] == "finished", name
        assert all(math.isfinite(x) for x in rec["history"]["loss"])
    assert runs["amp-R-s0"]["config"]["attn"].endswith("obits=3")
    # same seed and batches, different rounding of Ō: the two runs must not be identical
    assert runs["amp-U-s0"]["history"]["loss"] != runs["amp-R-s0"]["history"]["loss"]
