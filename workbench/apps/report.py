"""A self-contained HTML report of a run, for sharing: loss, recovery timeline, goodput, faults, why each
attempt ended.

One file, plotly.js inlined once, no network needed to open it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.io as pio

from workbench import analysis
from workbench.analysis.compare_figures import sweep_report_html
from workbench.analysis.figures import readable
from workbench.experiments.sweep import attach_sweep
from workbench.run.handle import Run, attach
from workbench.widgets.state import decimate

END_COLUMNS = ("replica", "attempt", "t", "step", "cause", "summary", "planned", "origin", "node", "log")


def loss_figure(metrics, events, max_points: int = 2000):
    """Loss per group, each curve decimated to ``max_points`` (spikes kept) and drawn as SVG: a
    report is opened anywhere, WebGL or not (plotly express picks WebGL past 1000 points)."""
    df = metrics[metrics["committed"].astype(bool) & metrics["participating"].fillna(True).astype(bool)]
    df = (
        pd.concat([g.iloc[decimate(g["loss"].to_numpy(dtype=float), max_points)] for _, g in df.groupby("replica")])
        if not df.empty
        else df
    )
    fig = px.line(
        df,
        x="step",
        y="loss",
        color=df["replica"].astype(str),
        labels={"color": "replica"},
        hover_data=["attempt"],
        title="Loss per replica group",
        height=380,
        render_mode="svg",
    )
    steps = {}
    for e in events:
        if e.get("kind") == "step" and e.get("committed"):
            steps[e["t"]] = e["step"]
    ts = sorted(steps)
    for e in events:
        if e.get("kind") == "fault" and e.get("action") != "resume":
            near = next((steps[t] for t in ts if t >= e["t"]), None)
            if near is not None:
                fig.add_vline(
                    x=near,
                    line_dash="dot",
                    line_color="red",
                    annotation_text=f"{e['action']} r{e.get('target')}",
                    annotation_font_size=12,
                )
    return readable(fig)


def run_report(run: Run) -> str:
    run.refresh()
    events = run.events_read
    metrics = run.metrics()
    timeline = analysis.recovery_timeline(events)
    summary = {**analysis.summary(events, run.spec, timeline), "run_dir": str(run.run_dir)}
    gp = analysis.goodput(events, run.spec, timeline)
    figs = []
    if not metrics.empty:
        figs.append(loss_figure(metrics, events))
    if not timeline.empty:
        figs.append(analysis.timeline_figure(timeline))
    if gp.get("goodput"):
        figs.append(analysis.goodput_figure(gp))
    parts = [
        f"<h1>Run {html.escape(run.id)}</h1>",
        f"<p>{html.escape(run.spec.trainer)} · {run.spec.replicas} replica groups · {html.escape(run.spec.cluster)}"
        f" · state <b>{html.escape(summary['state'])}</b></p>",
        "<h2>Summary</h2><pre>" + html.escape(json.dumps(summary, indent=2, default=str)) + "</pre>",
    ]
    for i, fig in enumerate(figs):
        parts.append(pio.to_html(fig, include_plotlyjs="inline" if i == 0 else False, full_html=False))
    if gp.get("goodput"):
        parts.append("<h2>Goodput</h2><pre>" + html.escape(json.dumps(gp, indent=2, default=str)) + "</pre>")
    if not timeline.empty:
        parts.append("<h2>Faults and recoveries</h2>" + timeline.round(3).to_html(index=False))
    ends = run.ends()
    if not ends.empty:  # why each attempt ended (workbench.state.causes); to_html escapes what the jobs wrote
        ends["t"] = (ends["t"] - (run.run_state.t0 or 0.0)).round(2)
        parts.append("<h2>Attempt ends</h2>" + ends[list(END_COLUMNS)].fillna("").to_html(index=False))
    parts.append("<h2>Spec</h2><pre>" + html.escape(json.dumps(run.record["spec"], indent=2)) + "</pre>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>workbench report</title></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )


def write_report(path_or_run) -> Path:
    """Write ``report.html`` into the run (or sweep) directory and return its path."""
    target = Path(getattr(path_or_run, "run_dir", path_or_run))
    if (target / "sweep.json").exists():
        text = sweep_report_html(attach_sweep(target))
    else:
        text = run_report(path_or_run if isinstance(path_or_run, Run) else attach(target))
    out = target / "report.html"
    out.write_text(text)
    out.chmod(0o600)
    return out
