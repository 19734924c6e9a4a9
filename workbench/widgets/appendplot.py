"""What a live plot sends: only new points, with decimation whose drawn prefix never changes.

The dashboard's loss plot (:class:`~workbench.widgets.liveplot.LivePlot`) is
fed by :class:`PlotFeed`: each update yields one small message with, per
trace, the points drawn since the last message. No ipywidgets here: tests
drive this module with a :class:`~workbench.widgets.state.DashboardState`.

Decimation that can be appended to (:class:`AppendDecimator`). ``state.decimate``
cuts the whole series into ``max_points // 2`` equal buckets, so every bucket
moves when one point arrives: appending would be impossible. Here the
buckets have a fixed width ``w`` (a power of two) in source points: bucket
``j`` is points ``[j*w, (j+1)*w)`` and, once complete, is drawn as its minimum
and maximum in index order (spikes survive) and never changes again. Only
two things are not appends:

- the *tail*, the incomplete last bucket: drawn as its min, max and last
  point, re-sent whole with each message (at most 3 points), so the newest
  loss shows at once;
- a *reset*: when the drawn points would exceed ``max_points`` the width
  doubles and that trace is re-sent whole (decimated at the new width, so
  between ``max_points / 2`` and ``max_points`` points). That happens each time
  the series doubles in length (7 times between 1.5k and 100k points), and
  when the x axis changes (step ↔ wall time).

So one update costs O(new points + w) in the kernel (``w`` ≤ 2n / max_points,
128 at 100k points per curve), not O(n), and O(drawn points) only at a reset.

Messages (JSON): ``{"seq", "prev", "full", "xtitle", "traces": {name: {"x", "y",
"customdata"[, "text"]}}, "tails": {name: {...}}, "reset": [names][, "layout"]}``
(``layout``: a patch over the figure's layout, kept until the next one; ``xtitle``:
the x axis title, none to keep the layout's). A
trace in ``reset`` (all of them when ``full``) replaces what the frontend has;
any other is appended. ``tails`` replaces each named trace's tail. A
frontend applies a message only if its own ``seq`` equals ``prev`` (else it
waits for a full message): see ``liveplot.py`` for how it gets one.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

EMPTY = np.empty(0, dtype=np.int64)


def _extremes(values: np.ndarray, lo: int, hi: int, width: int) -> np.ndarray:
    """Indices of the min and max (index order, once if the same) of each ``width`` bucket in ``[lo, hi)``."""
    if hi <= lo:
        return EMPTY
    if width == 1:
        return np.arange(lo, hi)
    body = values[lo:hi].reshape(-1, width)
    nan = np.isnan(body)
    a = np.where(nan, np.inf, body).argmin(axis=1)
    b = np.where(nan, -np.inf, body).argmax(axis=1)
    base = lo + np.arange(body.shape[0]) * width
    first, second = base + np.minimum(a, b), base + np.maximum(a, b)
    pairs = np.stack([first, second], axis=1).ravel()
    keep = np.ones(len(pairs), dtype=bool)
    keep[1::2] = second != first
    return pairs[keep]


class AppendDecimator:
    """Which points of one growing series are drawn, as appends (see the module docstring).

    :meth:`update` takes the whole series (only its new part and the
    incomplete bucket are read) and says what to send.
    """

    def __init__(self, max_points: int) -> None:
        if max_points < 8:
            raise ValueError(f"max_points: at least 8, got {max_points}")
        self.max_points = int(max_points)
        self.width = 1
        self.done = 0  # source points covered by complete, already-sent buckets
        self.drawn = 0  # points sent for those buckets
        self.last_sent = -1

    def _width_for(self, n: int) -> int:
        if self.width == 1 and n <= self.max_points:
            return 1
        w = max(self.width, 2)
        while 2 * math.ceil(n / w) > self.max_points:
            w *= 2
        return w

    def update(self, values: np.ndarray) -> tuple[bool, np.ndarray, np.ndarray]:
        """``(reset, new, tail)``: indices to append (all drawn indices if ``reset``), and the tail's."""
        n = len(values)
        width = self._width_for(n)
        reset = width != self.width
        if reset:
            self.width, self.done, self.drawn, self.last_sent = width, 0, 0, -1
        complete = (n // width) * width
        new = _extremes(values, self.done, complete, width)
        self.done = complete
        self.drawn += len(new)
        if len(new):
            self.last_sent = int(new[-1])
        if complete < n:
            seg = values[complete:n]
            tail = (
                np.unique(
                    [
                        int(np.nanargmin(seg)) if not np.isnan(seg).all() else 0,
                        int(np.nanargmax(seg)) if not np.isnan(seg).all() else 0,
                        n - 1 - complete,
                    ]
                )
                + complete
            )
        elif n and self.last_sent != n - 1:
            tail = np.array([n - 1])
        else:
            tail = EMPTY
        return reset, new, tail

    def restart(self) -> None:
        """The next update re-sends everything (the x axis changed)."""
        self.width, self.done, self.drawn, self.last_sent = max(self.width, 1), 0, 0, -1


class PlotFeed:
    """Turns a ``DashboardState``'s loss series and markers into live-plot messages.

    ``names``: the trace name of each replica (``"replica {r}"``) and of each
    marker kind (``MARKER_NAMES``). :meth:`update` returns the next message, or
    ``None`` when nothing changed; :meth:`full` a message that replaces
    everything (for a frontend that lost track).
    """

    def __init__(self, marker_names: dict[str, str], max_points: int = 1500) -> None:
        self.marker_names = dict(marker_names)
        self.max_points = int(max_points)
        self.seq = 0
        self.x: Optional[str] = None
        self.t0: Optional[float] = None
        self._dec: dict[int, AppendDecimator] = {}
        self._markers_seen = 0
        self.tail_sent: dict[str, tuple] = {}

    @staticmethod
    def xtitle(x: str) -> str:
        return "step" if x == "step" else "wall time since first event (s)"

    def update(self, state, x: str = "step") -> Optional[dict]:
        t0 = state.t0 or 0.0
        full = x != self.x or t0 != self.t0
        if full:
            self.x, self.t0 = x, t0
            self._markers_seen = 0
            self.tail_sent = {}
            for dec in self._dec.values():
                dec.restart()
        traces: dict[str, dict] = {}
        tails: dict[str, dict] = {}
        reset: list[str] = []
        for r, series in state.loss.items():
            name = f"replica {r}"
            dec = self._dec.get(r)
            if dec is None:
                dec = self._dec[r] = AppendDecimator(self.max_points)
            loss = series.loss.values
            was_reset, new, tail = dec.update(loss)
            if was_reset or full:
                reset.append(name)
            if len(new) or was_reset or full:
                traces[name] = self._points(series, new, x, t0)
            key = tuple(tail.tolist())  # a point's values never change: its index names it
            if self.tail_sent.get(name) != key or was_reset or full:
                tails[name] = self._points(series, tail, x, t0)
                self.tail_sent[name] = key
        markers = state.markers[self._markers_seen :]
        self._markers_seen = len(state.markers)
        if full:
            for _kind, name in self.marker_names.items():
                traces[name] = {"x": [], "y": [], "customdata": [], "text": []}
                reset.append(name)
        for m in markers:
            name = self.marker_names.get(m.kind)
            if name is None:
                continue
            t = traces.setdefault(name, {"x": [], "y": [], "customdata": [], "text": []})
            t["x"].append(m.step if x == "step" else m.t - t0)
            t["y"].append(None if math.isnan(m.loss) else m.loss)
            t["customdata"].append(m.step)
            t["text"].append(m.label)
        if not (traces or tails or full):
            return None
        self.seq += 1
        msg = {"seq": self.seq, "prev": self.seq - 1, "full": full, "traces": traces, "tails": tails, "reset": reset}
        if full:
            msg["xtitle"] = self.xtitle(x)
        return msg

    @staticmethod
    def _points(series, idx: np.ndarray, x: str, t0: float) -> dict:
        steps = series.step.values[idx]
        xs = steps if x == "step" else series.t.values[idx] - t0
        return {"x": xs.tolist(), "y": series.loss.values[idx].tolist(), "customdata": steps.tolist()}


def apply(store: dict, msg: dict) -> dict:
    """Apply a message to a plot's content ``{"seq", "xtitle", "traces", "tails"}`` in place: what the
    frontend does (``liveplot.js``), and what the kernel keeps as the widget's state for a new view."""
    if msg.get("full"):
        store["traces"], store["tails"] = {}, {}
        store["xtitle"] = msg.get("xtitle")
        store["layout"] = msg.get("layout") or {}
    elif "layout" in msg:
        store["layout"] = msg["layout"] or {}
    traces, tails = store.setdefault("traces", {}), store.setdefault("tails", {})
    reset = set(msg.get("reset", ()))
    for name, pts in msg.get("traces", {}).items():
        have = traces.get(name)
        if have is None or name in reset:
            traces[name] = {k: list(v) for k, v in pts.items()}
        else:
            for k, v in pts.items():
                have.setdefault(k, []).extend(v)
    for name, pts in msg.get("tails", {}).items():
        tails[name] = {k: list(v) for k, v in pts.items()}
    store["seq"] = msg["seq"]
    return store


def full_message(store: dict) -> dict:
    """A message that makes any frontend's content equal to ``store`` (a copy)."""
    return {
        "seq": store.get("seq", 0),
        "prev": None,
        "full": True,
        "xtitle": store.get("xtitle"),
        "layout": store.get("layout") or {},
        "traces": {n: {k: list(v) for k, v in t.items()} for n, t in store.get("traces", {}).items()},
        "tails": {n: {k: list(v) for k, v in t.items()} for n, t in store.get("tails", {}).items()},
        "reset": list(store.get("traces", {})),
    }


def drawn(store: dict, name: str) -> dict[str, list]:
    """What a frontend with this content draws for trace ``name``: its points, then its tail."""
    main, tail = store.get("traces", {}).get(name, {}), store.get("tails", {}).get(name, {})
    keys = set(main) | set(tail)
    return {k: list(main.get(k, [])) + list(tail.get(k, [])) for k in keys}
