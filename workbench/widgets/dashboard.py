"""``Dashboard``: the live view of one run, as ipywidgets around a plotly figure.

Presentation only: :class:`~workbench.widgets.state.DashboardState` decides what
is shown; this module renders it and turns the fault controls into
``run.fault(..., origin="button")``.

A dashboard reads no event log of its own: it shares its ``Run``'s reader
and run-state fold, and subscribes to the fold for the presentation part
(loss series, markers), so a kernel reads every byte once. Updates come from
a background thread (:class:`~workbench.widgets.updater.Updater`) that
refreshes the run (new bytes only, at most every ``interval`` seconds, 0.5 s
by default); a refresh from a notebook cell (``run.metrics()``) reaches the
dashboard too. One updater per run directory per kernel: a new Dashboard on
the same run (re-running the cell) stops the previous one. The thread ends by
itself once the run has ended and the last events are drawn.

The loss plot is a plain ``go.Figure`` rendered through an ``ipywidgets.Output``
(:mod:`workbench.widgets.plot` says why not a ``FigureWidget``). Each change is
a full redraw of a decimated figure (at most ``max_points`` per curve), which
is what bounds an update with 100k points.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any, Optional

import ipywidgets as w
import plotly.graph_objects as go

from .. import faultkinds
from ..analysis.figures import readable
from .plot import plot_bundle
from .state import STATES, DashboardState
from .updater import Updater, active

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
STATE_COLORS = {
    "pending": "#9e9e9e", "starting": "#64b5f6", "participating": "#43a047", "healing": "#ffb300",
    "hung": "#8e24aa", "dead": "#e53935", "finished": "#1e88e5", "stopped": "#757575",
}
MARKER_STYLE = {
    "fault": dict(symbol="x", size=13, color="#d50000", line=dict(width=1, color="#7f0000")),
    "heal": dict(symbol="triangle-up", size=12, color="#00c853", line=dict(width=1, color="#1b5e20")),
    "checkpoint": dict(symbol="diamond", size=10, color="#ffd600", line=dict(width=1, color="#6d5f00")),
    "restore": dict(symbol="star", size=14, color="#ff6d00", line=dict(width=1, color="#7f3600")),
    "diverged": dict(symbol="octagon", size=14, color="#000000", line=dict(width=2, color="#d50000")),
}
_STYLE = """<style>
.wb-tiles{display:flex;flex-wrap:wrap;gap:6px}
.wb-tile{border-radius:6px;padding:6px 8px;min-width:150px;font:12px/1.35 monospace;color:#fff}
.wb-tile b{font-size:13px}
.wb-table{font:12px monospace;border-collapse:collapse}
.wb-table td,.wb-table th{padding:1px 8px;text-align:right;border-bottom:1px solid #ddd}
.wb-tail{font:11px/1.3 monospace;margin:0;white-space:pre-wrap}
</style>"""


def active_dashboards() -> dict[str, "Dashboard"]:
    """The dashboards of this kernel whose updater is running, by run directory."""
    return active("dashboard")


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    """A value as HTML text, escaped: quorum ids, heal sources and hosts come from event files."""
    if value is None:
        return "–"
    try:
        text = f"{value:{spec}}{unit}"
    except (TypeError, ValueError):
        text = str(value)
    return html.escape(text, quote=True)


def _bytes(n: Optional[float]) -> str:
    """Decimal units (1 MB = 10^6 bytes), as the CLI and the benchmarks print them."""
    if n is None or not isinstance(n, (int, float)):
        return "–"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "–"


class Dashboard(w.VBox):
    """Live dashboard of one run: ``Dashboard(run)`` or ``Dashboard(run_dir)``.

    ``interval`` is the poll period in seconds (at least 0.5); ``max_points``
    bounds the points drawn per loss curve (min/max decimation keeps spikes);
    ``plot_every`` is the least time between two plot redraws while the updater
    runs (tiles, panels and the event tail follow every poll);
    ``start=False`` builds it without the updater thread (call :meth:`update`);
    ``faults=False`` leaves the fault controls out (a view for watching only,
    as the classroom page shows by default).
    """

    def __init__(self, run: Any, interval: float = 0.5, max_points: int = 1500, plot_every: float = 2.0,
                 start: bool = True, faults: bool = True, **kwargs: Any) -> None:
        if isinstance(run, (str, Path)):
            from ..run import attach

            run = attach(run)
        self.run = run
        self.run_dir = run.run_dir
        self.spec = run.spec
        self.interval = max(0.5, float(interval))
        self.max_points = int(max_points)
        self.plot_every = float(plot_every)
        self.faults = bool(faults)
        self._plotted_at = float("-inf")
        self._render_lock = threading.RLock()
        self.state = DashboardState(self.spec.replicas, self.spec.steps, run_state=run.run_state)
        self._unsubscribe = run.run_state.subscribe(self._present)
        self.state.present(list(run._events))  # what the run had read before this dashboard existed
        self.last_update_s: Optional[float] = None
        self._updater = Updater("dashboard", str(self.run_dir), self.update, lambda: self.state.run_state is not None,
                                self.interval, name=f"wb-dashboard-{self.run_dir.name}", owner=self,
                                on_error=self._show_update_error, on_exit=lambda: self.render(force_plot=True))
        self._drawn: dict[str, Any] = {}

        self._build()
        self.update()
        super().__init__(
            [self.header, self.progress, self.x_toggle, self.loss_box, self.tiles, self.node_panel,
             self.quorum_panel,
             w.HBox([self.checkpoint_panel, self.heal_panel]),
             *([self.controls] if self.faults else []), self.tail_panel],
            **kwargs,
        )
        self.add_class("wb-dashboard")
        if start:
            self.start()

    # -- layout ------------------------------------------------------------------
    def _build(self) -> None:
        replicas = list(range(self.spec.replicas))
        self.header = w.HTML(_STYLE).add_class("wb-header")
        self.progress = w.IntProgress(value=0, min=0, max=self.spec.steps, description="steps",
                                      layout=w.Layout(width="60%")).add_class("wb-progress")
        self.x_toggle = w.ToggleButtons(options=[("step", "step"), ("wall time", "time")], value="step",
                                        style={"button_width": "90px"}).add_class("wb-x-toggle")
        self.x_toggle.observe(lambda _: self.render(force_plot=True), names="value")

        traces = [
            go.Scatter(x=[], y=[], mode="lines", name=f"replica {r}", line=dict(color=COLORS[r % len(COLORS)], width=1.5),
                       hovertemplate=f"replica {r}<br>step %{{customdata:.0f}}<br>loss %{{y:.4f}}<extra></extra>")
            for r in replicas
        ]
        for kind, style in MARKER_STYLE.items():
            traces.append(go.Scatter(
                x=[], y=[], mode="markers", name={"fault": "faults", "heal": "heals", "checkpoint": "checkpoints", "restore": "restarts",
                                         "diverged": "diverged"}[kind],
                marker=style, hovertemplate="%{text}<br>step %{customdata:.0f}<br>loss %{y:.4f}<extra></extra>",
            ))
        self._trace_of = {r: r for r in replicas}
        self._marker_trace = {kind: len(replicas) + i for i, kind in enumerate(MARKER_STYLE)}
        self.figure = go.Figure(traces, layout=dict(
            height=380, margin=dict(l=60, r=10, t=50, b=50), title=dict(text="loss", x=0.01, font=dict(size=13)),
            xaxis=dict(title=dict(text="step")), yaxis=dict(title=dict(text="loss")),
            legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"), uirevision="keep",
            hovermode="closest",
        ))
        readable(self.figure)
        self.plot_output = w.Output(layout=w.Layout(width="100%", min_height="400px"))
        self.loss_box = w.Box([self.plot_output], layout=w.Layout(width="100%")).add_class("wb-loss-plot")


        self.tiles = w.HTML().add_class("wb-tiles-panel")
        self.node_panel = w.HTML().add_class("wb-nodes")
        self.quorum_panel = w.HTML().add_class("wb-quorum")
        self.checkpoint_panel = w.HTML(layout=w.Layout(width="50%")).add_class("wb-checkpoints")
        self.heal_panel = w.HTML(layout=w.Layout(width="50%")).add_class("wb-heals")
        self.tail_panel = w.HTML().add_class("wb-tail-panel")

        self.replica_picker = w.Dropdown(options=[(f"replica {r}", r) for r in replicas],
                                         value=1 if len(replicas) > 1 else 0, description="target",
                                         layout=w.Layout(width="180px")).add_class("wb-replica-picker")
        actions = self.run.fault_kinds()
        self.action_picker = w.Dropdown(options=actions, value=actions[0] if actions else None, description="action",
                                        layout=w.Layout(width="200px")).add_class("wb-action-picker")
        self.hang_seconds = w.BoundedFloatText(value=5.0, min=0.1, max=3600, step=0.5, description="hang s",
                                               layout=w.Layout(width="150px")).add_class("wb-hang-seconds")
        self.inject_button = w.Button(description="inject", button_style="danger", icon="bolt").add_class("wb-inject")
        self.inject_button.on_click(lambda _: self.inject())
        self.fault_status = w.HTML().add_class("wb-fault-status")
        self.controls = w.HBox([self.replica_picker, self.action_picker, self.hang_seconds,
                                self.inject_button, self.fault_status]).add_class("wb-controls")

    # -- fault controls ------------------------------------------------------------
    def inject(self) -> Optional[dict]:
        """Inject the fault the controls describe; the outcome shows next to the button."""
        if not self.faults:
            raise RuntimeError("this dashboard was built with faults=False: it has no fault controls")
        action = self.action_picker.value
        kind = faultkinds.KINDS[action]
        target = self.replica_picker.value if kind.targets == "replica" else None
        seconds = self.hang_seconds.value if kind.has_duration else None
        try:
            event = self.run.fault(action, target, origin="button", seconds=seconds)
        except Exception as e:  # shown, not raised: a click has no cell to raise into
            self.fault_status.value = f"<span style='color:#c62828'>{html.escape(str(e))}</span>"
            return None
        if event.get("kind") == "armed":
            self.fault_status.value = html.escape(f"{action} armed on {event.get('target')}: fires on its next "
                                                  f"{event.get('trigger')}")
        else:
            self.fault_status.value = html.escape(f"{action} → {event.get('target')} (pid {event.get('pid')})")
        return event

    # -- updating ------------------------------------------------------------------
    def _present(self, events: list[dict]) -> None:
        with self._render_lock:
            self.state.present(events)

    def update(self) -> int:
        """Refresh the run (which folds new events into this dashboard too) and redraw;
        returns how many events this refresh read."""
        t0 = time.perf_counter()
        n = len(self.run.refresh())  # outside the render lock: the lock order is run, then render
        with self._render_lock:
            self.render()
            self.last_update_s = time.perf_counter() - t0
        return n

    def render(self, force_plot: bool = False) -> None:
        with self._render_lock:
            s = self.state
            done, planned = s.progress()
            self.progress.value = done
            self.progress.description = f"{done}/{planned}"
            self._set(self.header, _STYLE + self._header_html())
            self._set(self.tiles, self._tiles_html())
            self._set(self.node_panel, self._nodes_html())
            self._set(self.quorum_panel, self._quorum_html())
            self._set(self.checkpoint_panel, self._checkpoints_html())
            self._set(self.heal_panel, self._heals_html())
            self._set(self.tail_panel, self._tail_html())
            self._render_loss(force_plot)

    @staticmethod
    def _set(widget: w.HTML, value: str) -> None:
        if widget.value != value:
            widget.value = value

    def _render_loss(self, force: bool) -> None:
        s, x = self.state, self.x_toggle.value
        versions = {r: series.version for r, series in s.loss.items()}
        key = (x, s.markers_version, tuple(sorted(versions.items())))
        if not force and self._drawn.get("loss") == key:
            return
        if not force and self.running and time.monotonic() - self._plotted_at < self.plot_every:
            return  # each redraw ships the whole figure: a slow browser must not fall behind
        fig = self.figure
        with fig.batch_update():
            for r in versions:
                if r not in self._trace_of:
                    fig.add_scatter(x=[], y=[], mode="lines", name=f"replica {r}",
                                    hovertemplate=f"replica {r}<br>step %{{customdata:.0f}}<br>loss %{{y:.4f}}<extra></extra>")
                    self._trace_of[r] = len(fig.data) - 1
                view = s.loss_view(r, x, self.max_points)
                trace = fig.data[self._trace_of[r]]
                trace.x, trace.y, trace.customdata = view["x"], view["y"], view["step"]
            for kind, i in self._marker_trace.items():
                m = s.marker_arrays(kind)
                trace = fig.data[i]
                trace.x = m["step"] if x == "step" else m["t"] - (s.t0 or 0.0)
                trace.y, trace.customdata, trace.text = m["loss"], m["step"], m["label"]
            fig.layout.xaxis.title.text = "step" if x == "step" else "wall time since first event (s)"
        self.plot_output.outputs = plot_bundle(fig)
        self._plotted_at = time.monotonic()
        self._drawn["loss"] = key

    # -- html panels ---------------------------------------------------------------
    def _header_html(self) -> str:
        s = self.state
        live = "live" if self.running else "not polling"
        run_state = s.run_state or ("running" if s.events_seen else "waiting for events")
        return (f"<div class='wb-title' data-run-state='{html.escape(run_state)}'><b>{html.escape(self.run_dir.name)}</b>"
                f" · {html.escape(self.spec.trainer)} · {self.spec.replicas} replica groups · {html.escape(run_state)}"
                f" · <span class='wb-live'>{live}</span> · {s.events_seen} events</div>")

    def _tiles_html(self) -> str:
        now = time.time()
        parts = ["<div class='wb-tiles'>"]
        for r, t in sorted(self.state.tiles.items()):
            age = t.heartbeat_age(now)
            hosts = ", ".join(t.hosts) or "–"
            parts.append(
                f"<div class='wb-tile' data-replica='{r}' data-state='{t.state}' data-attempt='{t.attempt}' "
                f"data-step='{t.step if t.step is not None else ''}' data-diverged='{_fmt(t.diverged_at) if t.diverged_at is not None else ''}' "
                f"style='background:{STATE_COLORS.get(t.state, '#555')}"
                + (";outline:3px solid #000" if t.diverged_at is not None else "") + "'>"
                f"<b>replica {r}</b> · <span class='wb-tile-state'>{t.state}</span>"
                + (f" · <b class='wb-diverged'>diverged at step {_fmt(t.diverged_at)}</b>" if t.diverged_at is not None else "")
                + (f" · <b class='wb-impaired'>{_fmt(t.impaired['kind'])}</b>" if t.impaired else "")
                + "<br>"
                f"step {_fmt(t.step)} · attempt {t.attempt}"
                + (f" · {t.steps_lost} steps redone" if t.steps_lost else "") + "<br>"
                f"heartbeat {_fmt(age, '.1f', ' s')} ago<br>"
                f"step {_fmt(t.step_time_s and t.step_time_s * 1000, '.0f', ' ms')} · {_fmt(t.tokens_per_s, ',.0f')} tok/s<br>"
                f"mem {_fmt(t.mem_gb, '.2f', ' GB')} · {html.escape(hosts)}</div>"
            )
        parts.append("</div>")
        return "".join(parts)

    def _nodes_html(self) -> str:
        rows = []
        for n in self.state.node_rows():
            state = n["state"] + (f" ({_fmt(n['fault'])})" if n["fault"] else "")
            running = ", ".join(f"replica {_fmt(p['replica'])} task {_fmt(p['task'])}" for p in n["parts"]) or "–"
            rows.append(f"<tr data-node='{_fmt(n['node'])}' data-state='{n['state']}'><td>{_fmt(n['node'])}</td>"
                        f"<td>{_fmt(n['address'])}</td><td>{state}</td><td>{running}</td>"
                        f"<td class='wb-health'>{html.escape(n['health_line'])}</td></tr>")
        if not rows:
            return ""
        return ("<b>nodes</b><table class='wb-table'><tr><th>node</th><th>address</th><th>state</th>"
                f"<th>running</th><th>health</th></tr>{''.join(rows)}</table>")

    def _quorum_html(self) -> str:
        s = self.state
        rows = "".join(
            f"<tr><td>{_fmt(q['quorum_id'])}</td><td>{_fmt(q['step'])}</td><td>{_fmt(q['participants'])}</td></tr>"
            for q in s.quorum_history[-5:][::-1]
        )
        return (f"<div class='wb-quorum-now' data-quorum-id='{_fmt(s.quorum_id)}' data-participants='{_fmt(s.participants)}'>"
                f"<b>quorum</b> {_fmt(s.quorum_id)} · <b>{_fmt(s.participants)}</b> participants</div>"
                f"<div style='display:flex;gap:16px;align-items:flex-start'>"
                f"<table class='wb-table'><tr><th>quorum</th><th>step</th><th>participants</th></tr>{rows}</table>"
                f"{self._participants_svg()}</div>")

    def _participants_svg(self, width: int = 360, height: int = 90) -> str:
        """Participants over time as a step line, drawn as a small SVG (no second plot to sync)."""
        s = self.state
        h = [q for q in s.quorum_history if q["participants"] is not None]
        if not h:
            return ""
        t0, now = s.t0 or h[0]["t"], max(time.time(), h[-1]["t"])
        span, top = max(now - t0, 1e-9), max(max(q["participants"] for q in h), self.spec.replicas)
        x = lambda t: 30 + (t - t0) / span * (width - 40)
        y = lambda p: 10 + (1 - p / top) * (height - 25)
        points, prev = [], None
        for q in h:
            if prev is not None:
                points.append(f"{x(q['t']):.1f},{y(prev):.1f}")
            points.append(f"{x(q['t']):.1f},{y(q['participants']):.1f}")
            prev = q["participants"]
        points.append(f"{x(now):.1f},{y(prev):.1f}")
        return (f"<svg class='wb-participants' width='{width}' height='{height}' data-changes='{len(h)}'>"
                f"<text x='30' y='{height - 2}' font-size='12'>participants over {span:.0f} s</text>"
                f"<text x='2' y='{y(top) + 4:.0f}' font-size='12'>{top}</text><text x='2' y='{y(0) + 4:.0f}' font-size='12'>0</text>"
                f"<line x1='30' x2='{width - 10}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#bbb'/>"
                f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{' '.join(points)}'/></svg>")

    def _checkpoints_html(self) -> str:
        now = time.time()
        rows = "".join(
            f"<tr><td>{k}</td><td>{_fmt(c['step'])}</td><td>{_fmt(now - c['t'], '.0f', ' s')}</td>"
            f"<td>{_bytes(c['bytes'])}</td><td>{_fmt(c['seconds'], '.2f', ' s')}</td></tr>"
            for k, c in sorted(self.state.checkpoints.items(), key=lambda kv: str(kv[0]))
        ) or "<tr><td colspan=5>no durable checkpoint yet</td></tr>"
        return ("<b>durable checkpoints</b><table class='wb-table'><tr><th>replica</th><th>step</th><th>age</th>"
                f"<th>size</th><th>write</th></tr>{rows}</table>")

    def _heals_html(self) -> str:
        rows = "".join(
            f"<tr><td>{_fmt(h['replica'])}</td><td>{_fmt(h['from'])}</td><td>{_fmt(h['step'])}</td>"
            f"<td>{_fmt(h['seconds'], '.2f', ' s')}</td><td>{_bytes(h['bytes'])}</td>"
            f"<td>{_bytes(h['bytes_per_s'])}/s · {_fmt(h['served_from'])} via {_fmt(h['interface'])}</td></tr>"
            for h in self.state.heals[-5:][::-1]
        ) or "<tr><td colspan=6>no peer heal yet</td></tr>"
        return ("<b>peer-heal transfers</b><table class='wb-table'><tr><th>replica</th><th>from</th><th>step</th>"
                f"<th>time</th><th>bytes</th><th>rate · route</th></tr>{rows}</table>")

    def _tail_html(self) -> str:
        lines = []
        for e in list(self.state.tail)[::-1]:
            stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t") or 0))
            extra = " ".join(
                f"{k}={e[k]}" for k in ("replica", "attempt", "action", "target", "origin", "state", "reason",
                                        "phase", "step", "quorum_id", "message")
                if e.get(k) is not None and not (k == "attempt" and e.get("replica") is None)
            )
            lines.append(f"{stamp} {e.get('kind')} {extra}")
        return "<b>latest events</b><pre class='wb-tail'>" + html.escape("\n".join(lines)) + "</pre>"

    # -- the updater thread --------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._updater.running

    def start(self) -> "Dashboard":
        """Start the updater thread, stopping any other dashboard's on the same run."""
        self._updater.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the updater thread and the subscription to the run (the widgets keep what they show)."""
        self._updater.stop(timeout)
        self._unsubscribe()
        self.render()

    def _show_update_error(self, e: Exception) -> None:
        self.fault_status.value = f"<span style='color:#c62828'>dashboard update failed: {html.escape(repr(e))}</span>"


__all__ = ["Dashboard", "STATES", "active_dashboards"]
