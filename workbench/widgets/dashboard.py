"""``Dashboard``: the live view of one run, as ipywidgets around plotly figures.

Presentation only: :class:`~workbench.widgets.state.DashboardState` decides what
is shown; the dashboard composes the views that render it: the loss plot
(:mod:`~workbench.widgets.lossplot`), the HTML panels
(:mod:`~workbench.widgets.panels`), the wall-clock plots and time scrubber
(:mod:`~workbench.widgets.clockview`) and the fault controls
(:mod:`~workbench.widgets.faultcontrols`, ``run.fault(..., origin="button")``),
and the newest stacks of each group (:mod:`~workbench.widgets.stacks`, ``run.stacks``).

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
wall-clock plots are small whole figures, sent whole to their LivePlot at
most every ``plot_every`` seconds.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any, Optional

import ipywidgets as w

from workbench.analysis.wallclock import GRID_MIN_GROUPS, Replay, Snapshot, cells
from workbench.run.handle import attach
from workbench.widgets import panels
from workbench.widgets.appendplot import PlotFeed
from workbench.widgets.clockview import WallClockView
from workbench.widgets.faultcontrols import FaultControls
from workbench.widgets.liveplot import LivePlot, live_spec, plotly_lib
from workbench.widgets.lossplot import MARKER_NAMES, loss_figure, marker_traces
from workbench.widgets.stacks import StacksPanel
from workbench.widgets.state import STATES, DashboardState
from workbench.widgets.updater import Updater, active


def active_dashboards() -> dict[str, "Dashboard"]:
    """The dashboards of this kernel whose updater is running, by run directory."""
    return active("dashboard")


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

        self._build()
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
                w.HBox(
                    [self.checkpoint_panel, self.heal_panel], layout=w.Layout(flex_flow="row wrap", grid_gap="4px 32px")
                ),
                *([self.controls] if self.faults else []),
                self.stacks,
                self.tail_panel,
            ],
            **kwargs,
        )
        self.add_class("wb-dashboard")
        if start:
            self.start()

    # -- layout ------------------------------------------------------------------
    def _build(self) -> None:
        replicas = self.spec.replicas
        self.header = w.HTML(panels.STYLE).add_class("wb-header")
        self.progress = w.IntProgress(
            value=0, min=0, max=self.spec.steps, description="steps", layout=w.Layout(width="60%")
        ).add_class("wb-progress")
        self.x_toggle = w.ToggleButtons(
            options=[("step", "step"), ("wall time", "time")], value="step", style={"button_width": "90px"}
        ).add_class("wb-x-toggle")
        self.x_toggle.observe(lambda _: self.render(force_plot=True), names="value")

        self._trace_of = {r: r for r in range(replicas)}
        self._marker_trace = marker_traces(replicas)
        self.figure = loss_figure(replicas)
        self._feed = PlotFeed(MARKER_NAMES, self.max_points)
        self.loss_plot = LivePlot(live_spec(self.figure), layout=w.Layout(width="100%", min_height="400px"))
        self.loss_box = w.Box([plotly_lib(), self.loss_plot], layout=w.Layout(width="100%")).add_class("wb-loss-plot")

        self.tiles = w.HTML().add_class("wb-tiles-panel")
        self.node_panel = w.HTML().add_class("wb-nodes")
        self.quorum_panel = w.HTML().add_class("wb-quorum")
        # side by side where both tables fit on one line per row, one above the other where not
        self.checkpoint_panel = w.HTML(layout=w.Layout(flex="0 1 auto")).add_class("wb-checkpoints")
        self.heal_panel = w.HTML(layout=w.Layout(flex="0 1 auto", overflow="auto")).add_class("wb-heals")
        self.tail_panel = w.HTML().add_class("wb-tail-panel")

        self.controls = FaultControls(self.run, replicas, enabled=self.faults)
        self.stacks = StacksPanel(self.run, replicas, button=self.faults)
        self.replica_picker = self.controls.replica_picker
        self.action_picker = self.controls.action_picker
        self.hang_seconds = self.controls.hang_seconds
        self.inject_button = self.controls.inject_button
        self.fault_status = self.controls.fault_status

        # The classroom views: from GRID_MIN_GROUPS groups on, a compact grid instead of one tile each.
        self.compact = replicas >= GRID_MIN_GROUPS
        self.wallclock = WallClockView(
            self.run, self.state, self._render_lock, self.plot_every, lambda: self.running, self.tiles
        )
        self.timeline = self.wallclock.timeline
        self.clock = self.wallclock.figure
        self.clock_plot = self.wallclock.plot
        self.clock_box = self.wallclock.box
        self.backlog_panel = self.wallclock.backlog_panel
        self.scrubber = self.wallclock.scrubber
        self.scrub_label = self.wallclock.scrub_label
        self.scrub_box = self.wallclock.scrub_box

    # -- fault controls ------------------------------------------------------------
    def inject(self) -> Optional[dict]:
        """Inject the fault the controls describe; the outcome shows next to the button."""
        return self.controls.inject()

    # -- the time scrubber ---------------------------------------------------------
    @property
    def replay(self) -> Optional[Replay]:
        """The ended run's log folded event by event (None while it runs)."""
        return self.wallclock.replay

    @property
    def scrub_t(self) -> Optional[float]:
        """The time shown by the scrubber (None: the run as it is now)."""
        return self.wallclock.scrub_t

    def scrub(self, seconds: float) -> Optional[Snapshot]:
        """Show the run as it stood ``seconds`` after its first event (grid and wall-clock plots)."""
        return self.wallclock.scrub(seconds)

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
            show = panels.show
            show(
                self.header,
                panels.STYLE
                + panels.header_html(s, self.run_dir.name, self.spec.trainer, self.spec.replicas, self.running),
            )
            if self.scrub_t is None:
                show(self.tiles, panels.grid_html(cells(s.run)) if self.compact else panels.tiles_html(s))
            show(self.node_panel, panels.nodes_html(s))
            show(self.quorum_panel, panels.quorum_html(s, self.spec.replicas))
            show(self.checkpoint_panel, panels.checkpoints_html(s))
            show(self.heal_panel, panels.heals_html(s))
            show(self.tail_panel, panels.tail_html(s))
            self.stacks.render()
            self._render_loss(force_plot)
            self._render_classroom(force_plot)

    def _render_loss(self, force: bool) -> None:
        """Send the loss plot what is new (every poll: an update carries only new points);
        ``force`` also sends the whole content, for any frontend that lost track."""
        msg = self._feed.update(self.state, self.x_toggle.value)
        if msg is not None:
            self.loss_plot.push(msg)
        elif force:
            self.loss_plot.send_full()

    def _render_classroom(self, force: bool) -> None:
        self.wallclock.render(force)

    # -- the updater thread --------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._updater.running

    def start(self) -> "Dashboard":
        """Start the updater thread, stopping any other dashboard's on the same run."""
        self._updater.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the updater thread and the subscriptions to the run (the widgets keep what they show)."""
        self._updater.stop(timeout)
        self._unsubscribe()
        self.wallclock.stop()
        self.stacks.stop()
        self.render()

    def _show_update_error(self, e: Exception) -> None:
        self.fault_status.value = f"<span style='color:#c62828'>dashboard update failed: {html.escape(repr(e))}</span>"


__all__ = ["Dashboard", "STATES", "active_dashboards"]
