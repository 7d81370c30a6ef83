"""The one registry of implementations (kernels.attention.registry): spellings, labels, groups,
and run(name, q, k, v, opts) against the functions it stands for."""

from __future__ import annotations

import pytest
import torch

import kernels  # noqa: F401
from kernels.attention import AttentionOptions, emulator, flash_attention, registry
from kernels.attention.reference import attention_fp64, standard_attention


def test_every_group_names_registered_implementations():
    for names in registry.GROUPS.values():
        for name in names:
            registry.parse(name)  # raises on an unknown name or rule
    assert registry.group("gpt2") == ("sdpa", "math32", "triton", "paper")


def test_labels_are_the_stored_ones():
    """results/perf_*.json rows and chapter 10 use these words: they must not change."""
    assert [registry.label(n) for n in registry.group("perf")] == [
        "SDPA flash",
        "SDPA cuDNN",
        "SDPA efficient",
        "book, rule off",
        "book, cross-tile rule",
    ]
    assert registry.get("sdpa_flash").name == "sdpa-flash"  # chapter 8's stored spelling
    assert registry.short("triton/cross") == "Triton/cross"
    assert list(registry.FIX_SPEED.values()) == ["SDPA flash", "SDPA cudnn"]


def test_unknown_names_say_what_there_is():
    with pytest.raises(ValueError, match="unknown implementation"):
        registry.parse("flash")
    with pytest.raises(ValueError, match="unknown offset rule"):
        registry.parse("triton/sometimes")
    with pytest.raises(ValueError, match="kernels.rounding_lab.implementations"):
        registry.run("fa2-fma", *torch.randn(3, 1, 1, 8, 16))


def test_run_is_the_function_it_names():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=gen).bfloat16() for _ in range(3))
    opts = AttentionOptions(causal=True, block_n=32)
    assert torch.equal(registry.run("triton", q, k, v, opts), flash_attention(q, k, v, opts))
    cross = flash_attention(q, k, v, opts.replace(stable="cross"))
    assert torch.equal(registry.run("triton/cross", q, k, v, opts), cross)
    assert torch.equal(
        registry.run("paper", q, k, v, opts),
        emulator.flash_forward(q, k, v, opts.replace(numerics="paper")).out,
    )
    untiled = emulator.flash_forward(q, k, v, opts.replace(block_n=40)).out
    assert torch.equal(registry.run("fa2-untiled", q, k, v, opts), untiled)
    assert torch.equal(registry.run("fp64", q, k, v, opts), attention_fp64(q, k, v, True))
    assert torch.equal(registry.run("torch_math", q, k, v, opts), standard_attention(q, k, v, True))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(registry.run("sdpa", q, k, v, opts), sdpa)


def test_one_place_for_backends_and_switches():
    """SDPA's backends are mapped only here, and the speed-ups are changed and restored only
    through speedups() (kernels/attention/launcher/switches.py, kernels.attention.speedups)."""
    from pathlib import Path

    package = Path(kernels.__file__).parent
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name != "registry.py":
            assert "SDPBackend" not in text, f"{path}: name SDPA backends in the registry"
        assert "SPEEDUPS" not in text, f"{path}: use kernels.attention.speedups(...)"
        if path.name != "switches.py":
            assert "CURRENT =" not in text, f"{path}: use kernels.attention.speedups(...)"


def test_stored_spellings_and_figure_labels_come_from_the_registry():
    from kernels.rounding_lab import source_figures

    for table in (registry.FIX_SPEED, registry.BIAS_SOURCES):
        for name in table:
            registry.parse(name)  # every key is a registry name
    assert source_figures.KERNEL_LABELS == {
        stored: registry.label(name) for name, stored in registry.BIAS_SOURCES.items()
    }
    assert set(source_figures.KERNELS) <= set(source_figures.KERNEL_LABELS)


def test_one_name_per_function():
    """The torch rounding helpers do not share names with the NumPy ones (issue 23), and the
    registry's run is the only run() among the implementations' modules."""
    from kernels.golden import implementations as golden
    from kernels.numerics import formats, rounding
    from kernels.rounding_lab import implementations as lab

    assert {"round_to", "ulp"} <= set(dir(formats))
    assert not {"round_to", "ulp"} & set(dir(rounding))
    assert not hasattr(lab, "run") and not hasattr(golden, "run")


def test_the_experiments_dispatch_through_the_registry():
    """The lab's run_case and chapter 8's run_in_format run the emulator through
    registry.emulator_runner: the same bits as calling the emulator, m, ℓ and ties included."""
    from kernels import rounding_lab as lab
    from kernels.golden import implementations as golden

    assert registry.split("sdpa_flash/cross") == ("sdpa-flash", "cross")
    assert registry.group_of_kind("emulator") == ("fa2", "paper", "fa2-untiled", "paper-untiled")
    built = lab.build(lab.Case(n_keys=96, batch=2, head_dim=16, block_n=32), seed=1)
    opts = AttentionOptions(scale=1.0, stable="tile", block_n=96, numerics="paper")
    want = emulator.flash_forward(built.q, built.k, built.v, opts)
    got = lab.run_case("paper-untiled", built, stable="tile", block_n=32)
    assert torch.equal(got.out, want.out.float())
    assert torch.equal(got.row_offset, want.row_offset) and torch.equal(got.row_sum, want.row_sum)
    assert torch.equal(got.ties_seen, want.ties)
    q, k, v = (t.unsqueeze(0) for t in (built.q, built.k, built.v))
    direct = emulator.flash_forward(q, k, v, AttentionOptions(block_n=16), low=torch.float16)
    assert torch.equal(golden.run_in_format("fa2", q, k, v, "fp16", block_n=16), direct.out.float())
    assert torch.equal(
        golden.RUNNERS["fa1"](q, k, v, torch.float16), golden.fa1(q, k, v, torch.float16)
    )
    with pytest.raises(ValueError, match="not run by the emulator"):
        registry.emulator_runner("triton")
