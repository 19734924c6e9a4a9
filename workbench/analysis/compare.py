"""Comparing runs: a table of their figures, overlaid loss curves, fault schedules side by side.

Works on any list of runs (``Run`` objects or run directories): the points of a
sweep, an original and its replay, runs picked by hand. Everything is computed
from each run's event log, so a finished sweep compares the same from any
kernel. Tables are pandas, figures plotly.

Figures in the table, per run:

A semi-synchronous run's inner steps count as committed only once a sync
kept them (``analysis.useful.decided``): a window that a voted-down sync threw
away is in no figure.

- ``final_loss``: the mean loss of committed, participating steps in the last
  5% of the run's committed steps (at least the last step), over every replica
  group, so one noisy batch does not decide a comparison; NaN when the run
  diverged (a NaN is never averaged away into a finite number).
- ``diverged_at``: the first committed step whose loss was NaN or infinite
  (empty for a run that did not diverge).
- ``steps_per_s``: committed steps per second of wall time, first to last
  committed step (faults included: it is the rate the run achieved).
- ``goodput``: ``analysis.goodput`` (useful work against the run's own
  fault-free rate), where that analysis is available.
- ``survivor_stall_s``, ``kill_to_rejoin_s``, ``survivor_steps_lost``:
  ``analysis.summary``.
- ``participants_at_fault``: the quorum size just before the first fault
  (did the fault hit a group that was taking part?).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale
from plotly.subplots import make_subplots

from workbench import analysis
from workbench.analysis.figures import readable
from workbench.analysis.useful import decided
from workbench.run.handle import Run, attach

RunLike = Union[Run, str, os.PathLike]
METRICS = ("final_loss", "diverged_at", "steps_per_s", "goodput", "survivor_stall_s", "kill_to_rejoin_s")
SUMMARY_KEYS = (
    "steps_completed",
    "faults",
    "restarts",
    "heals",
    "survivor_steps_lost",
    "survivor_stall_s",
    "kill_to_rejoin_s",
)
SUMMARY_COLUMNS = {"faults": "faults_injected", "steps_completed": "steps"}


def as_run(run: RunLike) -> Run:
    return run if isinstance(run, Run) else attach(run)


def committed_losses(events: list[dict]) -> pd.DataFrame:
    """Committed, participating steps: ``step``, ``t``, ``loss`` (mean over replica groups)."""
    df = analysis.metrics_frame(events)
    if df.empty:
        return pd.DataFrame(columns=["step", "t", "loss"])
    df = df[df["committed"].astype(bool) & df["participating"].fillna(True).astype(bool)]
    df = df.dropna(subset=["loss"])
    if df.empty:
        return pd.DataFrame(columns=["step", "t", "loss"])
    return df.groupby("step", as_index=False).agg(t=("t", "min"), loss=("loss", "mean"))


def diverged_at(events: list[dict]) -> Optional[int]:
    """The first committed, participating step whose loss was written as NaN or infinite."""
    bad = [
        e.get("step")
        for e in events
        if e.get("kind") == "step"
        and e.get("committed")
        and e.get("participating", True) is not False
        and isinstance(e.get("loss"), float)
        and not np.isfinite(e["loss"])
    ]
    return min((s for s in bad if isinstance(s, int)), default=None)


def final_loss(curve: pd.DataFrame) -> Optional[float]:
    if curve.empty:
        return None
    last = curve["step"].max()
    window = max(1, int(round(0.05 * len(curve))))
    return float(curve[curve["step"] > last - window]["loss"].mean())


def steps_per_s(curve: pd.DataFrame) -> Optional[float]:
    if len(curve) < 2:
        return None
    dt = float(curve["t"].max() - curve["t"].min())
    return float((curve["step"].max() - curve["step"].min()) / dt) if dt > 0 else None


_FIGURES: dict[str, tuple[int, dict]] = {}


def run_figures(run: Run) -> dict:
    """The comparison figures of one run (see the module docstring).

    Cached per run directory while its event count is unchanged: a live view
    refreshing a sweep recomputes only the runs that moved.
    """
    run.refresh()
    cached = _FIGURES.get(str(run.run_dir))
    if cached is not None and cached[0] == len(run.events_read):
        return dict(cached[1])
    events, judged = run.events_read, decided(run.events_read)  # the analyses decide for themselves
    curve = committed_losses(judged)
    timeline = analysis.recovery_timeline(events)
    summary = analysis.summary(events, run.spec, timeline)
    diverged = diverged_at(judged)
    row: dict[str, Any] = {
        "run_id": run.id,
        "state": summary["state"],
        "final_loss": float("nan") if diverged is not None else final_loss(curve),
        "diverged_at": diverged,
        "steps_per_s": steps_per_s(curve),
    }
    if hasattr(analysis, "goodput"):
        try:
            row["goodput"] = analysis.goodput(events, run.spec, timeline).get("goodput")
        except Exception:  # an analysis that cannot judge this run leaves the cell empty
            row["goodput"] = None
    row.update({SUMMARY_COLUMNS.get(k, k): summary.get(k) for k in SUMMARY_KEYS})
    row["participants_at_fault"] = participants_at_first_fault(judged)
    row["run_dir"] = str(run.run_dir)
    _FIGURES[str(run.run_dir)] = (len(run.events_read), dict(row))
    return row


def participants_at_first_fault(events: list[dict]) -> Optional[int]:
    """The quorum size of the last committed step before the first fault: whether the fault hit a
    group that was taking part (a group killed before it joined stalls nobody)."""
    faults = [e["t"] for e in events if e.get("kind") == "fault" and e.get("action") != "resume"]
    if not faults:
        return None
    before = [e for e in events if e.get("kind") == "step" and e.get("committed") and e["t"] <= min(faults)]
    return max(before, key=lambda e: e["t"]).get("participants") if before else None


def table(
    runs: Sequence[Optional[RunLike]],
    params: Optional[Sequence[Mapping[str, Any]]] = None,
    labels: Optional[Sequence[str]] = None,
) -> pd.DataFrame:
    """One row per run: its parameters (``params[i]``), label, and figures.

    A ``None`` in ``runs`` (a sweep point not submitted yet) gives a row of
    parameters with empty figures.
    """
    rows = []
    for i, r in enumerate(runs):
        row: dict[str, Any] = {}
        if labels is not None:
            row["label"] = labels[i]
        if params is not None:
            row.update(params[i])
        if r is not None:
            for k, v in run_figures(as_run(r)).items():
                row[f"{k} (run)" if k in row else k] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    lead = (["label"] if labels is not None else []) + _param_keys(params) + ["run_id", "state"]
    for col in lead + list(METRICS):
        if col not in df:
            df[col] = None
    if not hasattr(analysis, "goodput"):
        df = df.drop(columns=["goodput"])
    return df[[c for c in lead if c in df] + [c for c in df.columns if c not in lead]]


def _param_keys(params: Optional[Sequence[Mapping[str, Any]]]) -> list[str]:
    keys: list[str] = []
    for p in params or []:
        keys.extend(k for k in p if k not in keys)
    return keys


# -- faults --------------------------------------------------------------------


def fault_steps(run: RunLike) -> pd.DataFrame:
    """The run's faults with the step they hit: the highest committed step when each fired.

    ``t_s`` counts from the run's first committed step (the clock of ``at_s``
    schedules), so an original and its replay line up.
    """
    run = as_run(run)
    run.refresh()
    events = sorted(run.events_read, key=lambda e: e.get("t", 0.0))
    committed = [e for e in events if e.get("kind") == "step" and e.get("committed")]
    t0 = committed[0]["t"] if committed else None
    rows = []
    for f in events:
        if f.get("kind") != "fault" or f.get("action") == "resume":
            continue
        step = max((e.get("step", 0) for e in committed if e["t"] <= f["t"]), default=0)
        rows.append(
            {
                "action": f.get("action"),
                "target": f.get("target"),
                "origin": f.get("origin"),
                "step": step,
                "t_s": f["t"] - t0 if t0 is not None else None,
                "seconds": f.get("seconds"),
            }
        )
    return pd.DataFrame(rows, columns=["action", "target", "origin", "step", "t_s", "seconds"])


def faults_side_by_side(runs: Sequence[RunLike], labels: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """The fault tables of several runs next to each other, fault by fault (an original and its replay)."""
    runs = [as_run(r) for r in runs]
    labels = list(labels) if labels is not None else [r.id for r in runs]
    frames = [fault_steps(r).add_prefix(f"{lab}.") for r, lab in zip(runs, labels)]
    return pd.concat(frames, axis=1) if frames else pd.DataFrame()


# -- figures -------------------------------------------------------------------


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
    runs: Sequence[RunLike],
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
    runs = [as_run(r) for r in runs]
    labels = list(labels) if labels is not None else [r.id for r in runs]
    colors = colors_for(color_values) if color_values is not None else colors_for(list(range(len(runs))))
    fig = go.Figure()
    for i, (run, label) in enumerate(zip(runs, labels)):
        run.refresh()
        curve = committed_losses(decided(run.events_read))
        xs = curve["step"] if x == "step" else curve["t"] - (curve["t"].min() if len(curve) else 0.0)
        fig.add_scatter(
            x=xs,
            y=curve["loss"],
            mode="lines",
            name=label,
            line=dict(color=colors[i], width=1.6),
            hovertemplate=f"{label}<br>{x} %{{x}}<br>loss %{{y:.4f}}<extra></extra>",
        )
        faults = fault_steps(run)
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


def metrics_figure(df: pd.DataFrame, x: str, metrics: Sequence[str] = METRICS) -> go.Figure:
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
    runs: Sequence[RunLike],
    labels: Optional[Sequence[str]] = None,
    params: Optional[Sequence[Mapping[str, Any]]] = None,
    color_by: Optional[str] = None,
) -> list[go.Figure]:
    """Loss overlay, then (with ``params``) small multiples against ``color_by`` and parallel coordinates."""
    runs = [as_run(r) for r in runs]
    keys = _param_keys(params)
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
        df = table(runs, params=params)
        figs.append(metrics_figure(df, color_by))
        if len(keys) > 1:
            figs.append(parallel_figure(df, keys + [m for m in METRICS if m in df], color="final_loss"))
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


def replay_comparison(original: RunLike, replay: RunLike) -> dict:
    """An original and its replay side by side: ``table``, ``faults`` (fault by fault), ``figure``."""
    runs = [as_run(original), as_run(replay)]
    labels = ["original", "replay"]
    return {
        "table": table(runs, labels=labels),
        "faults": faults_side_by_side(runs, labels),
        "figure": loss_figure(runs, labels=labels, title="original vs replay"),
    }


def runs_listing(run_root: Union[str, os.PathLike]) -> pd.DataFrame:
    """Every run directory under ``run_root``: state, trainer, steps, faults, age (``workbench ls``)."""
    import datetime as _dt

    from workbench.run import rundir

    root = Path(run_root).expanduser()
    rows = []
    now = _dt.datetime.now(_dt.timezone.utc)
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not rundir.is_run_dir(d):
            continue
        try:
            run = attach(d)
            st = run.status()
        except Exception as e:  # a damaged run directory is listed, not fatal
            rows.append({"run_id": d.name, "state": f"unreadable ({type(e).__name__})", "run_dir": str(d)})
            continue
        created = run.record.get("created")
        age = (now - _dt.datetime.fromisoformat(created)).total_seconds() if created else None
        rows.append(
            {
                "run_id": run.id,
                "state": st["state"],
                "trainer": st["trainer"],
                "cluster": st["cluster"],
                "step": st["step"],
                "steps_target": st["steps_target"],
                "faults": st["faults"],
                "restarts": st["restarts"],
                "age_s": age,
                "run_dir": str(run.run_dir),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "state",
            "trainer",
            "cluster",
            "step",
            "steps_target",
            "faults",
            "restarts",
            "age_s",
            "run_dir",
        ],
    )


def sweep_report_html(sweep: Any) -> str:
    """A self-contained HTML page for a sweep: status, the comparison table, the figures (``workbench report``)."""
    import html
    import json

    import plotly.io as pio

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
