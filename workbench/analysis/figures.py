"""Plotly figures of a run's recovery timeline and goodput breakdown."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .recovery import MILESTONES


def timeline_figure(timeline: pd.DataFrame):
    """A Gantt-like plotly figure: one bar per fault, one segment per recovery phase."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [f"#{i} {r.action} r{r.target} @{r.t - timeline['t'].min():.0f}s" for i, r in enumerate(timeline.itertuples())]
    prev = np.zeros(len(timeline))
    for name in MILESTONES:
        ends = timeline[name].to_numpy(dtype=float)
        ends_f = np.where(np.isnan(ends), prev, np.maximum(ends, prev))
        fig.add_bar(y=labels, x=ends_f - prev, base=prev, orientation="h", name=f"→ {name.replace('_', ' ')}")
        prev = ends_f
    fig.update_layout(barmode="overlay", xaxis_title="seconds after the fault", height=120 + 40 * len(timeline),
                      title="Recovery timeline", legend_orientation="h")
    return fig


def goodput_figure(g: dict):
    """A bar per badput part of a ``goodput`` result."""
    import plotly.graph_objects as go

    parts = {k: v for k, v in g["badput_s"].items() if v > 0}
    fig = go.Figure(go.Bar(x=list(parts.values()), y=list(parts.keys()), orientation="h"))
    fig.update_layout(
        title=f"Badput: {g['lost_s']:.1f} s of full-rate work lost of {g['T_s']:.0f} s (goodput {g['goodput']:.3f})"
        if g.get("goodput") else "Badput", xaxis_title="full-rate seconds", height=320,
    )
    return fig
