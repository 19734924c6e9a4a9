"""``Dashboard``: the live view of one run, as ipywidgets around a plotly figure.

Presentation only: :class:`~workbench.widgets.state.DashboardState` decides what
is shown; this module renders it and turns the fault controls into
``run.fault(..., origin="button")``.

A dashboard reads no event log of its own: it shares its ``Run``'s reader
and run-state fold, and subscribes to the fold for the presentation part
(loss series, markers), so a kernel reads every byte once. Updates come from
a background thread (:class:`~workbench.widgets.updater.Updater`) that
refreshes the run (new bytes only, at most every ``interval`` seconds, 0.25 s
by default); a refresh from a notebook cell (``run.metrics()``) reaches the
dashboard too. One updater per run directory per kernel: a new Dashboard on
the same run (re-running the cell) stops the previous one. The thread ends by
itself once the run has ended and the last events are drawn.

The loss plot is a :class:`~workbench.widgets.liveplot.LivePlot`: each poll
sends only the points drawn since the last one (:mod:`workbench.widgets.appendplot`:
decimation to at most ``max_points`` per curve whose drawn prefix never
changes), so an update's cost does not grow with the run's length; the
figure ``self.figure`` is only its template (layout and trace styles). The
wall-clock plots are still whole figures in an ``Output`` (:mod:`plot`),
redrawn at most every ``plot_every`` seconds.
"""

from __future__ import annotations

import html
import json
import threading
import time
from pathlib import Path
from typing import Any, Optional

import ipywidgets as w
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from workbench.analysis.figures import readable
from workbench.analysis.wallclock import GRID_MIN_GROUPS, STATE_COLORS, Replay, Snapshot, Timeline, cells
from workbench.faults import kinds as faultkinds
from workbench.widgets.appendplot import PlotFeed
from workbench.widgets.liveplot import LivePlot, plotly_lib
from workbench.widgets.state import STATES, DashboardState
from workbench.widgets.updater import Updater, active

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MARKER_NAMES = {
    "fault": "faults",
    "heal": "heals",
    "checkpoint": "checkpoints",
    "restore": "restarts",
    "diverged": "diverged",
    "sync": "syncs",
}
MARKER_STYLE = {
    "fault": dict(symbol="x", size=13, color="#d50000", line=dict(width=1, color="#7f0000")),
    "heal": dict(symbol="triangle-up", size=12, color="#00c853", line=dict(width=1, color="#1b5e20")),
    "checkpoint": dict(symbol="diamond", size=10, color="#ffd600", line=dict(width=1, color="#6d5f00")),
    "restore": dict(symbol="star", size=14, color="#ff6d00", line=dict(width=1, color="#7f3600")),
    "diverged": dict(symbol="octagon", size=14, color="#000000", line=dict(width=2, color="#d50000")),
    "sync": dict(symbol="line-ns-open", size=12, color="#37474f", line=dict(width=2, color="#37474f")),
}
_STYLE = """<style>
.wb-tiles{display:flex;flex-wrap:wrap;gap:6px}
.wb-tile{border-radius:6px;padding:6px 8px;min-width:150px;font:12px/1.35 monospace;color:#fff}
.wb-tile b{font-size:13px}
.wb-table{font:12px monospace;border-collapse:collapse}
.wb-table td,.wb-table th{padding:1px 8px;text-align:right;border-bottom:1px solid #ddd}
.wb-tail{font:11px/1.3 monospace;margin:0;white-space:pre-wrap}
.wb-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(64px,1fr));gap:3px;max-width:900px}
.wb-cell{border-radius:3px;padding:2px 3px;font:bold 12px/1.2 monospace;color:#fff;text-align:center}
.wb-legend span{display:inline-block;padding:0 6px;margin-right:4px;border-radius:3px;color:#fff;font:11px monospace}
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


def _hold(t, y, t_end: Optional[float]):
    """A step line's points held to ``t_end`` (its last value drawn up to the scrubbed time)."""
    t, y = list(t), list(y)
    if t and t_end is not None and t_end > t[-1]:
        t.append(t_end)
        y.append(y[-1])
    return t, y


def _live_spec(fig: go.Figure) -> dict:
    """The LivePlot ``spec`` of a template figure: its layout and its traces' styles, no points."""
    spec = json.loads(pio.to_json(fig, validate=False))
    traces = [{k: v for k, v in t.items() if k not in ("x", "y", "customdata", "text")} for t in spec["data"]]
    return {"layout": spec["layout"], "traces": traces, "config": {"displaylogo": False, "responsive": True}}


def _plain(v):
    """A plotly JSON array as a list (plotly's JSON writes numeric arrays as base64 ``bdata``)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return v


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

    ``interval`` is the poll period in seconds (at least 0.2; 0.25 by default, so that an event
    is drawn within 0.5 s at the 95th percentile: ``bench/live_plot.py``); ``max_points``
    bounds the points drawn per loss curve (min/max decimation keeps spikes);
    ``plot_every`` is the least time between two redraws of the wall-clock plots while
    the updater runs (the loss plot, tiles, panels and the event tail follow every poll);
    ``start=False`` builds it without the updater thread (call :meth:`update`);
    ``faults=False`` leaves the fault controls out (a view for watching only,
    as the classroom page shows by default).
    """

    def __init__(
        self,
        run: Any,
        interval: float = 0.25,
        max_points: int = 1500,
        plot_every: float = 2.0,
        start: bool = True,
        faults: bool = True,
        **kwargs: Any,
    ) -> None:
        if isinstance(run, (str, Path)):
            from workbench.run.handle import attach

            run = attach(run)
        self.run = run
        self.run_dir = run.run_dir
        self.spec = run.spec
        self.interval = max(0.2, float(interval))
        self.max_points = int(max_points)
        self.plot_every = float(plot_every)
        self.faults = bool(faults)
        self._render_lock = threading.RLock()
        self.state = DashboardState(self.spec.replicas, self.spec.steps, run_state=run.run_state)
        self._unsubscribe = run.run_state.subscribe(self._present)
        self.state.present(list(run.events_read))  # what the run had read before this dashboard existed
        self.last_update_s: Optional[float] = None
        self._updater = Updater(
            "dashboard",
            str(self.run_dir),
            self.update,
            lambda: self.state.run_state is not None,
            self.interval,
            name=f"wb-dashboard-{self.run_dir.name}",
            owner=self,
            on_error=self._show_update_error,
            on_exit=lambda: self.render(force_plot=True),
        )
        self._drawn: dict[str, Any] = {}

        self._build()
        self._build_classroom()
        self.update()
        super().__init__(
            [
                self.header,
                self.progress,
                self.x_toggle,
                self.loss_box,
                self.clock_box,
                self.scrub_box,
                self.tiles,
                self.backlog_panel,
                self.node_panel,
                self.quorum_panel,
                w.HBox([self.checkpoint_panel, self.heal_panel]),
                *([self.controls] if self.faults else []),
                self.tail_panel,
            ],
            **kwargs,
        )
        self.add_class("wb-dashboard")
        if start:
            self.start()

    # -- layout ------------------------------------------------------------------
    def _build(self) -> None:
        replicas = list(range(self.spec.replicas))
        self.header = w.HTML(_STYLE).add_class("wb-header")
        self.progress = w.IntProgress(
            value=0, min=0, max=self.spec.steps, description="steps", layout=w.Layout(width="60%")
        ).add_class("wb-progress")
        self.x_toggle = w.ToggleButtons(
            options=[("step", "step"), ("wall time", "time")], value="step", style={"button_width": "90px"}
        ).add_class("wb-x-toggle")
        self.x_toggle.observe(lambda _: self.render(force_plot=True), names="value")

        traces = [
            go.Scatter(
                x=[],
                y=[],
                mode="lines",
                name=f"replica {r}",
                line=dict(color=COLORS[r % len(COLORS)], width=1.5),
                hovertemplate=f"replica {r}<br>step %{{customdata:.0f}}<br>loss %{{y:.4f}}<extra></extra>",
            )
            for r in replicas
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
        self._trace_of = {r: r for r in replicas}
        self._marker_trace = {kind: len(replicas) + i for i, kind in enumerate(MARKER_STYLE)}
        self.figure = go.Figure(
            traces,
            layout=dict(
                height=380,
                margin=dict(l=60, r=10, t=50, b=50),
                title=dict(text="loss", x=0.01, font=dict(size=13)),
                xaxis=dict(title=dict(text="step")),
                yaxis=dict(title=dict(text="loss")),
                legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
                uirevision="keep",
                hovermode="closest",
            ),
        )
        readable(self.figure)
        self._feed = PlotFeed(MARKER_NAMES, self.max_points)
        self.loss_plot = LivePlot(_live_spec(self.figure), layout=w.Layout(width="100%", min_height="400px"))
        self.loss_box = w.Box([plotly_lib(), self.loss_plot], layout=w.Layout(width="100%")).add_class("wb-loss-plot")

        self.tiles = w.HTML().add_class("wb-tiles-panel")
        self.node_panel = w.HTML().add_class("wb-nodes")
        self.quorum_panel = w.HTML().add_class("wb-quorum")
        self.checkpoint_panel = w.HTML(layout=w.Layout(width="50%")).add_class("wb-checkpoints")
        self.heal_panel = w.HTML(layout=w.Layout(width="50%")).add_class("wb-heals")
        self.tail_panel = w.HTML().add_class("wb-tail-panel")

        self.replica_picker = w.Dropdown(
            options=[(f"replica {r}", r) for r in replicas],
            value=1 if len(replicas) > 1 else 0,
            description="target",
            layout=w.Layout(width="180px"),
        ).add_class("wb-replica-picker")
        actions = self.run.fault_kinds()
        self.action_picker = w.Dropdown(
            options=actions, value=actions[0] if actions else None, description="action", layout=w.Layout(width="200px")
        ).add_class("wb-action-picker")
        self.hang_seconds = w.BoundedFloatText(
            value=5.0, min=0.1, max=3600, step=0.5, description="hang s", layout=w.Layout(width="150px")
        ).add_class("wb-hang-seconds")
        self.inject_button = w.Button(description="inject", button_style="danger", icon="bolt").add_class("wb-inject")
        self.inject_button.on_click(lambda _: self.inject())
        self.fault_status = w.HTML().add_class("wb-fault-status")
        self.controls = w.HBox(
            [self.replica_picker, self.action_picker, self.hang_seconds, self.inject_button, self.fault_status]
        ).add_class("wb-controls")

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
            self.fault_status.value = html.escape(
                f"{action} armed on {event.get('target')}: fires on its next {event.get('trigger')}"
            )
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
            if self.scrub_t is None:
                self._set(self.tiles, self._grid_html(cells(self.state.run)) if self.compact else self._tiles_html())
            self._set(self.node_panel, self._nodes_html())
            self._set(self.quorum_panel, self._quorum_html())
            self._set(self.checkpoint_panel, self._checkpoints_html())
            self._set(self.heal_panel, self._heals_html())
            self._set(self.tail_panel, self._tail_html())
            self._render_loss(force_plot)
            self._render_classroom(force_plot)

    @staticmethod
    def _set(widget: w.HTML, value: str) -> None:
        if widget.value != value:
            widget.value = value

    def _render_loss(self, force: bool) -> None:
        """Send the loss plot what is new (every poll: an update carries only new points);
        ``force`` also sends the whole content, for any frontend that lost track."""
        msg = self._feed.update(self.state, self.x_toggle.value)
        if msg is not None:
            self.loss_plot.push(msg)
        elif force:
            self.loss_plot.send_full()

    # -- the classroom views: compact grid, wall-clock plots, replay ----------------
    def _build_classroom(self) -> None:
        """The views a class of 16-32 groups needs (``timeline.py`` computes them): a compact grid
        of groups from ``GRID_MIN_GROUPS`` on, useful throughput, quorum size and the dead-group
        queue over wall-clock time with every fault marked, and, once the run has ended, a
        time scrubber that replays grid and plots from the log."""
        from workbench.trainers import trainer_kind

        self.compact = self.spec.replicas >= GRID_MIN_GROUPS
        self.timeline = Timeline(self.run.run_state, trainer_kind(self.spec.trainer).samples_per_step(self.spec))
        self.timeline.observe(list(self.run.events_read))
        self._unsubscribe_timeline = self.run.run_state.subscribe(self._observe)
        self.clock = make_subplots(
            rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.5, 0.25, 0.25]
        )
        self.clock.add_scatter(
            x=[],
            y=[],
            mode="lines",
            line=dict(shape="hv", color="#1f77b4", width=2),
            name="useful samples/s",
            row=1,
            col=1,
            hovertemplate="%{x:.0f} s<br>%{y:,.0f} samples/s<extra></extra>",
        )
        self.clock.add_scatter(
            x=[],
            y=[],
            mode="markers",
            marker=MARKER_STYLE["fault"],
            name="faults",
            row=1,
            col=1,
            hovertemplate="%{text}<br>%{x:.1f} s<extra></extra>",
        )
        self.clock.add_scatter(
            x=[],
            y=[],
            mode="lines",
            line=dict(shape="hv", color="#43a047", width=2),
            name="quorum size",
            row=2,
            col=1,
            hovertemplate="%{x:.1f} s<br>%{y} groups<extra></extra>",
        )
        self.clock.add_scatter(
            x=[],
            y=[],
            mode="lines",
            line=dict(shape="hv", color="#e53935", width=2),
            name="dead groups",
            row=3,
            col=1,
            hovertemplate="%{x:.1f} s<br>%{y} dead<extra></extra>",
        )
        self.clock.add_scatter(
            x=[],
            y=[],
            mode="lines",
            line=dict(shape="hv", color="#8e24aa", width=1, dash="dot"),
            name="hung groups",
            row=3,
            col=1,
            hovertemplate="%{x:.1f} s<br>%{y} hung<extra></extra>",
        )
        self.clock.update_layout(
            height=440,
            margin=dict(l=60, r=10, t=40, b=40),
            uirevision="keep",
            hovermode="closest",
            title=dict(text="over wall-clock time", x=0.01, font=dict(size=13)),
            legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1, xanchor="right"),
        )
        self.clock.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
        self.clock.update_yaxes(title_text="quorum", range=[0, self.spec.replicas + 0.5], row=2, col=1)
        self.clock.update_yaxes(title_text="queue", rangemode="tozero", row=3, col=1)
        self.clock.update_xaxes(title_text="wall time since first event (s)", row=3, col=1)
        readable(self.clock)
        self.clock_plot = LivePlot(_live_spec(self.clock), layout=w.Layout(width="100%", min_height="460px"))
        self.clock_box = w.Box([plotly_lib(), self.clock_plot], layout=w.Layout(width="100%")).add_class(
            "wb-clock-plot"
        )
        self.backlog_panel = w.HTML().add_class("wb-backlog")
        self.scrubber = w.FloatSlider(
            value=0.0,
            min=0.0,
            max=1.0,
            step=0.5,
            description="replay at",
            continuous_update=True,
            readout_format=".0f",
            layout=w.Layout(width="70%"),
        ).add_class("wb-scrubber")
        self.scrubber.observe(lambda change: self.scrub(change["new"]), names="value")
        self.scrub_label = w.HTML().add_class("wb-scrub-label")
        self.scrub_box = w.HBox([self.scrubber, self.scrub_label], layout=w.Layout(display="none")).add_class(
            "wb-scrub"
        )
        self.replay: Optional[Replay] = None
        self.scrub_t: Optional[float] = None
        self._clock_plotted_at = float("-inf")

    def _observe(self, events: list[dict]) -> None:
        with self._render_lock:
            self.timeline.observe(events)

    def _render_classroom(self, force: bool) -> None:
        if self.state.run_state is not None and self.replay is None:
            self._start_replay()
        tl = self.timeline
        self._set(self.backlog_panel, self._backlog_html((self.replay.timeline if self.replay else tl).backlog()))
        if self.scrub_t is not None:
            return
        key = ("live", tl.version)
        if not force and self._drawn.get("clock") == key:
            return
        if not force and self.running and time.monotonic() - self._clock_plotted_at < self.plot_every:
            return
        t_now = self.state.last_event_t
        self._draw_clock(
            tl.throughput(until=t_now if self.running else None),
            tl.quorum_series(),
            tl.queue_series(),
            tl.marks_until(None, "fault"),
            t_end=(t_now - (self.state.t0 or 0.0)) if t_now else None,
        )
        self._drawn["clock"] = key

    def _draw_clock(self, throughput: dict, quorum: dict, queue: dict, faults: list, t_end: Optional[float]) -> None:
        t0 = self.state.t0 or 0.0
        fig = self.clock
        top = float(throughput["rate"].max()) if len(throughput["rate"]) else 1.0
        with fig.batch_update():
            d = fig.data
            d[0].x, d[0].y = throughput["t"], throughput["rate"]
            d[1].x, d[1].y = [m.t - t0 for m in faults], [top * 1.05] * len(faults)
            d[1].text = [m.label for m in faults]
            d[2].x, d[2].y = _hold(quorum["t"], quorum["participants"], t_end)
            d[3].x, d[3].y = _hold(queue["t"], queue["dead"], t_end)
            d[4].x, d[4].y = _hold(queue["t"], queue["hung"], t_end)
            fig.layout.shapes = [
                dict(
                    type="line",
                    xref="x",
                    yref="paper",
                    x0=m.t - t0,
                    x1=m.t - t0,
                    y0=0,
                    y1=1,
                    line=dict(color="rgba(213,0,0,0.35)", width=1),
                )
                for m in faults
            ]
            if self.replay is not None:
                fig.layout.xaxis3.range = [0, self.replay.end - self.replay.start]
        # Shown whole (it is small and redrawn at most every plot_every s), through a LivePlot rather
        # than an Output: in JupyterLab an ended run's Output plot came up blank after a reload.
        shown = json.loads(pio.to_json(fig, validate=False))
        self.clock_plot.show(
            {t["name"]: {k: _plain(t[k]) for k in ("x", "y", "text") if k in t} for t in shown["data"]},
            {
                "shapes": shown["layout"].get("shapes", []),
                **({"xaxis3": {"range": shown["layout"]["xaxis3"]["range"]}} if self.replay is not None else {}),
            },
        )
        self._clock_plotted_at = time.monotonic()

    def _start_replay(self) -> None:
        """Once the run has ended: fold its log once more, event by event, for the scrubber."""
        from workbench.trainers import trainer_kind

        self.replay = Replay(
            self.run.events_read,
            self.spec.replicas,
            self.spec.steps,
            trainer_kind(self.spec.trainer).samples_per_step(self.spec),
        )
        span = max(self.replay.end - self.replay.start, 1.0)
        with self.scrubber.hold_trait_notifications():
            self.scrubber.max = span
            self.scrubber.step = max(0.5, round(span / 400, 1))
            self.scrubber.value = span
        self.scrub_box.layout.display = "flex"
        self.scrub_label.value = "the whole run; drag to replay it"

    def scrub(self, seconds: float) -> Optional[Snapshot]:
        """Show the run as it stood ``seconds`` after its first event (grid and wall-clock plots)."""
        if self.replay is None:
            return None
        with self._render_lock:
            snap = self.replay.at(self.replay.start + float(seconds))
            self.scrub_t = snap.t
            up = sum(c.state == "participating" for c in snap.cells)
            dead = sum(c.state == "dead" for c in snap.cells)
            self.scrub_label.value = (
                f"<span class='wb-scrub-at' data-t='{snap.t - self.replay.start:.1f}'>"
                f"t = {snap.t - self.replay.start:.0f} s · {up}/{len(snap.cells)} participating"
                f" · {dead} dead · {len(snap.faults)} faults so far</span>"
            )
            self._set(self.tiles, self._grid_html(snap.cells))
            self._draw_clock(snap.throughput, snap.quorum, snap.queue, snap.faults, t_end=snap.t - self.replay.start)
            return snap

    def _grid_html(self, grid: list) -> str:
        """One small cell per group, coloured by state, its attempt in the corner."""
        counts = {st: 0 for st in STATES}
        parts = []
        for c in grid:
            counts[c.state] = counts.get(c.state, 0) + 1
            parts.append(
                f"<div class='wb-cell' data-replica='{c.replica}' data-state='{c.state}' "
                f"data-attempt='{c.attempt}' style='background:{c.color}' title='replica {c.replica}: "
                f"{c.state}, attempt {c.attempt}'>{c.replica}<sup>{c.attempt or ''}</sup></div>"
            )
        legend = "".join(
            f"<span style='background:{STATE_COLORS[st]}'>{st} {n}</span>" for st, n in counts.items() if n
        )
        return f"<div class='wb-legend'>{legend}</div><div class='wb-grid'>{''.join(parts)}</div>"

    @staticmethod
    def _backlog_html(b: dict) -> str:
        verdict = (
            "relaunch and spares kept up"
            if b["kept_up"]
            else "<b style='color:#c62828'>fault rate not absorbed: the queue of dead groups grows</b>"
        )
        return (
            f"<div class='wb-backlog-now' data-peak='{b['peak']}' data-at-end='{b['at_end']}' "
            f"data-kept-up='{str(b['kept_up']).lower()}'><b>dead-group queue</b> peak {b['peak']} · "
            f"mean {b['mean']:.2f} · now {b['at_end']} · {verdict}</div>"
        )

    # -- html panels ---------------------------------------------------------------
    def _header_html(self) -> str:
        s = self.state
        live = "live" if self.running else "not polling"
        run_state = s.run_state or ("running" if s.events_seen else "waiting for events")
        return (
            f"<div class='wb-title' data-run-state='{html.escape(run_state)}'><b>{html.escape(self.run_dir.name)}</b>"
            f" · {html.escape(self.spec.trainer)} · {self.spec.replicas} replica groups · {html.escape(run_state)}"
            f" · <span class='wb-live'>{live}</span> · {s.events_seen} events</div>"
        )

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
                + (";outline:3px solid #000" if t.diverged_at is not None else "")
                + "'>"
                f"<b>replica {r}</b> · <span class='wb-tile-state'>{t.state}</span>"
                + (
                    f" · <b class='wb-diverged'>diverged at step {_fmt(t.diverged_at)}</b>"
                    if t.diverged_at is not None
                    else ""
                )
                + (f" · <b class='wb-impaired'>{_fmt(t.impaired['kind'])}</b>" if t.impaired else "")
                + "<br>"
                f"step {_fmt(t.step)} · attempt {t.attempt}"
                + (f" · {t.steps_lost} steps redone" if t.steps_lost else "")
                + "<br>"
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
            rows.append(
                f"<tr data-node='{_fmt(n['node'])}' data-state='{n['state']}'><td>{_fmt(n['node'])}</td>"
                f"<td>{_fmt(n['address'])}</td><td>{state}</td><td>{running}</td>"
                f"<td class='wb-health'>{html.escape(n['health_line'])}</td></tr>"
            )
        if not rows:
            return ""
        return (
            "<b>nodes</b><table class='wb-table'><tr><th>node</th><th>address</th><th>state</th>"
            f"<th>running</th><th>health</th></tr>{''.join(rows)}</table>"
        )

    def _quorum_html(self) -> str:
        s = self.state
        rows = "".join(
            f"<tr><td>{_fmt(q['quorum_id'])}</td><td>{_fmt(q['step'])}</td><td>{_fmt(q['participants'])}</td></tr>"
            for q in s.quorum_history[-5:][::-1]
        )
        return (
            f"<div class='wb-quorum-now' data-quorum-id='{_fmt(s.quorum_id)}' data-participants='{_fmt(s.participants)}'>"
            f"<b>quorum</b> {_fmt(s.quorum_id)} · <b>{_fmt(s.participants)}</b> participants</div>"
            f"<div style='display:flex;gap:16px;align-items:flex-start'>"
            f"<table class='wb-table'><tr><th>quorum</th><th>step</th><th>participants</th></tr>{rows}</table>"
            f"{self._participants_svg()}</div>"
        )

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
        return (
            f"<svg class='wb-participants' width='{width}' height='{height}' data-changes='{len(h)}'>"
            f"<text x='30' y='{height - 2}' font-size='12'>participants over {span:.0f} s</text>"
            f"<text x='2' y='{y(top) + 4:.0f}' font-size='12'>{top}</text><text x='2' y='{y(0) + 4:.0f}' font-size='12'>0</text>"
            f"<line x1='30' x2='{width - 10}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#bbb'/>"
            f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{' '.join(points)}'/></svg>"
        )

    def _checkpoints_html(self) -> str:
        now = time.time()
        rows = (
            "".join(
                f"<tr><td>{k}</td><td>{_fmt(c['step'])}</td><td>{_fmt(now - c['t'], '.0f', ' s')}</td>"
                f"<td>{_bytes(c['bytes'])}</td><td>{_fmt(c['seconds'], '.2f', ' s')}</td></tr>"
                for k, c in sorted(self.state.checkpoints.items(), key=lambda kv: str(kv[0]))
            )
            or "<tr><td colspan=5>no durable checkpoint yet</td></tr>"
        )
        return (
            "<b>durable checkpoints</b><table class='wb-table'><tr><th>replica</th><th>step</th><th>age</th>"
            f"<th>size</th><th>write</th></tr>{rows}</table>"
        )

    def _heals_html(self) -> str:
        rows = (
            "".join(
                f"<tr><td>{_fmt(h['replica'])}</td><td>{_fmt(h['from'])}</td><td>{_fmt(h['step'])}</td>"
                f"<td>{_fmt(h['seconds'], '.2f', ' s')}</td><td>{_bytes(h['bytes'])}</td>"
                f"<td>{_bytes(h['bytes_per_s'])}/s · {_fmt(h['served_from'])} via {_fmt(h['interface'])}</td></tr>"
                for h in self.state.heals[-5:][::-1]
            )
            or "<tr><td colspan=6>no peer heal yet</td></tr>"
        )
        return (
            "<b>peer-heal transfers</b><table class='wb-table'><tr><th>replica</th><th>from</th><th>step</th>"
            f"<th>time</th><th>bytes</th><th>rate · route</th></tr>{rows}</table>"
        )

    def _tail_html(self) -> str:
        lines = []
        for e in list(self.state.tail)[::-1]:
            stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t") or 0))
            extra = " ".join(
                f"{k}={e[k]}"
                for k in (
                    "replica",
                    "attempt",
                    "action",
                    "target",
                    "origin",
                    "state",
                    "reason",
                    "phase",
                    "step",
                    "quorum_id",
                    "message",
                )
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
        self._unsubscribe_timeline()
        self.render()

    def _show_update_error(self, e: Exception) -> None:
        self.fault_status.value = f"<span style='color:#c62828'>dashboard update failed: {html.escape(repr(e))}</span>"


__all__ = ["Dashboard", "STATES", "active_dashboards"]
