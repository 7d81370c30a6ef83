"""Statistics of rounding errors: a mean with its standard error, and whether it is a bias.

One core, :func:`mean_ci`; :func:`mean_error` (chapter 1's additions) and :func:`bias_summary`
(attention outputs, whose rows are the independent units) are views of it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

NEGLIGIBLE_ULP = 0.02  # a statistically detectable mean below this is called negligible
Z95 = 1.96


def mean_ci(values, z: float = Z95) -> dict:
    """Mean, standard error (sample std / √n) and a normal-approximation interval of the finite
    entries of ``values``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().to(torch.float64).numpy()
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        return {"mean": math.nan, "se": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    mean = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return {"mean": mean, "se": se, "lo": mean - z * se, "hi": mean + z * se, "n": n}


@dataclasses.dataclass(frozen=True)
class MeanError:
    mean: float
    sem: float  # standard error of the mean
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.4f} ± {self.sem:.4f} ulp (n = {self.n:,})"


def mean_error(errors) -> MeanError:
    """Mean of ``errors`` with its standard error; every error must be finite."""
    e = np.asarray(errors, dtype=np.float64).ravel()
    if e.size < 2 or not np.all(np.isfinite(e)):
        raise ValueError("mean_error needs at least two finite errors")
    stats = mean_ci(e)
    return MeanError(stats["mean"], stats["se"], stats["n"])


def bias_summary(err: torch.Tensor) -> dict:
    """Bias of the errors ``err`` (..., rows, columns) in ulps.

    The mean is over all finite elements; its standard error is computed from the per-row means
    (elements of one row share P̄, so rows, not elements, are the independent units)."""
    err = err.to(torch.float64)
    finite = torch.isfinite(err)
    n_elem = int(finite.sum())
    if n_elem == 0:
        out = mean_ci([])
    else:
        rows = err.reshape(-1, err.shape[-1])
        fin = finite.reshape(-1, err.shape[-1])
        counts = fin.sum(-1)
        row_means = torch.where(fin, rows, torch.zeros_like(rows)).sum(-1) / counts.clamp(min=1)
        out = mean_ci(row_means[counts > 0])
        out["mean"] = float(err[finite].mean())
        out["lo"], out["hi"] = out["mean"] - Z95 * out["se"], out["mean"] + Z95 * out["se"]
    out["n_elements"] = n_elem
    out["nonfinite"] = int((~finite).sum())
    out["verdict"] = verdict(out)
    return out


def verdict(stats: dict) -> str:
    """Plain-language reading of a bias estimate."""
    mean, se = stats["mean"], stats["se"]
    if not math.isfinite(mean):
        return "no finite output to measure"
    if not math.isfinite(se) or se == 0:
        if mean == 0:
            return "no error at all"
        return f"biased: every sample has error {mean:+.3f} ulp"
    if abs(mean) <= Z95 * se:
        return f"not distinguishable from zero ({mean:+.3f} ± {Z95 * se:.3f} ulp)"
    direction = "upward" if mean > 0 else "downward"
    if abs(mean) < NEGLIGIBLE_ULP:
        return f"detectable but negligible ({mean:+.3f} ulp, below {NEGLIGIBLE_ULP})"
    return f"biased {direction}: {mean:+.3f} ulp (95% CI {stats['lo']:+.3f} .. {stats['hi']:+.3f})"


def is_biased(stats: dict) -> bool:
    """True when the mean is outside its 95% interval around zero and at least NEGLIGIBLE_ULP."""
    m, se = stats["mean"], stats["se"]
    if not math.isfinite(m):
        return False
    if not math.isfinite(se) or se == 0:
        return abs(m) >= NEGLIGIBLE_ULP
    return abs(m) > Z95 * se and abs(m) >= NEGLIGIBLE_ULP
