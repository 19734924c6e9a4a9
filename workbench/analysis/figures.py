"""Plotly figures of a run's recovery timeline and goodput breakdown, and the look every figure shares.

:func:`readable` is applied to each figure the notebooks, the dashboard and
the report show: text large enough for a projector (14 px, ticks included;
plotly's default is 12) and heights that fit a 768-pixel-high screen whole.
The browser test (tests/browser/test_classroom.py) measures them in chromium
at a laptop's and a projector's size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.recovery import MILESTONES

ROW_PX = 36  # plot-area pixels per fault: a bar a person can see and hover
PLOT_MIN_PX = 160  # the plot area of a one-fault timeline; the height grows with the rows, never the margins
FONT_PX = 14


def readable(fig):
    """The shared look: ``FONT_PX`` text (titles a little larger); returns ``fig``."""
    fig.update_layout(font=dict(size=FONT_PX), title_font_size=FONT_PX + 2)
    return fig


def timeline_figure(timeline: pd.DataFrame):
    """A Gantt-like plotly figure: one bar per fault, one segment per recovery phase."""
    fig = go.Figure()
    labels = [
        f"#{i} {r.action} r{r.target} @{r.t - timeline['t'].min():.0f}s" for i, r in enumerate(timeline.itertuples())
    ]
    prev = np.zeros(len(timeline))
    for name in MILESTONES:
        ends = timeline[name].to_numpy(dtype=float)
        ends_f = np.where(np.isnan(ends), prev, np.maximum(ends, prev))
        fig.add_bar(y=labels, x=ends_f - prev, base=prev, orientation="h", name=f"→ {name.replace('_', ' ')}")
        prev = ends_f
    # room for the row labels, and for the legend below the axis in up to three rows (a 600 px wide
    # notebook beside JupyterLab's file browser on a 1024 px projector wraps it; plotly then takes the
    # extra rows from the plot area, measured: 96 px left of 160 with b=120, 148 with b=190)
    margin = dict(l=150, r=20, t=50, b=210)
    fig.update_layout(
        barmode="overlay",
        xaxis_title="seconds after the fault",
        title="Recovery timeline",
        height=margin["t"] + margin["b"] + max(PLOT_MIN_PX, ROW_PX * len(timeline)),
        margin=margin,
        legend=dict(orientation="h", y=-0.35 * PLOT_MIN_PX / max(PLOT_MIN_PX, ROW_PX * len(timeline)), yanchor="top"),
        yaxis=dict(autorange="reversed"),
    )
    return readable(fig)


def goodput_figure(g: dict):
    """A bar per badput part of a ``goodput`` result."""
    parts = {k: v for k, v in g["badput_s"].items() if v > 0}
    fig = go.Figure(go.Bar(x=list(parts.values()), y=list(parts.keys()), orientation="h"))
    fig.update_layout(
        title=f"Badput: {g['lost_s']:.1f} s of full-rate work lost of {g['T_s']:.0f} s (goodput {g['goodput']:.3f})"
        if g.get("goodput")
        else "Badput",
        xaxis_title="full-rate seconds",
        height=60 + 60 + max(PLOT_MIN_PX, ROW_PX * len(parts)),
        margin=dict(t=60, b=60),
    )
    return readable(fig)
