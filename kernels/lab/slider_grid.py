"""The website's version of the lab's sliders: a grid of β values computed once, drawn as a Plotly
figure with a slider (no Python needed to move it).

For each β on the grid and each V setting, the cross-tile offset rule runs in FA2 numerics on
the same rows, and the figure shows the mean error of O (the bias) and its rms, in ulps, next
to the rule switched off. Extreme values are kept on the grid on purpose: β just above 1 gives
P̄ = 1 back, a huge β underflows ℓ, and what happened is written into the hover text.
"""

from __future__ import annotations

import math

import torch

from ..attention import emulator
from ..attention.options import AttentionOptions
from ..numerics.rounding import error_in_ulps
from .cases import Case, VDist, build, reference

BETAS = (1.0005, 1.001, 1.01, 1.1, 1.5, 2.0, 4.0, 8.0, 64.0)
V_SETTINGS = {
    "tied −1, other 0": (-1.0, 0.0),
    "tied −1, other −1": (-1.0, -1.0),
    "tied 0, other −1": (0.0, -1.0),
    "tied +1, other 0": (1.0, 0.0),
}


def _stats(out, exact):
    err = error_in_ulps(out.float(), exact)
    fin = err[torch.isfinite(err)]
    n_bad = int((~torch.isfinite(err)).sum())
    if fin.numel() == 0:
        return math.nan, math.nan, n_bad
    return float(fin.mean()), float(fin.pow(2).mean().sqrt()), n_bad


def beta_grid(
    betas=BETAS, v_settings=V_SETTINGS, n_keys=512, batch=4, row_max=2.0, seed=0
) -> list[dict]:
    """One record per (V setting, β): bias, rms and non-finite outputs with the rule, and the
    same without it (β = None)."""
    records = []
    for name, (vt, vr) in v_settings.items():
        case = Case(
            n_keys=n_keys,
            ties=2,
            gap=15.6,
            batch=batch,
            row_max=row_max,
            v_tied=VDist("normal", vt, 0.3),
            v_rest=VDist("normal", vr, 0.3),
        )
        built = build(case, seed)
        exact = reference(built)
        for beta in (None, *betas):
            opts = AttentionOptions(
                scale=1.0,
                block_n=case.block_n,
                stable="off" if beta is None else "cross",
                beta=beta or 2.0,
            )
            res = emulator.flash_forward(built.q, built.k, built.v, opts)
            bias, rms, bad = _stats(res.out, exact)
            records.append(
                dict(
                    setting=name,
                    beta=beta,
                    bias=bias,
                    rms=rms,
                    nonfinite=bad,
                    outputs=int(exact.numel()),
                )
            )
    return records


def beta_slider_figure(records):
    """A Plotly bar chart of the bias per V setting, with the rule off as grey bars and a slider
    over β for the rule's bars."""
    import plotly.graph_objects as go

    settings = list(dict.fromkeys(r["setting"] for r in records))
    betas = [b for b in dict.fromkeys(r["beta"] for r in records) if b is not None]
    by = {(r["setting"], r["beta"]): r for r in records}
    fig = go.Figure()
    fig.add_bar(
        x=settings,
        y=[by[(s, None)]["bias"] for s in settings],
        name="rule off",
        marker_color="#9e9e9e",
    )
    for beta in betas:
        rows = [by[(s, beta)] for s in settings]
        text = [
            f"rms {r['rms']:.2f} ulp; {r['nonfinite']} of {r['outputs']} outputs not finite"
            for r in rows
        ]
        fig.add_bar(
            x=settings,
            y=[r["bias"] for r in rows],
            name=f"β = {beta:g}",
            hovertext=text,
            marker_color="#1f77b4",
            visible=(beta == 2.0),
        )
    steps = [
        dict(
            method="update",
            label=f"{beta:g}",
            args=[{"visible": [True] + [j == i for j in range(len(betas))]}],
        )
        for i, beta in enumerate(betas)
    ]
    fig.update_layout(
        sliders=[
            dict(
                active=betas.index(2.0), steps=steps, currentvalue={"prefix": "β = "}, pad={"t": 40}
            )
        ],
        barmode="group",
        height=460,
        font=dict(size=14),
        yaxis_title="mean error of O [ulp]",
        xaxis_title="V of the tied / the other tokens",
        title="Cross-tile offset rule: move β and watch the bias",
        margin=dict(l=70, r=20, t=100, b=40),
        # the legend above the plot area, under the title: over the bars it hid the tallest one
        legend=dict(orientation="h", x=1, xanchor="right", y=1.02, yanchor="bottom"),
    )
    return fig
