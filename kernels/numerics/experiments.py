"""Chapter 1's experiments: signed rounding errors of many additions, and its two plots."""

from __future__ import annotations

import numpy as np

from .formats import FORMATS, get_format, round_to, ulp
from .stats import mean_error

KINDS = ("random", "carry", "carry+residual")


def rounding_errors(
    n: int,
    kind: str = "random",
    fmt="bf16",
    rng=None,
    *,
    sign: float = -1.0,
    residual_ulps: float = 0.1,
    acc_fmt="fp32",
) -> np.ndarray:
    """Signed rounding errors, in ulps of ``fmt`` at the exact sum, of ``n`` additions acc + b.

    ``b`` is a ``fmt`` value and ``acc`` an ``acc_fmt`` accumulator; the exact sum is rounded once
    to ``fmt`` (:func:`round_to`). ``kind`` chooses the operands:

    ``"random"``
        acc and b of random signs and magnitudes (log-uniform over 2^-4 .. 2^4), acc with a full
        ``acc_fmt`` significand.
    ``"carry"``
        acc and b are two ``fmt`` values of one sign (``sign``) in the same binade, so their
        significands always carry out; nothing else.
    ``"carry+residual"``
        as ``"carry"``, but acc also holds a small residual of the same sign (uniform in
        (0, ``residual_ulps``) ulps of acc's ``fmt`` value), added in the ``acc_fmt`` accumulator:
        the paper's Claim 3 (an accumulated sum of other small terms before the second large one).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid kinds are {', '.join(map(repr, KINDS))}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if sign not in (-1, 1, -1.0, 1.0):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    f, fa = get_format(fmt), get_format(acc_fmt)
    rng = np.random.default_rng(rng)
    if kind == "random":
        signs = rng.choice([-1.0, 1.0], size=(2, n))
        mags = np.exp2(rng.uniform(-4, 4, size=(2, n)))
        acc = round_to(signs[0] * mags[0], fa)
        b = round_to(signs[1] * mags[1], f)
    else:
        binade = rng.integers(-3, 4, size=n)  # both operands in [2^k, 2^(k+1))
        sig = rng.integers(2**f.fraction_bits, 2**f.precision, size=(2, n))
        a_val, b = sign * np.ldexp(sig.astype(np.float64), binade - f.fraction_bits)
        residual = 0.0
        if kind == "carry+residual":
            residual = sign * rng.uniform(0, residual_ulps, size=n) * ulp(a_val, f)
        acc = round_to(a_val + residual, fa)
        b = np.asarray(b)
    exact = acc + b
    if not (np.all(exact - acc == b) and np.all(exact - b == acc)):  # float64 held the sum exactly
        raise ArithmeticError("a sum was not exact in float64; reduce the magnitude range")
    return (round_to(exact, f) - exact) / ulp(exact, f)


def plot_ulp(axes=None, formats=None):
    """Log-log plots of ulp(x) against x > 0 for each format: the whole range, and a zoom around 1.

    Each line runs from the format's smallest subnormal to its largest value (marked with a dot).
    Returns the two axes.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(2, 1, figsize=(6.8, 8), layout="constrained")
    styles = ["-", "-", "--", "-", ":"]
    zoom = (2.0**-16, 2.0**17)
    for style, name in zip(styles, formats or FORMATS):
        f = get_format(name)
        x = np.geomspace(f.smallest_subnormal, f.max, 6000)
        for ax in axes:
            (line,) = ax.step(
                x,
                ulp(x, f),
                where="post",
                linestyle=style,
                linewidth=1.6,
                label=f"{f.label} ({f.fraction_bits} fraction bits)",
            )
            ax.plot([f.max], [ulp(f.max, f)], "o", color=line.get_color(), markersize=4)
    for ax, title in zip(
        axes, ("whole range (flat left ends: subnormals)", "zoom: each step is one binade")
    ):
        ax.set_xscale("log", base=10)
        ax.set_yscale("log", base=10)
        ax.set_xlabel("value x")
        ax.set_ylabel("ulp(x): gap to the next number")
        ax.set_title(title)
    axes[1].set_xlim(*zoom)
    axes[1].set_ylim(2.0**-42, 2.0**16)
    axes[0].legend(fontsize=9, loc="upper left")
    return axes


def plot_error_hist(errors_by_kind: dict, ax=None, bins=None):
    """Overlaid histograms of signed rounding errors (ulps), one per experiment."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.8, 4))
    bins = np.linspace(-0.5, 0.5, 41) if bins is None else bins
    for label, errs in errors_by_kind.items():
        m = mean_error(errs)
        _, _, patches = ax.hist(
            errs,
            bins=bins,
            histtype="step",
            linewidth=1.6,
            density=True,
            label=f"{label}: mean {m.mean:+.3f} ± {m.sem:.3f}",
        )
        ax.axvline(m.mean, linestyle="--", linewidth=1, color=patches[0].get_edgecolor())
    ax.set_xlabel("rounding error (rounded − exact), in ulps at the exact sum; dashed: means")
    ax.set_ylabel("density")
    ax.legend(fontsize=9)
    return ax
