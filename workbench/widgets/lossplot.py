"""The dashboard's loss plot template: one line per replica group, one marker trace per event kind.

The figure built here holds no points: it is the
:class:`~workbench.widgets.liveplot.LivePlot`'s ``spec`` (layout and trace
styles, :func:`~workbench.widgets.liveplot.live_spec`); the points come from
:class:`~workbench.widgets.appendplot.PlotFeed`, which names marker traces by
``MARKER_NAMES``. Trace ``r`` is replica group ``r``; the marker traces follow
in ``MARKER_STYLE``'s order (:func:`marker_traces`).
"""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.analysis.figures import readable

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKER_NAMES = {
    "fault": "faults",
    "heal": "heals",
    "checkpoint": "checkpoints",
    "restore": "restarts",
    "diverged": "diverged",
    "sync": "syncs",
}
# Below the plot, from the figure's bottom edge: above it, at the top right, plotly's toolbar
# (which appears on hover) covers it (tests/browser/test_classroom.py measures both boxes).
LEGEND_BELOW = dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left")
MARKER_STYLE = {
    "fault": dict(symbol="x", size=13, color="#d50000", line=dict(width=1, color="#7f0000")),
    "heal": dict(symbol="triangle-up", size=12, color="#00c853", line=dict(width=1, color="#1b5e20")),
    "checkpoint": dict(symbol="diamond", size=10, color="#ffd600", line=dict(width=1, color="#6d5f00")),
    "restore": dict(symbol="star", size=14, color="#ff6d00", line=dict(width=1, color="#7f3600")),
    "diverged": dict(symbol="octagon", size=14, color="#000000", line=dict(width=2, color="#d50000")),
    "sync": dict(symbol="line-ns-open", size=12, color="#37474f", line=dict(width=2, color="#37474f")),
}


def marker_traces(replicas: int) -> dict[str, int]:
    """The index of each marker kind's trace in :func:`loss_figure` of ``replicas`` groups."""
    return {kind: replicas + i for i, kind in enumerate(MARKER_STYLE)}


def loss_figure(replicas: int) -> go.Figure:
    """Loss against step (or wall time): a line per group, then the marker traces; no points."""
    traces = [
        go.Scatter(
            x=[],
            y=[],
            mode="lines",
            name=f"replica {r}",
            line=dict(color=COLORS[r % len(COLORS)], width=1.5),
            hovertemplate=f"replica {r}<br>step %{{customdata:.0f}}<br>loss %{{y:.4f}}<extra></extra>",
        )
        for r in range(replicas)
    ]
    for kind, style in MARKER_STYLE.items():
        traces.append(
            go.Scatter(
                x=[],
                y=[],
                mode="markers",
                name=MARKER_NAMES[kind],
                marker=style,
                hovertemplate="%{text}<br>step %{customdata:.0f}<br>loss %{y:.4f}<extra></extra>",
            )
        )
    fig = go.Figure(
        traces,
        layout=dict(
            height=380,
            margin=dict(l=60, r=10, t=50, b=80),
            title=dict(text="loss", x=0.01, font=dict(size=13)),
            xaxis=dict(title=dict(text="step")),
            yaxis=dict(title=dict(text="loss")),
            legend=LEGEND_BELOW,
            uirevision="keep",
            hovermode="closest",
        ),
    )
    readable(fig)
    return fig
