"""``ComparisonWidget``: a live side-by-side view of a sweep (or any list of runs).

Presentation only: what is shown comes from :mod:`workbench.analysis.compare`
(:func:`~workbench.analysis.compare.table`, :func:`~workbench.analysis.compare.committed_losses`)
and ``Sweep.status()``, so tests check the same numbers without a browser by
calling :meth:`ComparisonWidget.update` and reading :attr:`table` and the
figure's traces.

Like the run dashboard, a background thread (:class:`~workbench.widgets.updater.Updater`)
refreshes it (every ``interval`` seconds, 2 s by default: each refresh reads
every run's new events and recomputes its figures), one updater per sweep per
kernel (a new widget on the same sweep, say a re-run cell, stops the previous
one), and the thread ends by itself after drawing the state in which every run
has ended. The loss curves are a plain ``go.Figure`` shown through an
``ipywidgets.Output``, redrawn whole when a curve changed (see
:mod:`workbench.widgets.plot` for why not a ``FigureWidget``).
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Optional, Sequence

import ipywidgets as w
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis import compare, compare_figures
from workbench.analysis.figures import readable
from workbench.experiments.sweep import SWEEP_TERMINAL, Sweep
from workbench.run.handle import ENDED, Run, as_run
from workbench.widgets.plot import plot_bundle
from workbench.widgets.updater import Updater, active

SHOWN = (
    "point",
    "label",
    "state",
    "steps",
    "final_loss",
    "diverged_at",
    "steps_per_s",
    "goodput",
    "survivor_stall_s",
    "kill_to_rejoin_s",
    "faults_injected",
    "restarts",
)


class ComparisonWidget(w.VBox):
    """``ComparisonWidget(sweep)`` or ``ComparisonWidget([run_a, run_b], labels=[...])``.

    ``color_by``: the swept key that colours the loss curves (default: the
    first swept key). ``start=False`` builds it without the updater thread.
    """

    def __init__(
        self,
        source: Any,
        labels: Optional[Sequence[str]] = None,
        color_by: Optional[str] = None,
        interval: float = 2.0,
        start: bool = True,
        **kwargs: Any,
    ) -> None:
        self.sweep: Optional[Sweep] = source if isinstance(source, Sweep) else None
        self._runs = None if self.sweep is not None else [as_run(r) for r in source]
        if self.sweep is not None:
            self.key = str(self.sweep.sweep_dir)
            self.color_by = color_by or (self.sweep.params[0] if self.sweep.params else None)
        else:
            self.key = "|".join(str(r.run_dir) for r in self._runs)
            self.color_by = None
        self._labels = list(labels) if labels is not None else None
        self.interval = max(0.5, float(interval))
        self.table: pd.DataFrame = pd.DataFrame()
        self.last_update_s: Optional[float] = None
        self._lock = threading.RLock()
        self._updater = Updater(
            "comparison",
            self.key,
            self.update,
            self.ended,
            self.interval,
            name="wb-comparison",
            owner=self,
            on_error=self._show_update_error,
            on_exit=self._draw_header,
        )
        self._trace_of: dict[str, int] = {}
        self._drawn: dict[str, tuple] = {}

        self.header = w.HTML().add_class("wb-compare-header")
        self.figure = go.Figure(
            layout=dict(
                height=360,
                margin=dict(l=50, r=10, t=30, b=40),
                title=dict(text="loss", x=0.01, font=dict(size=13)),
                xaxis=dict(title=dict(text="step")),
                yaxis=dict(title=dict(text="loss")),
                uirevision="keep",
                legend=dict(title=dict(text=self.color_by or "")),
            )
        )
        readable(self.figure)
        self.plot_output = w.Output(layout=w.Layout(width="100%", min_height="380px")).add_class("wb-compare-loss")
        self.table_panel = w.HTML().add_class("wb-compare-table")
        super().__init__([self.header, self.plot_output, self.table_panel], **kwargs)
        self.update()
        if start:
            self.start()

    # -- what to show ----------------------------------------------------------
    def entries(self) -> list[tuple[str, Run, Any]]:
        """(label, run, colour value) of every run there is to draw, in point order."""
        if self.sweep is not None:
            runs = self.sweep.runs()
            out = []
            for i, run in runs.items():
                params = self.sweep.points[i]
                label = f"p{i}: " + ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in params.items())
                out.append((label, run, params.get(self.color_by) if self.color_by else i))
            return out
        labels = self._labels or [r.id for r in self._runs]
        return [(lab, run, i) for i, (lab, run) in enumerate(zip(labels, self._runs))]

    def ended(self) -> bool:
        if self.sweep is not None:
            return self.sweep.state() in SWEEP_TERMINAL
        return all(r.state() in ENDED for r in self._runs)

    # -- updating ------------------------------------------------------------------
    def update(self) -> pd.DataFrame:
        """Read new events, recompute the table and curves, redraw; returns the table."""
        with self._lock:
            t0 = time.perf_counter()
            entries = self.entries()
            if self.sweep is not None:
                table = self.sweep.table()
            else:
                table = compare.table([r for _, r, _ in entries], labels=[lab for lab, _, _ in entries])
            self.table = table
            self._draw_curves(entries)
            self._draw_header()
            self.table_panel.value = self._table_html()
            self.last_update_s = time.perf_counter() - t0
            return table

    def _draw_curves(self, entries: list[tuple[str, Run, Any]]) -> None:
        colors = compare_figures.colors_for([v for _, _, v in entries]) if entries else []
        fig = self.figure
        changed = not self.plot_output.outputs
        for (label, run, _), color in zip(entries, colors):
            if self._drawn.get(label) == (len(run.events_read), color):
                continue
            self._drawn[label] = (len(run.events_read), color)
            changed = True
            curve = compare.committed_losses(run.events_read)
            if label not in self._trace_of:
                fig.add_scatter(
                    x=[],
                    y=[],
                    mode="lines",
                    name=label,
                    line=dict(width=1.6),
                    hovertemplate=f"{html.escape(label)}<br>step %{{x}}<br>loss %{{y:.4f}}<extra></extra>",
                )
                self._trace_of[label] = len(fig.data) - 1
            trace = fig.data[self._trace_of[label]]
            trace.x, trace.y = curve["step"].to_numpy(), curve["loss"].to_numpy()
            trace.line.color = color
        if changed:
            self.plot_output.outputs = plot_bundle(fig, alt="loss curves")

    def _header_html(self) -> str:
        if self.sweep is not None:
            states = self.sweep.point_states()
            counts = " · ".join(f"{s} {states.count(s)}" for s in dict.fromkeys(states))
            title = f"sweep <b>{html.escape(self.sweep.id)}</b> · {html.escape(self.sweep.state())}"
        else:
            states = [r.state() for r in self._runs]
            counts = " · ".join(f"{s} {states.count(s)}" for s in dict.fromkeys(states))
            title = f"<b>{len(self._runs)} runs</b>"
        live = "live" if self.running else "not polling"
        return (
            f"<div class='wb-compare-title'>{title} · {html.escape(counts)} · <span class='wb-live'>{live}</span></div>"
        )

    def _table_html(self) -> str:
        df = self.table
        cols = [c for c in df.columns if c in SHOWN or (self.sweep is not None and c in self.sweep.params)]
        order = [c for c in ("point", "label") if c in cols] + [c for c in cols if c not in ("point", "label")]

        def cell(v: Any) -> str:
            if v is None or (isinstance(v, float) and v != v):
                return "–"
            return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))

        head = "".join(f"<th>{html.escape(c)}</th>" for c in order)
        body = "".join(
            f"<tr data-state='{html.escape(str(row.get('state')))}'>"
            + "".join(f"<td>{cell(row.get(c))}</td>" for c in order)
            + "</tr>"
            for row in df.to_dict(orient="records")
        )
        return f"<table class='wb-table'><tr>{head}</tr>{body}</table>"

    # -- the updater thread --------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._updater.running

    def start(self) -> "ComparisonWidget":
        """Start the updater thread, stopping any other comparison widget's on the same sweep."""
        self._updater.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._updater.stop(timeout)
        self._draw_header()

    def _draw_header(self) -> None:
        self.header.value = self._header_html()

    def _show_update_error(self, e: Exception) -> None:
        self.header.value = f"<span style='color:#c62828'>update failed: {html.escape(repr(e))}</span>"


def active_comparisons() -> dict[str, ComparisonWidget]:
    """This kernel's comparison widgets whose updater is running, by sweep directory (or run list)."""
    return active("comparison")
