"""The figures of a comparison of runs (``compare``): loss curves overlaid with each run's faults,
each figure against a swept parameter, parallel coordinates; a sweep's report page built from them.

Every figure is plotly and drawn from ``compare``'s table and curves, so it
shows what the table says. The runs are :class:`~workbench.analysis.compare.ComparedRun`
(``Run`` objects; a caller attaches run directories). A sweep is read through
its public interface only (``runs()``, ``points``, ``table()``; experiments
sit above analysis).
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative, sample_colorscale
from plotly.subplots import make_subplots

from workbench.analysis import compare
from workbench.analysis.figures import readable
from workbench.analysis.useful import decided


def colors_for(values: Sequence[Any]) -> list[str]:
    """A colour per value: a Viridis scale for numbers, a qualitative palette otherwise."""
    vals = list(values)
    numeric = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None]
    if vals and len(numeric) == len(vals):
        lo, hi = min(numeric), max(numeric)
        if hi > lo and lo > 0 and hi / lo >= 10:
            pos = [(np.log(v) - np.log(lo)) / (np.log(hi) - np.log(lo)) for v in numeric]
        else:
            pos = [(v - lo) / (hi - lo) if hi > lo else 0.5 for v in numeric]
        return sample_colorscale("Viridis", [0.9 * p for p in pos])
    palette = qualitative.Plotly
    distinct = list(dict.fromkeys(map(repr, vals)))
    return [palette[distinct.index(repr(v)) % len(palette)] for v in vals]


def loss_figure(
    runs: Sequence[compare.ComparedRun],
    labels: Optional[Sequence[str]] = None,
    color_values: Optional[Sequence[Any]] = None,
    color_by: Optional[str] = None,
    x: str = "step",
    title: str = "loss",
) -> go.Figure:
    """Overlay of the runs' loss curves (mean over replica groups per committed step).

    ``color_values`` (one per run) colour the curves by a parameter;
    ``color_by`` names it in the legend. ``x`` is ``step`` or ``time``
    (seconds since the run's first committed step).
    """
    labels = list(labels) if labels is not None else [r.id for r in runs]
    colors = colors_for(color_values) if color_values is not None else colors_for(list(range(len(runs))))
    fig = go.Figure()
    for i, (run, label) in enumerate(zip(runs, labels)):
        run.refresh()
        curve = compare.committed_losses(decided(run.events_read))
        xs = curve["step"] if x == "step" else curve["t"] - (curve["t"].min() if len(curve) else 0.0)
        fig.add_scatter(
            x=xs,
            y=curve["loss"],
            mode="lines",
            name=label,
            line=dict(color=colors[i], width=1.6),
            hovertemplate=f"{label}<br>{x} %{{x}}<br>loss %{{y:.4f}}<extra></extra>",
        )
        faults = compare.fault_steps(run)
        if not faults.empty and not curve.empty:
            fx = faults["step"] if x == "step" else faults["t_s"]
            fy = np.interp(faults["step"], curve["step"], curve["loss"])
            fig.add_scatter(
                x=fx,
                y=fy,
                mode="markers",
                showlegend=False,
                name=f"{label} faults",
                marker=dict(symbol="x", size=11, color=colors[i], line=dict(width=1, color="#7f0000")),
                text=[f"{a} r{t} ({o})" for a, t, o in zip(faults["action"], faults["target"], faults["origin"])],
                hovertemplate=f"{label}<br>%{{text}}<br>step %{{x}}<extra></extra>",
            )
    # the legend above the plot, across: a column of run labels beside it would take a projector's width
    fig.update_layout(
        title=title,
        xaxis_title="step" if x == "step" else "seconds since first committed step",
        yaxis_title="loss",
        height=400,
        margin=dict(t=110),
        legend=dict(
            orientation="h",
            y=1.02,
            yanchor="bottom",
            x=0,
            xanchor="left",
            title_text=(color_by or "").rsplit(".", 1)[-1],
        ),
    )
    return readable(fig)


def metrics_figure(df: pd.DataFrame, x: str, metrics: Sequence[str] = compare.METRICS) -> go.Figure:
    """Small multiples: each metric against the parameter ``x``, one panel per metric, markers by state."""
    metrics = [m for m in metrics if m in df and df[m].notna().any()]
    cols = max(1, min(3, len(metrics)))  # three panels across at most: each keeps a readable width on a projector
    rows = max(1, -(-len(metrics) // cols))
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[m.replace("_", " ") for m in metrics],
        vertical_spacing=0.2 if rows > 1 else 0.1,
    )
    state_colors = {"completed": "#1e88e5", "failed": "#e53935", "stopped": "#757575"}
    xs = df[x].map(lambda v: v if isinstance(v, (int, float)) else repr(v))
    label = x.rsplit(".", 1)[-1]
    for j, m in enumerate(metrics):
        row, col = divmod(j, cols)
        fig.add_scatter(
            x=xs,
            y=df[m],
            mode="markers+lines",
            row=row + 1,
            col=col + 1,
            showlegend=False,
            name=m,
            line=dict(color="#90a4ae", width=1),
            marker=dict(size=10, color=[state_colors.get(s, "#ffb300") for s in df.get("state", [])]),
            text=df.get("run_id"),
            hovertemplate=f"{x}=%{{x}}<br>{m}=%{{y:.4g}}<br>%{{text}}<extra></extra>",
        )
        fig.update_xaxes(title_text=label, row=row + 1, col=col + 1)
        if pd.api.types.is_numeric_dtype(df[x]) and df[x].min() > 0 and df[x].max() / df[x].min() >= 10:
            fig.update_xaxes(type="log", row=row + 1, col=col + 1)
    fig.update_layout(height=90 + 270 * rows, title="figures by " + label, margin=dict(t=90))
    return readable(fig)


def stall_figure(table: pd.DataFrame, key: str, unit_s: float = 0.001, label: Optional[str] = None) -> go.Figure:
    """Survivor stall against the swept ``key`` (notebook 04: the heartbeat timeout), with the line
    stall = key for reference; ``unit_s`` is the seconds one unit of ``key`` is (ms: 0.001)."""
    fig = go.Figure()
    fig.add_scatter(
        x=table[key], y=table["survivor_stall_s"], mode="markers+lines", name="survivor stall", marker=dict(size=11)
    )
    top = float(pd.to_numeric(table[key], errors="coerce").max() or 0)
    fig.add_scatter(
        x=[0, top], y=[0, top * unit_s], mode="lines", name="stall = timeout", line=dict(dash="dash", color="gray")
    )
    fig.update_layout(
        xaxis_title=label or key,
        yaxis_title="survivor stall (s)",
        height=400,
        margin=dict(t=100),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, xanchor="left"),
    )
    return readable(fig)


def parallel_figure(df: pd.DataFrame, columns: Sequence[str], color: Optional[str] = None) -> go.Figure:
    """Parallel coordinates over ``columns`` (numeric ones; categories are coded), coloured by ``color``."""
    dims = []
    for c in columns:
        if c not in df or df[c].isna().all():
            continue
        s = df[c]
        if pd.api.types.is_numeric_dtype(s):
            dims.append(dict(label=c, values=s.astype(float)))
        else:
            cats = list(dict.fromkeys(map(repr, s)))
            dims.append(
                dict(label=c, values=[cats.index(repr(v)) for v in s], tickvals=list(range(len(cats))), ticktext=cats)
            )
    line = {}
    if color and color in df and pd.api.types.is_numeric_dtype(df[color]) and df[color].notna().any():
        line = dict(color=df[color].astype(float), colorscale="Viridis", showscale=True)
    fig = go.Figure(go.Parcoords(dimensions=dims, line=line))
    fig.update_layout(height=360, title="parameters and figures")
    return fig


def comparison_figures(
    runs: Sequence[compare.ComparedRun],
    labels: Optional[Sequence[str]] = None,
    params: Optional[Sequence[Mapping[str, Any]]] = None,
    color_by: Optional[str] = None,
) -> list[go.Figure]:
    """Loss overlay, then (with ``params``) small multiples against ``color_by`` and parallel coordinates."""
    keys = compare.param_keys(params)
    color_by = color_by or (keys[0] if keys else None)
    values = [p.get(color_by) for p in params] if params is not None and color_by else None
    if labels is None:
        labels = (
            [", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in p.items()) or r.id for r, p in zip(runs, params)]
            if params is not None
            else [r.id for r in runs]
        )
    figs = [loss_figure(runs, labels=labels, color_values=values, color_by=color_by)]
    if params is not None and color_by:
        df = compare.table(runs, params=params)
        figs.append(metrics_figure(df, color_by))
        if len(keys) > 1:
            figs.append(parallel_figure(df, keys + [m for m in compare.METRICS if m in df], color="final_loss"))
    return figs


def sweep_report_figures(sweep: Any, color_by: Optional[str] = None) -> list[go.Figure]:
    """The figures of a sweep for a report: loss curves coloured by a swept key, figures by that key,
    parallel coordinates when more than one key was swept. Only submitted points are drawn."""
    runs = sweep.runs()
    idx = sorted(runs)
    params = [sweep.points[i] for i in idx]
    labels = [f"p{i}: " + ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in sweep.points[i].items()) for i in idx]
    if not idx:
        return []
    return comparison_figures([runs[i] for i in idx], labels=labels, params=params, color_by=color_by)


def replay_comparison(original: compare.ComparedRun, replay: compare.ComparedRun) -> dict:
    """An original and its replay side by side: ``table``, ``faults`` (fault by fault), ``figure``."""
    runs = [original, replay]
    labels = ["original", "replay"]
    return {
        "table": compare.table(runs, labels=labels),
        "faults": compare.faults_side_by_side(runs, labels),
        "figure": loss_figure(runs, labels=labels, title="original vs replay"),
    }


def sweep_report_html(sweep: Any) -> str:
    """A self-contained HTML page for a sweep: status, the comparison table, the figures (``workbench report``)."""
    table = sweep.table().drop(columns=["run_dir"], errors="ignore")
    parts = [
        f"<h1>sweep {html.escape(sweep.id)}</h1>",
        f"<p>{html.escape(sweep.state())} · {len(sweep)} points over {html.escape(', '.join(sweep.params))}"
        f" · max_parallel {sweep.max_parallel}</p>",
        "<h2>Comparison</h2>" + table.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="–"),
    ]
    for i, fig in enumerate(sweep_report_figures(sweep)):
        parts.append(pio.to_html(fig, include_plotlyjs="inline" if i == 0 else False, full_html=False))
    parts.append("<h2>Base spec</h2><pre>" + html.escape(json.dumps(sweep.record["base"], indent=2)) + "</pre>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>workbench sweep report</title></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )
