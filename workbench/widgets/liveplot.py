"""``LivePlot``: a plotly figure in an anywidget that receives only new points.

Why not plotly's ``FigureWidget`` (measured here, plotly 7.1, anywidget 0.11,
JupyterLab 4.6): its 4 MB ES module is loaded per widget, messages that
arrive while it loads are dropped (plots came up empty and stayed empty),
and a view that attaches later is sent the data the figure was built with.
Why not the ``Output`` with a plotly mime bundle (``plot.py``): each change
ships the whole figure, so an update's cost grows with what is drawn.

How this one avoids both:

- plotly.js is the installed plotly package's own ``plotly.min.js`` (no CDN:
  the browser may have no network), carried once per kernel by one
  :class:`PlotlyLib` widget and evaluated once per page; ``liveplot.js``
  waits for it before drawing.
- the content (``appendplot``'s store: points and tails per trace, ``seq``)
  is kept per *model* in the frontend, filled from the model's state when the
  model is created and then by ``update`` messages carrying only new points
  (:class:`~workbench.widgets.appendplot.PlotFeed`). Views draw that store,
  so a view created late (display after updates, a page reload, Voilà)
  draws everything.
- the ``data`` trait is that content in the kernel, updated *in place* (no
  trait event, so nothing is synced per update) and copied by
  :meth:`LivePlot.get_state`: every frontend that asks for the widget's state
  (a first display, JupyterLab's restore after a reload, Voilà) gets the
  current content.
- a frontend that misses a message (one sent while its module loaded) sees
  ``prev`` ≠ its ``seq``, ignores further deltas and asks for the whole
  content (``sync``); a model whose module has loaded says ``ready`` with its
  ``seq``. The kernel answers those when its shell is free, and sends the
  whole content unasked 1 s and 4 s after any state request, which covers a
  cell that keeps the shell busy and a run that sends nothing more (the
  first message of a new dashboard is sent while its module loads: measured
  lost in JupyterLab).
"""

from __future__ import annotations

import base64
import copy
import json
import threading
from pathlib import Path
from typing import Optional

import anywidget
import numpy as np
import plotly
import plotly.graph_objects as go
import plotly.io as pio
import traitlets

from workbench.widgets.appendplot import apply, drawn, full_message

_JS = Path(__file__).with_name("liveplot.js")
KEYFRAME_AFTER_S = (1.0, 4.0)


def _plotly_source() -> str:
    return (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()


def live_spec(fig: go.Figure) -> dict:
    """The LivePlot ``spec`` of a template figure: its layout and its traces' styles, no points."""
    spec = json.loads(pio.to_json(fig, validate=False))
    traces = [{k: v for k, v in t.items() if k not in ("x", "y", "customdata", "text")} for t in spec["data"]]
    return {"layout": spec["layout"], "traces": traces, "config": {"displaylogo": False, "responsive": True}}


def plain(v):
    """A plotly JSON array as a list (plotly's JSON writes numeric arrays as base64 ``bdata``)."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return v


class PlotlyLib(anywidget.AnyWidget):
    """Carries plotly.min.js to the page once per kernel (one instance: :func:`plotly_lib`)."""

    _esm = _JS
    kind = traitlets.Unicode("lib").tag(sync=True)
    source = traitlets.Unicode("").tag(sync=True)


_LIB: Optional[PlotlyLib] = None
_LIB_LOCK = threading.Lock()


def plotly_lib() -> PlotlyLib:
    """This kernel's :class:`PlotlyLib` (made on first use; again if it was closed)."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None or _LIB.comm is None:
            _LIB = PlotlyLib(source=_plotly_source())
        return _LIB


class LivePlot(anywidget.AnyWidget):
    """A live plotly figure: ``spec`` (``{"layout", "traces": [styles], "config"}``, set once) and
    :meth:`push` of :class:`~workbench.widgets.appendplot.PlotFeed` messages.

    Display it next to :func:`plotly_lib` (the dashboard puts both in one box).
    """

    _esm = _JS
    kind = traitlets.Unicode("plot").tag(sync=True)
    spec = traitlets.Dict().tag(sync=True)
    data = traitlets.Dict().tag(sync=True)

    def __init__(self, spec: dict, **kwargs) -> None:
        self._lock = threading.RLock()
        self._keyframe_timers: list[threading.Timer] = []
        super().__init__(spec=spec, data={"seq": 0, "xtitle": None, "layout": {}, "traces": {}, "tails": {}}, **kwargs)
        self.on_msg(self._on_frontend)
        self.pushes = 0
        self.syncs_sent = 0

    def push(self, msg: dict) -> None:
        """Apply ``msg`` to the content and send it to the frontends (only what it carries)."""
        with self._lock:
            apply(self.data, msg)
            self.pushes += 1
            self.send({"type": "update", **msg})

    def show(self, traces: dict[str, dict], layout: Optional[dict] = None) -> None:
        """Replace the whole content: ``traces`` by name (``{"x", "y"[, "customdata", "text"]}``, lists)
        and a ``layout`` patch over the spec's. For a figure that is redrawn whole (the wall-clock plots)."""
        with self._lock:
            seq = int(self.data.get("seq", 0)) + 1
            self.push(
                {
                    "seq": seq,
                    "prev": seq - 1,
                    "full": True,
                    "xtitle": None,
                    "layout": layout or {},
                    "traces": traces,
                    "tails": {},
                    "reset": list(traces),
                }
            )

    def send_full(self) -> None:
        """Send the whole content: any frontend's store becomes the kernel's."""
        with self._lock:
            msg = full_message(self.data)
            self.syncs_sent += 1
            self.send({"type": "update", **msg})

    def drawn(self, name: str) -> dict[str, list]:
        """What a frontend draws for trace ``name`` (its points, then its tail)."""
        with self._lock:
            return drawn(self.data, name)

    def get_state(self, key=None):
        with getattr(self, "_lock", threading.RLock()):
            state = super().get_state(key)
            if "data" in state:
                state["data"] = copy.deepcopy(state["data"])  # serialised later, outside this lock
        if "data" in state and hasattr(self, "_keyframe_timers"):
            self._schedule_keyframes()  # also at the first open, when ``self.comm`` is not set yet
        return state

    def _schedule_keyframes(self) -> None:
        self._keyframe_timers = [t for t in self._keyframe_timers if t.is_alive()]
        if self._keyframe_timers:
            return
        for delay in KEYFRAME_AFTER_S:
            timer = threading.Timer(delay, self._keyframe)
            timer.daemon = True
            timer.start()
            self._keyframe_timers.append(timer)

    def _keyframe(self) -> None:
        if self.comm is not None:
            self.send_full()

    def _on_frontend(self, _widget, content, _buffers) -> None:
        if not isinstance(content, dict):
            return
        if content.get("type") == "sync" or (
            content.get("type") == "ready" and content.get("seq") != self.data.get("seq")
        ):
            self.send_full()

    def close(self) -> None:
        for t in self._keyframe_timers:
            t.cancel()
        super().close()
