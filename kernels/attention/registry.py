"""The one registry of attention implementations: each one's spelling, label and short label,
and one way to run it, :func:`run` ``(name, q, k, v, opts)``.

Every chapter, benchmark and training spec names an implementation by its :attr:`name` here
(these spellings are also the ones stored in ``results/*.json``, so they never change). A name
may carry the offset rule after a slash: ``"triton/cross"`` is the book's kernel with
``stable="cross"`` (no slash: the rule is off). :func:`label` and :func:`short` turn a name into
the words tables, legends and the rows of ``results/perf_*.json`` use.

Kinds:

``sdpa``       torch ``scaled_dot_product_attention``, one backend (:data:`SDPA_BACKENDS`) or
               its own choice (``"sdpa"``)
``book``       the book's Triton kernel, :func:`kernels.attention.flash_attention`
``emulator``   :func:`kernels.attention.emulator.flash_forward` with ``numerics`` fa2 or paper;
               ``-untiled``: one tile of all the keys (the paper's own PyTorch code)
``reference``  standard attention in fp32 (``math32``) or fp64
``model``      an experiment's own model of a kernel (the lab's ``fa2-fma``, chapter 8's
               ``fa1``): named here, run by the module :attr:`Implementation.home` names (the
               lab's ``run_case``, chapter 8's ``run_in_format``)

This is the one dispatcher: :func:`runner` (and :func:`run`) for every kind but ``model``,
:func:`emulator_runner` for the emulator's whole result (O with each row's m, ℓ and ties, which
the lab reads), :func:`parse` / :func:`split` for a name with its rule. The experiments' own
entry points (``run_case``, ``run_in_format``) run their models and hand every other name here.

:data:`GROUPS` lists which implementations each experiment compares.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .options import STABLE_MODES, AttentionOptions


@dataclass(frozen=True)
class Implementation:
    name: str  # the one spelling (also in stored results)
    label: str  # tables, legends, the rows of results/perf_*.json
    short: str  # tight figure labels
    kind: str  # sdpa, book, emulator, reference, model
    gpu_only: bool = False
    home: str = "kernels.attention.registry"  # the module that runs it
    aliases: tuple[str, ...] = ()  # other spellings found in stored results


_LAB = "kernels.rounding_lab.implementations"
_GOLDEN = "kernels.golden.implementations"
_RUNS = {_LAB: f"{_LAB}.run_case", _GOLDEN: f"{_GOLDEN}.run_in_format"}  # of the models
_ALL = (
    Implementation("sdpa", "torch SDPA", "SDPA", "sdpa"),
    Implementation("sdpa-flash", "SDPA flash", "SDPA flash", "sdpa", True, aliases=("sdpa_flash",)),
    Implementation("sdpa-cudnn", "SDPA cuDNN", "cuDNN", "sdpa", True),
    Implementation("sdpa-efficient", "SDPA efficient", "SDPA eff.", "sdpa", True),
    Implementation("sdpa-math", "SDPA math", "SDPA math", "sdpa"),
    Implementation("triton", "book", "Triton", "book"),
    Implementation("triton-explicit", "book, explicit rounding", "Triton expl.", "book"),
    Implementation("fa2", "FA2, fp32 accumulation (book kernel)", "FA2", "emulator"),
    Implementation("paper", "FA2, every tensor in the format", "FA2 all-low", "emulator"),
    Implementation("fa2-untiled", "FA2, one tile of all keys", "FA2 untiled", "emulator"),
    Implementation(
        "paper-untiled", "FA2 all-low, one tile of all keys", "all-low untiled", "emulator"
    ),
    Implementation("math32", "standard attention in fp32", "math32", "reference"),
    Implementation("torch_math", "torch math attention (run)", "torch math", "reference"),
    Implementation("fp64", "standard attention in fp64", "fp64", "reference"),
    Implementation("ideal", "ideal: exact O rounded once", "ideal", "model", home=_LAB),
    Implementation(
        "fa2-fma", "FA2, P̄V added one product at a time (CPU model)", "FA2 FMA", "model", home=_LAB
    ),
    Implementation(
        "fa2-mma", "FA2, P̄V as one bf16 tensor-core matmul", "FA2 MMA", "model", True, home=_LAB
    ),
    Implementation(
        "baseline", "baseline, S and P stored in the format", "baseline", "model", home=_GOLDEN
    ),
    Implementation(
        "baseline_fp32",
        "baseline computed in fp32, O rounded once",
        "base fp32",
        "model",
        home=_GOLDEN,
    ),
    Implementation("fa1", "FA1, every tensor in the format", "FA1 all-low", "model", home=_GOLDEN),
)
REGISTRY = {impl.name: impl for impl in _ALL}
_ALIASES = {alias: impl.name for impl in _ALL for alias in impl.aliases}
# the offset rule in a label: "book, rule off", "book, cross-tile rule"
RULE_WORDS = {
    "off": "rule off",
    "cross": "cross-tile rule",
    "tile": "per-tile rule",
    "always": "rule always on",
    "offset": "fixed offset",
}

# which implementations each experiment compares, in its order
GROUPS = {
    # the GPT-2 attention specs (kernels.gpt2.attention): "kind[:options]"
    "gpt2": ("sdpa", "math32", "triton", "paper"),
    # chapter 10's speed table (python -m kernels.gpu.perf)
    "perf": ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "triton", "triton/cross"),
    "perf-legend": ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "triton", "triton/cross"),
    # the rounding lab (kernels.rounding_lab): run on the CPU, and only on a GPU
    "lab": ("ideal", "fa2-fma", "paper", "fa2", "paper-untiled", "fa2-untiled"),
    "lab-gpu": (
        "sdpa-flash",
        "sdpa-cudnn",
        "sdpa-efficient",
        "triton",
        "triton-explicit",
        "fa2-mma",
    ),
    # chapter 8's microbenchmark (kernels.golden): computed everywhere, and run by its GPU script
    "golden": ("baseline", "baseline_fp32", "fa2", "paper", "fa1"),
    "golden-run": ("triton", "sdpa_flash", "torch_math"),
}
# the spellings of results/fix_speed.json (python -m kernels.rounding_lab.fixes_gpu), read by
# chapter 6
FIX_SPEED = {"sdpa-flash": "SDPA flash", "sdpa-cudnn": "SDPA cudnn"}
# ... and the rows of results/bias_sources_gpu.json (python -m kernels.rounding_lab.fixes_gpu),
# read by chapter 5: the book's kernel once per fix ("triton/none", "triton/delta_dp", ...)
BIAS_SOURCES = {
    "ideal": "ideal",
    "fa2": "emulator/fa2",
    "paper-untiled": "emulator/paper-untiled",
    "sdpa-flash": "sdpa-flash",
    "sdpa-cudnn": "sdpa-cudnn",
    "sdpa-efficient": "sdpa-efficient",
    "triton": "triton/none",
}


def parse(name: str) -> tuple[Implementation, str]:
    """``"triton/cross"`` -> (the ``triton`` entry, ``"cross"``); no slash: the rule is off."""
    base, _, stable = name.partition("/")
    base = _ALIASES.get(base, base)
    if base not in REGISTRY:
        raise ValueError(f"unknown implementation {base!r} in {name!r}; one of {tuple(REGISTRY)}")
    stable = stable or "off"
    if stable not in STABLE_MODES:
        raise ValueError(f"unknown offset rule {stable!r} in {name!r}; one of {STABLE_MODES}")
    return REGISTRY[base], stable


def split(name: str) -> tuple[str, str]:
    """``"fa2/cross"`` -> ``("fa2", "cross")``: :func:`parse` as two names (aliases resolved)."""
    impl, stable = parse(name)
    return impl.name, stable


def get(name: str) -> Implementation:
    return parse(name)[0]


def group(key: str) -> tuple[str, ...]:
    """The names of :data:`GROUPS` ``[key]``."""
    return GROUPS[key]


def label(name: str) -> str:
    """Words for tables and legends; the book's kernel says its offset rule
    (``"book, rule off"``, ``"book, cross-tile rule"``)."""
    impl, stable = parse(name)
    if impl.name == "triton" or stable != "off":
        return f"{impl.label}, {RULE_WORDS[stable]}"
    return impl.label


def short(name: str) -> str:
    impl, stable = parse(name)
    return impl.short if stable == "off" else f"{impl.short}/{stable}"


def names_by_label(names) -> dict[str, str]:
    """{label: name} of ``names`` (a table's rows back to their implementations)."""
    return {label(name): name for name in names}


# --- running one ---------------------------------------------------------------------------
def sdpa_backend(backend: str):
    """The torch backend enum of ``"flash"``, ``"cudnn"``, ``"efficient"`` or ``"math"``."""
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]


SDPA_BACKENDS = ("flash", "cudnn", "efficient", "math")


def runner(name: str, opts: AttentionOptions | None = None, **options):
    """Implementation ``name`` with fixed options, as ``attn(q, k, v)``: the options are worked
    out once here, not on every call (what the timing code calls). ``opts`` or its fields as
    keywords; the name's numerics, and its offset rule where it has one ("triton/cross"),
    override theirs."""
    impl, stable = parse(name)
    opts = AttentionOptions(**options) if opts is None else opts.replace(**options)
    if impl.kind == "sdpa":
        from torch.nn.attention import sdpa_kernel

        backend = impl.name.partition("-")[2]
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def attn(q, k, v):
            with sdpa_kernel(sdpa_backend(backend)) if backend else contextlib.nullcontext():
                return sdpa(q, k, v, is_causal=opts.causal, scale=opts.scale)

    elif impl.kind == "book":
        from .autograd import flash_attention

        explicit = True if impl.name == "triton-explicit" else None
        book = opts if "/" not in name else opts.replace(stable=stable)

        def attn(q, k, v):
            return flash_attention(q, k, v, book, explicit=explicit)

    elif impl.kind == "emulator":
        forward = emulator_runner(name, opts)

        def attn(q, k, v):
            return forward(q, k, v).out

    elif impl.kind == "reference":
        from .reference import attention_fp64, standard_attention

        def attn(q, k, v):
            if impl.name == "fp64":
                return attention_fp64(q, k, v, opts.causal, opts.scale)
            work = torch.float32 if impl.name == "math32" else q.dtype
            return standard_attention(*(t.to(work) for t in (q, k, v)), opts.causal, opts.scale)

    else:
        raise ValueError(f"{name} is a model of its experiment: run it with {_RUNS[impl.home]}")
    attn.__name__ = impl.name
    return attn


def emulator_runner(name: str, opts: AttentionOptions | None = None, **options):
    """Emulator implementation ``name`` (``fa2``, ``paper``, their ``-untiled`` forms, with an
    offset rule after a slash) as ``forward(q, k, v, low=torch.bfloat16)``, which returns the
    emulator's whole :class:`~kernels.attention.emulator.ForwardResult` (O, and each row's final
    m, ℓ and whether its rule saw ties). ``opts`` and keywords as in :func:`runner`."""
    from . import emulator

    impl, stable = parse(name)
    if impl.kind != "emulator":
        raise ValueError(f"{name} is not run by the emulator; one of {group_of_kind('emulator')}")
    opts = AttentionOptions(**options) if opts is None else opts.replace(**options)
    numerics, _, untiled = impl.name.partition("-")
    emulated = opts.replace(numerics=numerics, **({"stable": stable} if "/" in name else {}))

    def forward(q, k, v, low=torch.bfloat16):
        use = emulated.replace(block_n=k.shape[-2]) if untiled else emulated
        return emulator.flash_forward(q, k, v, use, low=low)

    forward.__name__ = impl.name
    return forward


def group_of_kind(kind: str) -> tuple[str, ...]:
    """The names of every implementation of one ``kind`` ("sdpa", "book", "emulator", ...)."""
    return tuple(impl.name for impl in _ALL if impl.kind == kind)


def run(name: str, q, k, v, opts: AttentionOptions | None = None, **options):
    """O of implementation ``name`` on (..., N, D) tensors (see :func:`runner`). The book's
    kernel keeps autograd; ``model`` implementations are run by their own module
    (:attr:`Implementation.home`)."""
    return runner(name, opts, **options)(q, k, v)
