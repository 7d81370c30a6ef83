"""The speed targets for the book's kernel: speed ratios against cuDNN and SDPA flash, and
what the cross-tile rule costs (:func:`targets`, :func:`targets_met`, the tables)."""

from __future__ import annotations

from ..attention.registry import label, short
from .records import BOOK_CROSS, BOOK_OFF

CUDNN, FLASH = label("sdpa-cudnn"), label("sdpa-flash")


def targets(rows) -> list[dict]:
    """Per (dtype, causal, N): the ratios with targets (None where a number is
    missing): book fwd / cuDNN fwd (≥ 0.8), book f+b / SDPA flash f+b (≥ 1.0), book f+b /
    cuDNN f+b (≥ 0.7), and the cross-tile rule's cost, 1 − cross / off (≤ 3%), fwd and f+b."""

    def get(impl, dtype, causal, n, mode):
        hit = [
            r["tflops"]
            for r in rows
            if r["impl"] == impl
            and r["dtype"] == dtype
            and bool(r["causal"]) == causal
            and r["n"] == n
            and r["mode"] == mode
            and r.get("tflops")
        ]
        return hit[0] if hit else None

    def ratio(a, b):
        return None if (a is None or b is None) else a / b

    out = []
    keys = sorted(
        {(r["dtype"], bool(r["causal"]), r["n"]) for r in rows},
        key=lambda k: (k[0], not k[1], k[2]),
    )
    for dtype, causal, n in keys:
        off = {m: get(BOOK_OFF, dtype, causal, n, m) for m in ("fwd", "fwd+bwd")}
        cross = {m: get(BOOK_CROSS, dtype, causal, n, m) for m in off}
        cudnn = {m: get(CUDNN, dtype, causal, n, m) for m in off}
        flash = {m: get(FLASH, dtype, causal, n, m) for m in off}
        row = dict(
            dtype=dtype,
            causal=causal,
            n=n,
            fwd_vs_cudnn=ratio(off["fwd"], cudnn["fwd"]),
            fb_vs_flash=ratio(off["fwd+bwd"], flash["fwd+bwd"]),
            fb_vs_cudnn=ratio(off["fwd+bwd"], cudnn["fwd+bwd"]),
        )
        for m, key in (("fwd", "rule_cost_fwd"), ("fwd+bwd", "rule_cost_fb")):
            r = ratio(cross[m], off[m])
            row[key] = None if r is None else 1 - r
        out.append(row)
    return out


TARGET_TESTS = {
    "fwd_vs_cudnn": lambda x: x >= 0.8,
    "fb_vs_flash": lambda x: x >= 1.0,
    "fb_vs_cudnn": lambda x: x >= 0.7,
    "rule_cost_fwd": lambda x: x <= 0.03,
    "rule_cost_fb": lambda x: x <= 0.03,
}


def targets_met(target_rows) -> dict:
    """{target: (met, measured)} over every row where the target could be evaluated."""
    summary = {}
    for key, test in TARGET_TESTS.items():
        values = [r[key] for r in target_rows if r[key] is not None]
        summary[key] = (sum(bool(test(v)) for v in values), len(values))
    return summary


def print_targets(target_rows, dtype="bf16", causal=True):
    fmt = lambda x: "   —  " if x is None else f"{x:6.2f}"  # noqa: E731
    pct = lambda x: "   —  " if x is None else f"{x:6.1%}"  # noqa: E731
    print(f"{dtype}, {'causal' if causal else 'no mask'}: book rule off against")
    print(
        f"{'N':>8s}{'fwd/cuDNN':>11s}{'f+b/flash':>11s}{'f+b/cuDNN':>11s}"
        f"{'rule fwd':>10s}{'rule f+b':>10s}"
    )
    for r in target_rows:
        if r["dtype"] == dtype and r["causal"] == causal:
            print(
                f"{r['n']:8d}{fmt(r['fwd_vs_cudnn']):>11s}{fmt(r['fb_vs_flash']):>11s}"
                f"{fmt(r['fb_vs_cudnn']):>11s}{pct(r['rule_cost_fwd']):>10s}"
                f"{pct(r['rule_cost_fb']):>10s}"
            )


TARGET_TEXT = {
    "fwd_vs_cudnn": (f"forward ≥ 0.8 × {short('sdpa-cudnn')}", 0.8),
    "fb_vs_flash": (f"fwd + bwd ≥ {short('sdpa-flash')}", 1.0),
    "fb_vs_cudnn": (f"fwd + bwd ≥ 0.7 × {short('sdpa-cudnn')}", 0.7),
    "rule_cost_fwd": ("cross-tile rule costs ≤ 3%, fwd", 0.03),
    "rule_cost_fb": ("cross-tile rule costs ≤ 3%, f+b", 0.03),
}


def print_targets_met(target_rows):
    """In how many settings (dtype, mask, N) each target is met, and at which N it is not."""
    for key, (met, total) in targets_met(target_rows).items():
        missed = sorted(
            {r["n"] for r in target_rows if r[key] is not None and not TARGET_TESTS[key](r[key])}
        )
        where = (
            ("missed at N = " + ", ".join(f"{n // 1024}k" for n in missed))
            if missed
            else "met everywhere"
        )
        print(f"  {TARGET_TEXT[key][0]:33s}{met:3d} of {total}   {where}")
