"""``WallClockView``: the dashboard's classroom views over wall-clock time, and the time scrubber.

What a class of 16-32 groups needs (:mod:`workbench.analysis.wallclock`
computes it): useful throughput, quorum size and the dead-group queue over
wall-clock time with every fault marked, the queue's verdict (did relaunch
and spares keep up), and, once the run has ended, a time scrubber that
replays the group grid and the plots from the log.

Live, a :class:`~workbench.analysis.wallclock.Timeline` subscribed to the
run's fold follows each folded batch, and the plots are redrawn whole (they
are small) at most every ``plot_every`` seconds while the dashboard polls.
Once the run has ended, a :class:`~workbench.analysis.wallclock.Replay` folds
the log once more for the scrubber; while scrubbed, the plots and the grid
(drawn into the dashboard's ``tiles``) show the run as it stood then.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Optional

import ipywidgets as w
import plotly.io as pio
from plotly.subplots import make_subplots

from workbench.analysis.figures import readable
from workbench.analysis.wallclock import Replay, Snapshot, Timeline
from workbench.trainers import trainer_kind
from workbench.widgets.liveplot import LivePlot, live_spec, plain, plotly_lib
from workbench.widgets.lossplot import LEGEND_BELOW, MARKER_STYLE
from workbench.widgets.panels import backlog_html, grid_html, show
from workbench.widgets.state import DashboardState


def hold(t, y, t_end: Optional[float]):
    """A step line's points held to ``t_end`` (its last value drawn up to the scrubbed time)."""
    t, y = list(t), list(y)
    if t and t_end is not None and t_end > t[-1]:
        t.append(t_end)
        y.append(y[-1])
    return t, y


def clock_figure(replicas: int):
    """Useful samples/s with the faults marked, quorum size, dead and hung groups; no points."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.5, 0.25, 0.25])
    fig.add_scatter(
        x=[],
        y=[],
        mode="lines",
        line=dict(shape="hv", color="#1f77b4", width=2),
        name="useful samples/s",
        row=1,
        col=1,
        hovertemplate="%{x:.0f} s<br>%{y:,.0f} samples/s<extra></extra>",
    )
    fig.add_scatter(
        x=[],
        y=[],
        mode="markers",
        marker=MARKER_STYLE["fault"],
        name="faults",
        row=1,
        col=1,
        hovertemplate="%{text}<br>%{x:.1f} s<extra></extra>",
    )
    fig.add_scatter(
        x=[],
        y=[],
        mode="lines",
        line=dict(shape="hv", color="#43a047", width=2),
        name="quorum size",
        row=2,
        col=1,
        hovertemplate="%{x:.1f} s<br>%{y} groups<extra></extra>",
    )
    fig.add_scatter(
        x=[],
        y=[],
        mode="lines",
        line=dict(shape="hv", color="#e53935", width=2),
        name="dead groups",
        row=3,
        col=1,
        hovertemplate="%{x:.1f} s<br>%{y} dead<extra></extra>",
    )
    fig.add_scatter(
        x=[],
        y=[],
        mode="lines",
        line=dict(shape="hv", color="#8e24aa", width=1, dash="dot"),
        name="hung groups",
        row=3,
        col=1,
        hovertemplate="%{x:.1f} s<br>%{y} hung<extra></extra>",
    )
    fig.update_layout(
        height=440,
        margin=dict(l=60, r=10, t=40, b=70),
        uirevision="keep",
        hovermode="closest",
        title=dict(text="over wall-clock time", x=0.01, font=dict(size=13)),
        legend=LEGEND_BELOW,
    )
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="quorum", range=[0, replicas + 0.5], row=2, col=1)
    fig.update_yaxes(title_text="queue", rangemode="tozero", row=3, col=1)
    fig.update_xaxes(title_text="wall time since first event (s)", row=3, col=1)
    readable(fig)
    return fig


class WallClockView:
    """The wall-clock plots (``box``), the queue's verdict (``backlog_panel``) and the scrubber
    (``scrub_box``, hidden until the run has ended) of ``run``.

    ``state`` is the dashboard's; ``lock`` its render lock (the timeline is fed and the views
    drawn under it); ``polling()`` says whether its updater runs; ``tiles`` is where the
    scrubbed grid is drawn.
    """

    def __init__(
        self,
        run: Any,
        state: DashboardState,
        lock: threading.RLock,
        plot_every: float,
        polling: Callable[[], bool],
        tiles: w.HTML,
    ) -> None:
        self.run, self.spec, self.state = run, run.spec, state
        self.plot_every = plot_every
        self._lock, self._polling, self._tiles = lock, polling, tiles
        self.samples_per_step = trainer_kind(self.spec.trainer).samples_per_step(self.spec)
        self.timeline = Timeline(run.run_state, self.samples_per_step)
        self.timeline.observe(list(run.events_read))
        self._unsubscribe = run.run_state.subscribe(self._observe)
        self.figure = clock_figure(self.spec.replicas)
        self.plot = LivePlot(live_spec(self.figure), layout=w.Layout(width="100%", min_height="460px"))
        self.box = w.Box([plotly_lib(), self.plot], layout=w.Layout(width="100%")).add_class("wb-clock-plot")
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
        self._drawn: Optional[tuple] = None
        self._plotted_at = float("-inf")

    def _observe(self, events: list[dict]) -> None:
        with self._lock:
            self.timeline.observe(events)

    def stop(self) -> None:
        """Stop following the run's fold."""
        self._unsubscribe()

    def render(self, force: bool) -> None:
        """Draw what changed: the queue's verdict each time, the plots at most every ``plot_every`` s
        while polling (``force``: now); nothing live while scrubbed."""
        if self.state.run_state is not None and self.replay is None:
            self._start_replay()
        tl = self.timeline
        show(self.backlog_panel, backlog_html((self.replay.timeline if self.replay else tl).backlog()))
        if self.scrub_t is not None:
            return
        key = ("live", tl.version)
        if not force and self._drawn == key:
            return
        if not force and self._polling() and time.monotonic() - self._plotted_at < self.plot_every:
            return
        t_now = self.state.last_event_t
        self._draw(
            tl.throughput(until=t_now if self._polling() else None),
            tl.quorum_series(),
            tl.queue_series(),
            tl.marks_until(None, "fault"),
            t_end=(t_now - (self.state.t0 or 0.0)) if t_now else None,
        )
        self._drawn = key

    def _draw(self, throughput: dict, quorum: dict, queue: dict, faults: list, t_end: Optional[float]) -> None:
        t0 = self.state.t0 or 0.0
        fig = self.figure
        top = float(throughput["rate"].max()) if len(throughput["rate"]) else 1.0
        with fig.batch_update():
            d = fig.data
            d[0].x, d[0].y = throughput["t"], throughput["rate"]
            d[1].x, d[1].y = [m.t - t0 for m in faults], [top * 1.05] * len(faults)
            d[1].text = [m.label for m in faults]
            d[2].x, d[2].y = hold(quorum["t"], quorum["participants"], t_end)
            d[3].x, d[3].y = hold(queue["t"], queue["dead"], t_end)
            d[4].x, d[4].y = hold(queue["t"], queue["hung"], t_end)
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
        self.plot.show(
            {t["name"]: {k: plain(t[k]) for k in ("x", "y", "text") if k in t} for t in shown["data"]},
            {
                "shapes": shown["layout"].get("shapes", []),
                **({"xaxis3": {"range": shown["layout"]["xaxis3"]["range"]}} if self.replay is not None else {}),
            },
        )
        self._plotted_at = time.monotonic()

    def _start_replay(self) -> None:
        """Once the run has ended: fold its log once more, event by event, for the scrubber."""
        self.replay = Replay(self.run.events_read, self.spec.replicas, self.spec.steps, self.samples_per_step)
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
        with self._lock:
            snap = self.replay.at(self.replay.start + float(seconds))
            self.scrub_t = snap.t
            up = sum(c.state == "participating" for c in snap.cells)
            dead = sum(c.state == "dead" for c in snap.cells)
            self.scrub_label.value = (
                f"<span class='wb-scrub-at' data-t='{snap.t - self.replay.start:.1f}'>"
                f"t = {snap.t - self.replay.start:.0f} s · {up}/{len(snap.cells)} participating"
                f" · {dead} dead · {len(snap.faults)} faults so far</span>"
            )
            show(self._tiles, grid_html(snap.cells))
            self._draw(snap.throughput, snap.quorum, snap.queue, snap.faults, t_end=snap.t - self.replay.start)
            return snap
