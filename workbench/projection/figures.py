"""Goodput against scale for the three strategies, the crossings marked, a measured run on the same axes."""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.projection.model import STRATEGIES, Projection

NAMES = {
    "checkpoint-restart": "checkpoint-restart",
    "elastic": "per-step elastic (torchft)",
    "diloco": "semi-synchronous (DiLoCo)",
}


def vs_scale(
    projection: Projection,
    gpus: Sequence[int],
    device_mtbf_h: Union[float, Callable, None] = None,
    replicates: int = 16,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (accelerators, strategy): goodput, its standard error, the job MTBF and Daly's period.

    ``device_mtbf_h``: a number, a function of the accelerator count (a published MTTF curve), or None
    (the projection's own).
    """
    rows = []
    for n in gpus:
        changes = {"gpus": int(n)}
        if device_mtbf_h is not None:
            changes["device_mtbf_h"] = float(device_mtbf_h(n) if callable(device_mtbf_h) else device_mtbf_h)
        res = projection.replace(**changes).run(replicates=replicates, seed=seed)
        for s in STRATEGIES:
            rows.append(
                {
                    "gpus": int(n),
                    "strategy": s,
                    "goodput": res[s]["goodput"],
                    "stderr": res[s]["stderr"],
                    "job_mtbf_h": res["job_mtbf_s"] / 3600,
                    "period_s": res["checkpoint-restart"]["period_s"],
                }
            )
    return pd.DataFrame(rows)


def crossings(curves: pd.DataFrame) -> pd.DataFrame:
    """Where two strategies' goodput curves cross: accelerators (log-interpolated), goodput, the pair."""
    wide = curves.pivot(index="gpus", columns="strategy", values="goodput").sort_index()
    x = np.log(wide.index.to_numpy(dtype=float))
    rows = []
    for i, a in enumerate(STRATEGIES):
        for b in STRATEGIES[i + 1 :]:
            d = (wide[a] - wide[b]).to_numpy()
            for k in np.flatnonzero(np.sign(d[:-1]) * np.sign(d[1:]) < 0):
                f = d[k] / (d[k] - d[k + 1])
                xc = x[k] + f * (x[k + 1] - x[k])
                ya = wide[a].to_numpy()
                rows.append(
                    {
                        "gpus": float(np.exp(xc)),
                        "goodput": float(ya[k] + f * (ya[k + 1] - ya[k])),
                        "a": a,
                        "b": b,
                        "below": a if d[k] > 0 else b,
                    }
                )
    return pd.DataFrame(rows, columns=["gpus", "goodput", "a", "b", "below"])


def scale_figure(curves: pd.DataFrame, measured: Optional[dict] = None, title: str = ""):
    """Goodput vs accelerators (log axis), one line per strategy, crossings as markers; ``measured``:
    ``{"gpus", "goodput", "strategy", "label"}`` of a run on this machine."""
    fig = go.Figure()
    for s in STRATEGIES:
        c = curves[curves["strategy"] == s]
        fig.add_scatter(
            x=c["gpus"],
            y=c["goodput"],
            mode="lines+markers",
            name=NAMES[s],
            error_y=dict(type="data", array=c["stderr"], visible=True),
        )
    x = crossings(curves)
    if len(x):
        fig.add_scatter(
            x=x["gpus"],
            y=x["goodput"],
            mode="markers+text",
            name="crossing",
            marker=dict(size=12, symbol="x", color="black"),
            text=[f"{g:,.0f}" for g in x["gpus"]],
            textposition="top center",
        )
    if measured is not None:
        fig.add_scatter(
            x=[measured["gpus"]],
            y=[measured["goodput"]],
            mode="markers+text",
            name="measured here",
            marker=dict(size=13, symbol="star"),
            text=[measured.get("label", "this machine")],
            textposition="bottom right",
        )
    fig.update_layout(
        title=title or "Projected goodput vs scale",
        xaxis_type="log",
        xaxis_title="accelerators",
        yaxis_title="goodput (useful / ideal)",
        legend_orientation="h",
        height=460,
    )
    return fig
