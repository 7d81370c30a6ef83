"""The GPT-2 experiments as data: the attention variants and the named plans of runs.

Every variant is one row of :data:`VARIANT_TABLE`: letter → (attention spec, name in words,
colour); ``VARIANTS``, ``VARIANT_NAMES`` and ``VARIANT_COLOURS`` are views of it.

A *plan* is a named list of runs ``(name, {train option: value})``, so the command that made a
result file is short and exact (``python -m kernels.gpt2.search --plan amp_seeds``). The variants
of one configuration differ only in the attention spec:
``U`` = the paper's bf16 flash attention (δ from the bf16 O, the failing path),
``F`` = the same with δ from O recomputed in fp32 (the paper's stable control), ``S`` = the
stabilised forward of Algorithm 3 (β = 2, ties detected across the whole row), ``P`` = δ from
rowsum(dP ∘ P), ``A`` = torch SDPA everywhere, ``W`` = the book's Triton kernel (FA2 numerics)
and ``V`` = the same with δ from an fp32 O (W's own control), ``R`` = ``U`` with Ō rounded
stochastically (only with ``obits`` < 7), ``T`` = ``U`` in key tiles of 64 instead of
untiled, ``L`` = ``U`` in layer 0 only, ``F`` elsewhere (the paper's "only layer 2 matters": in
our runs ‖W_Q‖ grows first in layer 0, measured in the ``amplify`` plan).

``obits`` (the amplifier) holds Ō in a float with bf16's exponent and fewer mantissa bits than
bf16's 7, in every paper-path variant of a run, controls included: the rounding of Ō is magnified
2^(7 − obits) times and nothing else changes.

The controls that tell a biased δ from a large one (:mod:`.controls`, plan ``controls``):
``B`` = ``F`` plus a constant δ offset per layer equal to the failing runs' mean error per row
(bias alone), ``N`` = ``F`` plus zero-mean Gaussian noise on δ of the failing runs' error size
(size alone, matched under a Gaussian assumption), ``M`` = ``U`` with each sequence's δ errors
replaced by their mean (keeps Σ_T(δ_lp − δ_hp), the sum of Eq. 3; no token-to-token spread),
``G`` = ``U`` with random signs on the δ errors (the same sizes row by row, zero mean),
``X`` = ``U`` whose layers pass the exact O downstream (dO from the exact-O path; δ still from
the rounded O). The fixes of the bias chapters in training (plan ``amp_fixes``): ``C`` = ``S``
with the offset capped at 20 above the row maximum, ``K`` = ``S`` with the paper code's clamp
ℓ ≥ 1e-10 on the final denominator only, ``D`` = both; and ``P`` on seeds 2 and 3 (seed 1 is in
``amp_seeds``). ``Z`` = the paper's fix as its released code runs it: Algorithm 3 per key tile of
512 (at context 256 one tile holds the whole row), β = 2, ε = 1e-3, and each tile's row sum
clamped at 1e-10 before it joins ℓ and the log-sum-exp.

The paper's per-head ablation (its §3.2 and Fig. 3; plan ``amp_head``): ``H`` = ``U`` with the
one head of layer 0 whose ‖W_Q‖ ran away first in that seed's failing run (``RUNAWAY_HEAD_K4``)
on the control's route, δ from O in fp32. If the failure lives in that head, ``H`` trains like
``F``; if another head takes over, it fails later.

Long runs are *resumable*: every plan run with ``checkpoint_every`` continues from its checkpoint
when the same search command is given again (see :mod:`.search`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..attention.registry import label


class Variant(NamedTuple):
    """One variant of a run: its attention spec (the human-readable spelling stored with the run;
    :func:`variant_options` adds the layer overrides of L, B, N, H), its name in words, and its
    colour in the chapter's figures."""

    attn: str
    name: str
    colour: str


VARIANT_TABLE = {
    "U": Variant("paper:delta=o", "failing path (δ from rounded O)", "tab:red"),
    "F": Variant("paper:delta=o_fp32", "control (δ from fp32 O)", "tab:blue"),
    "S": Variant("paper:delta=o,stable=cross,beta=2", "fix: β = 2 rule", "tab:green"),
    "P": Variant("paper:delta=dp", "δ from rowsum(dP∘P)", "tab:purple"),
    "A": Variant("sdpa", label("sdpa"), "tab:gray"),
    # the book's Triton kernel, FA2 numerics (fp32 Ō, one rounding)
    "W": Variant("triton:delta=o", "FA2 numerics (the book's Triton kernel)", "black"),
    # ... and its own control: the same kernel, δ from an fp32 O recomputed
    "V": Variant("triton:delta=o_fp32", "FA2 numerics' control (δ from fp32 O)", "teal"),
    "R": Variant("paper:delta=o,oround=sr", "failing path, Ō rounded stochastically", "tab:orange"),
    "T": Variant("paper:delta=o,block=64", "failing path, tiles of 64", "tab:brown"),
    # + layer 0 switched to U, see variant_options
    "L": Variant("paper:delta=o_fp32", "failing path in layer 0 only", "tab:pink"),
    # + per-layer dshift, see variant_options
    "B": Variant("paper:delta=o_fp32", "control + constant δ bias", "tab:olive"),
    # + per-layer dnoise, see variant_options
    "N": Variant("paper:delta=o_fp32", "control + δ noise", "tab:cyan"),
    "M": Variant("paper:delta=o,derr=mean", "failing path, δ error → its mean", "darkred"),
    "G": Variant("paper:delta=o,derr=sign", "failing path, δ error ± at random", "salmon"),
    "X": Variant("paper:delta=o,out=exact", "failing path, exact O passed on", "indigo"),
    "C": Variant(
        "paper:delta=o,stable=cross,beta=2,cap=20", "fix: β = 2, offset capped", "tab:olive"
    ),
    "K": Variant("paper:delta=o,stable=cross,beta=2,clamp=1e-10", "fix: β = 2, ℓ clamped", "0.35"),
    "D": Variant(
        "paper:delta=o,stable=cross,beta=2,cap=20,clamp=1e-10",
        "fix: β = 2, capped and clamped",
        "tab:cyan",
    ),
    "Z": Variant(
        "paper:delta=o,stable=tile,beta=2,eps=1e-3,clamp=1e-10,clamp_at=tiles,block=512",
        "paper's fix as released (β = 2, clamped ℓ)",
        "darkgoldenrod",
    ),
    # + layer 0's runaway head on F's route, see variant_options
    "H": Variant("paper:delta=o", "failing path, runaway head on the control's route", "tab:olive"),
}
# Views of the one table, keyed by the same letters.
VARIANTS = {letter: v.attn for letter, v in VARIANT_TABLE.items()}
VARIANT_NAMES = {letter: v.name for letter, v in VARIANT_TABLE.items()}
VARIANT_COLOURS = {letter: v.colour for letter, v in VARIANT_TABLE.items()}
# The failing runs' error of δ per row, δ_lp − δ_hp, in each layer: its mean and its mean absolute
# value over the monitoring steps from 200 until layer 0's ‖W_Q‖ left the control's (Ō with 4
# bits, seeds 1-3, plan amp_seeds). ``report.matched_delta_stats`` recomputes them from the stored
# runs and a test checks that these numbers are what it gives.
MATCHED_K4 = {
    "mean": (1.835e-09, 3.464e-10, 1.836e-10, 2.102e-10),
    "mean_abs": (1.705e-07, 6.852e-08, 5.350e-08, 4.072e-08),
}
# The head of layer 0 whose ‖W_Q‖ ran away first in the failing runs with Ō in 4 bits, by seed
# (plan amp_seeds); ``report.runaway_head`` finds them in the stored runs and a test checks them.
RUNAWAY_HEAD_K4 = {1: 3, 2: 2, 3: 1}
GAUSS_SD_PER_MEAN_ABS = (3.141592653589793 / 2) ** 0.5  # σ = √(π/2)·E|e| for a normal e
LADDER_LAYER = 0  # the layer ``L`` leaves on the failing path (0-based)

SMALL = dict(n_layer=4, n_head=4, n_embd=256, block_size=256, batch_size=64, warmup=200)
# the amplifier search: the paper's peak lr 1e-3, cosine to 1e-4 over 20k steps
AMP = dict(SMALL, lr=1e-3, min_lr=1e-4, steps=20000)


# The testbed screen: the paper's schedule (warmup 2,000, cosine to 1e-5; AdamW β₂ 0.95 and no
# weight decay are the trainer's defaults) defined over an 80,000-step run, trained 20,000 steps.
SCREEN_BASE = dict(
    SMALL,
    warmup=2_000,
    lr=1e-3,
    min_lr=1e-5,
    steps=20_000,
    decay_steps=80_000,
    monitor_every=200,
    checkpoint_every=2_000,
)
SCREENS = {
    "sa-paper": {},
    "sb-lr5e-4": {"lr": 5e-4},
    "sc-n512": {"block_size": 512, "batch_size": 32},
    "sd-b128": {"batch_size": 128},
}


def with_obits(spec: str, obits: int) -> str:
    return spec if obits == 7 or not spec.startswith("paper") else f"{spec},obits={obits}"


def variant_options(variant: str, obits: int = 7, seed: int | None = None) -> dict:
    """The training options that make one variant: its attention spec (and layer override;
    ``H`` needs the ``seed``, whose runaway head it moves)."""
    if variant == "R" and obits == 7:
        raise ValueError("variant R (stochastic rounding of Ō) needs obits < 7")
    opts = {"attn": with_obits(VARIANTS[variant], obits)}
    if variant == "L":
        opts["layer_attn"] = f"{LADDER_LAYER}={with_obits(VARIANTS['U'], obits)}"
    if variant == "H":
        if obits != 4 or seed not in RUNAWAY_HEAD_K4:
            raise ValueError(
                f"variant H moves the runaway head of a stored 4-bit failing run: obits=4 and a "
                f"seed in {sorted(RUNAWAY_HEAD_K4)}, got obits={obits}, seed={seed}"
            )
        head = RUNAWAY_HEAD_K4[seed]
        opts["layer_attn"] = f"{LADDER_LAYER}={opts['attn']},fp32_heads={head}"
    if variant in ("B", "N"):
        if obits != 4:
            raise ValueError(f"variant {variant} is matched to the 4-bit failing runs: obits=4")
        key, scale = ("dshift", 1.0) if variant == "B" else ("dnoise", GAUSS_SD_PER_MEAN_ABS)
        values = MATCHED_K4["mean" if variant == "B" else "mean_abs"]
        opts["layer_attn"] = ";".join(
            f"{layer}={opts['attn']},{key}={scale * value!r}" for layer, value in enumerate(values)
        )
    return opts


def run_name(config: str, variant: str, seed: int) -> str:
    """A run's name in the search, '<config>-<variant>-s<seed>' (``runs.parse_name`` splits it)."""
    return f"{config}-{variant}-s{seed}"


def make_runs(prefix, base, variants, seeds, obits=7, gpu_slot=None, **extra):
    """One run per seed and variant; ``gpu_slot`` pins them all to one GPU (see
    :func:`assign_gpus`)."""
    pin = {} if gpu_slot is None else {"gpu_slot": gpu_slot}
    out = []
    for seed in seeds:
        for v in variants:
            opts = {
                **base,
                **extra,
                **variant_options(v, obits, seed),
                "seed": seed,
                "data_seed": seed,
                **pin,
            }
            out.append((run_name(prefix, v, seed), opts))
    return out


def plan(name: str) -> list[tuple[str, dict]]:
    """The named lists of runs used for the chapter's results."""
    if name == "tiny":  # CPU smoke test of the runner itself
        base = dict(
            n_layer=2,
            n_head=2,
            n_embd=64,
            block_size=64,
            batch_size=8,
            warmup=5,
            steps=20,
            monitor_every=10,
            max_bytes=1_000_000,
            autocast="off",
        )
        return make_runs("tiny", base, "UF", [0])
    if name == "probe":  # first search: lr, batch, width and qk-norm, one seed, U vs F (vs S)
        runs = make_runs("a-lr1e-3", SMALL, "UFSA", [0], lr=1e-3, steps=6000)
        runs += make_runs("b-lr2e-3", SMALL, "UF", [0], lr=2e-3, steps=6000)
        runs += make_runs(
            "c-w512h8-lr6e-4",
            {**SMALL, "n_layer": 6, "n_head": 8, "n_embd": 512},
            "UF",
            [0],
            lr=6e-4,
            steps=3000,
        )
        runs += make_runs(
            "d-b256-lr1e-3", {**SMALL, "batch_size": 256}, "UF", [0], lr=1e-3, steps=3000
        )
        runs += make_runs(
            "e-qknorm-lr2e-3", {**SMALL, "qk_norm": True}, "UF", [0], lr=2e-3, steps=6000
        )
        return runs
    if name == "probe2":  # second search: constant (undecayed) high lr, with and without qk-norm
        const = lambda lr: dict(lr=lr, min_lr=lr, steps=6000)  # noqa: E731  (min_lr = lr: no decay)
        runs = make_runs("f-const3e-3", SMALL, "UFS", [0], **const(3e-3))
        runs += make_runs(
            "g-qknorm-const3e-3", {**SMALL, "qk_norm": True}, "UF", [0], **const(3e-3)
        )
        runs += make_runs(
            "h-qknorm-const6e-3", {**SMALL, "qk_norm": True}, "UF", [0], **const(6e-3)
        )
        runs += make_runs(
            "i-n128b128-const2e-3",
            {**SMALL, "block_size": 128, "batch_size": 128},
            "UF",
            [0],
            **const(2e-3),
        )
        runs += make_runs("j-const1e-3", SMALL, "UF", [1], **const(1e-3))
        return runs
    if (
        name == "seeds"
    ):  # three seeds (model init and batch order) of the most aggressive setting, U / F / S
        return make_runs("f-const3e-3", SMALL, "UFS", [1, 2, 3], lr=3e-3, min_lr=3e-3, steps=6000)
    if name == "amplify":  # the amplifier: Ō with 3, 4, 5 mantissa bits, and bf16 itself, on 4 GPUs
        runs = make_runs("k3", AMP, "UF", [0], obits=3)
        runs += make_runs("k4", AMP, "U", [0], obits=4) + make_runs("k3", AMP, "S", [0], obits=3)
        runs += make_runs("k5", AMP, "U", [0], obits=5) + make_runs("k3", AMP, "R", [0], obits=3)
        runs += make_runs("k7", AMP, "UF", [0])
        return runs
    if (
        name == "amp_seeds"
    ):  # Ō with 4 mantissa bits: three seeds of U / F / S, and the ladder on seed 1
        runs = make_runs("k4", AMP, "UFS", [1, 2, 3], obits=4)
        runs += make_runs("k4", AMP, "TLPR", [1], obits=4)
        return runs
    if name == "amp_final":  # bf16 itself for longer, one GPU each; 5 bits: F, R, S; 6 bits: U
        long = dict(AMP, steps=60000)
        runs = make_runs("k7long", long, "U", [0], gpu_slot=0) + make_runs(
            "k7long", long, "F", [0], gpu_slot=1
        )
        runs += make_runs("k5", AMP, "RF", [0], obits=5, gpu_slot=2)
        runs += make_runs("k5", AMP, "S", [0], obits=5, gpu_slot=3) + make_runs(
            "k6", AMP, "U", [0], obits=6, gpu_slot=3
        )
        return runs
    if name == "bf16_long":  # real bf16, U and F, two seeds, one GPU each, until U explodes or 120k
        long = dict(AMP, steps=120_000, monitor_every=200, checkpoint_every=2_000)
        runs = []
        for slot, (variant, seed) in enumerate((("U", 1), ("F", 1), ("U", 2), ("F", 2))):
            runs += make_runs("k7x", long, variant, [seed], gpu_slot=slot)
        return runs
    if name == "bf16_real":  # real bf16 on one GPU: U, F, P, seeds 0 (the stored run's) and 1,
        # the stored run's schedule (cosine over 60,000 steps), then min_lr until U explodes or 80k
        real = dict(AMP, steps=80_000, decay_steps=60_000, checkpoint_every=2_000)
        return make_runs("bf16", real, "UFPZ", [0, 1])
    if name == "amp_bits":  # Ō with 5 and 6 bits: three seeds of U (and F on seed 1)
        resumable = dict(AMP, checkpoint_every=2_000)
        runs = make_runs("k5", resumable, "U", [1, 2, 3], obits=5)
        runs += make_runs("k6", resumable, "U", [1, 2, 3], obits=6)
        runs += make_runs("k5", resumable, "F", [1], obits=5) + make_runs(
            "k6", resumable, "F", [1], obits=6
        )
        return runs
    if name == "controls":  # bias or size? Ō with 4 bits, the failing path, its control, 5 controls
        resumable = dict(AMP, checkpoint_every=2_000)
        return make_runs("k4c", resumable, "UFBNMGX", [1, 2, 3], obits=4)
    if name == "amp_fixes":  # the fixes of the bias chapters in training, Ō with 4 bits
        resumable = dict(AMP, checkpoint_every=2_000)
        runs = make_runs("k4f", resumable, "CKD", [1, 2, 3], obits=4)
        # δ from rowsum(dP ∘ P), the alternative of chapter 6: seed 1 is k4-P-s1 (amp_seeds)
        return runs + make_runs("k4f", resumable, "P", [2, 3], obits=4)
    if name == "amp_head":  # the paper's per-head ablation, Ō with 4 bits, seeds 1-3
        return make_runs("k4h", dict(AMP, checkpoint_every=2_000), "H", [1, 2, 3], obits=4)
    if name == "testbed":  # the testbed's arms on the screen's healthy configuration, to 80k steps
        arms = dict(SCREEN_BASE, **SCREENS["sb-lr5e-4"], steps=80_000)
        runs = make_runs("tb", arms, "UWAF", [1, 2, 3, 4])
        # V: FA2 numerics' own control (does δ from the rounded O move W's runaway earlier?)
        runs += make_runs("tb", arms, "PZS", [1, 2])
        return runs + make_runs("tb", arms, "V", [1, 2, 3, 4])
    if name == "screen":  # a testbed whose control stays healthy? 20k-step screens of U and F
        runs = []
        for prefix, changes in SCREENS.items():
            runs += make_runs(prefix, {**SCREEN_BASE, **changes}, "UF", [1])
        # a second seed of the first screen (the paper's schedule unchanged)
        runs += make_runs("sa-paper", SCREEN_BASE, "UF", [2])
        return runs
    raise ValueError(f"unknown plan {name!r}; plans: {', '.join(PLANS)}")


PLANS = (
    "tiny",
    "probe",
    "probe2",
    "seeds",
    "amplify",
    "amp_seeds",
    "amp_final",
    "bf16_long",
    "bf16_real",
    "amp_bits",
    "controls",
    "amp_fixes",
    "amp_head",
    "screen",
    "testbed",
)
