"""The classroom views of a run over wall-clock time, and their replay (no ipywidgets here).

At 16–32 replica groups one tile per group no longer fits a projector, and
the loss curve flattens long before a fault stops mattering: what shows a
fault then is useful throughput over wall-clock time. :class:`Timeline`
records, from the run-state fold (:class:`~workbench.state.fold.RunState`),
what those views need:

* each group's **state transitions** ``(t, state, attempt)``: the compact
  grid's cells (:func:`cells`, coloured by :data:`STATE_COLORS`) now, and at
  any earlier time;
* the **quorum size** over time: participants of each step's quorum as the
  trainer reported it (``step.participants``, ``quorum`` events), changes only;
* **useful samples**: the time of every committed, participating step (a
  semi-synchronous algorithm's once its sync committed: :class:`~workbench.analysis.useful.UsefulSteps`),
  binned into useful samples/s (:meth:`Timeline.throughput`);
* every **fault** (and ``sync`` of a DiLoCo-style algorithm);
* the **queue of dead groups**: groups the fold says are dead (a process
  gone, not yet replaced by a new attempt's ``start``), and hung ones. A fault
  rate the hot spares and relaunch cannot absorb shows as a queue that grows
  instead of returning to zero.

Live, the dashboard feeds a Timeline each folded batch (a transition is then
timed to its batch's last event, ~0.5 s). Once a run has ended,
:class:`Replay` folds the whole log again, one event at a time in time order,
so every transition has its event's own time; :meth:`Replay.at` is the run as
it stood at ``t`` (grid + series cut at ``t``), which the dashboard's time
scrubber draws. :func:`fold_until` is the same question answered the slow
way, a fresh fold of the events up to ``t``.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Iterable, Optional

import numpy as np

from workbench.analysis.useful import UsefulSteps
from workbench.state.fold import RunState

GRID_MIN_GROUPS = 9  # from this many groups the dashboard shows the compact grid instead of one tile each
STATE_COLORS = {
    "pending": "#9e9e9e",
    "starting": "#64b5f6",
    "participating": "#43a047",
    "healing": "#ffb300",
    "hung": "#8e24aa",
    "dead": "#e53935",
    "finished": "#1e88e5",
    "stopped": "#757575",
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One group in the compact grid."""

    replica: int
    state: str
    attempt: int

    @property
    def color(self) -> str:
        return STATE_COLORS.get(self.state, "#555555")


@dataclasses.dataclass(frozen=True)
class Mark:
    """A fault (or a sync) on the wall-clock plots."""

    t: float
    kind: str  # "fault" | "sync"
    label: str
    target: Optional[int] = None


def cells(run: RunState) -> list[Cell]:
    """The grid as the fold stands now."""
    return [Cell(r, v.state, v.attempt) for r, v in sorted(run.replicas.items())]


class Timeline:
    """What the wall-clock views need, recorded from the fold; see the module docstring.

    Call :meth:`observe` after ``run`` has applied ``events`` (a dashboard does so
    from its subscription to the fold).
    """

    def __init__(self, run: RunState, samples_per_step: int = 1) -> None:
        self.run = run
        self.samples_per_step = int(samples_per_step)
        self.transitions: dict[int, list[tuple[float, str, int]]] = {}
        self.quorum: list[tuple[float, int]] = []  # (t, participants), on change
        self.useful_t: list[float] = []  # one per committed, participating step
        self.marks: list[Mark] = []
        self.queue: list[tuple[float, int, int]] = []  # (t, dead, hung), on change
        self.version = 0
        self._seen: dict[int, tuple[str, int]] = {}
        self._dead = self._hung = 0
        self._useful = UsefulSteps()
        self.observe([])

    def observe(self, events: Iterable[dict], only_touched: bool = False) -> None:
        """Record ``events`` (already folded). ``only_touched``: check only the groups the events
        name (one event at a time, as :class:`Replay` does), not every group."""
        batch = list(events)
        t = None
        touched: Optional[set] = set() if only_touched else None
        for e in batch:
            if touched is not None:
                for key in ("replica", "target"):
                    if isinstance(e.get(key), int) and not isinstance(e.get(key), bool):
                        touched.add(e[key])
                if e.get("node") is not None and e.get("kind") == "fault":
                    touched = None
            et = e.get("t")
            if not isinstance(et, (int, float)) or isinstance(et, bool):
                continue
            t = float(et)
            kind = e.get("kind")
            if kind == "step":
                self.useful_t.extend(self._useful.add(e, t))
                self._participants(t, e.get("participants"))
            elif kind == "quorum":
                self._participants(t, e.get("participants"))
            elif kind == "fault" and e.get("action") != "resume":
                target = e.get("target") if isinstance(e.get("target"), int) else None
                where = f"replica {target}" if target is not None else (e.get("node") or e.get("target") or "run")
                self.marks.append(Mark(t, "fault", f"{e.get('action')} {where} ({e.get('origin', '?')})", target))
            elif kind == "sync":
                self.marks.append(
                    Mark(
                        t,
                        "sync",
                        f"sync {e.get('sync_index', '?')} ({e.get('algorithm', '?')}) "
                        f"{e.get('participants', '?')} groups" + ("" if e.get("committed", True) else " not committed"),
                    )
                )
        if t is None:
            if batch or self.run.t0 is None:
                return
            t = self.run.t0
        self._states(t, touched)
        self.version += 1

    def _participants(self, t: float, p) -> None:
        if p is None or isinstance(p, bool):
            return
        n = p if isinstance(p, int) else len(p) if isinstance(p, (list, tuple)) else None
        if n is not None and (not self.quorum or self.quorum[-1][1] != n):
            self.quorum.append((t, int(n)))

    def _states(self, t: float, which: Optional[set] = None) -> None:
        replicas = self.run.replicas
        for r in replicas if which is None else (r for r in which if r in replicas):
            v = replicas[r]
            now = (v.state, v.attempt)
            before = self._seen.get(r)
            if before != now:
                self._seen[r] = now
                self.transitions.setdefault(r, []).append((t, v.state, v.attempt))
                old = before[0] if before else None
                self._dead += (v.state == "dead") - (old == "dead")
                self._hung += (v.state == "hung") - (old == "hung")
        if not self.queue or self.queue[-1][1:] != (self._dead, self._hung):
            self.queue.append((t, self._dead, self._hung))

    # -- views ---------------------------------------------------------------
    def t0(self) -> Optional[float]:
        return self.run.t0

    def cells_at(self, t: float) -> list[Cell]:
        """The grid as it stood at ``t``: each group's last transition at or before ``t``."""
        out = []
        for r in sorted(self.transitions):
            tr = self.transitions[r]
            i = bisect.bisect_right([x[0] for x in tr], t) - 1
            state, attempt = (tr[i][1], tr[i][2]) if i >= 0 else ("pending", 0)
            out.append(Cell(r, state, attempt))
        return out

    def throughput(self, bin_s: Optional[float] = None, until: Optional[float] = None) -> dict[str, np.ndarray]:
        """Useful samples/s in wall-clock bins from the first event: bin start (s since t0), rate.

        ``bin_s`` default: the span / 120, at least 1 s (a 30 min run: 15 s bins). A bin
        still being filled at ``until`` is left out, so the live curve never dips at its end.
        """
        t0 = self.t0()
        ts = np.asarray(self.useful_t, dtype=np.float64)
        if t0 is None or not len(ts):
            return {"t": np.empty(0), "rate": np.empty(0)}
        end = float(until) if until is not None else float(ts.max())
        ts = ts[ts <= end]
        span = max(end - t0, 1e-9)
        width = bin_s or max(1.0, span / 120.0)
        n = int(span // width)
        if n < 1:
            return {"t": np.empty(0), "rate": np.empty(0)}
        edges = t0 + width * np.arange(n + 1)
        counts, _ = np.histogram(ts, bins=edges)
        return {"t": edges[:-1] - t0, "rate": counts * self.samples_per_step / width}

    def quorum_series(self, until: Optional[float] = None) -> dict[str, np.ndarray]:
        """Quorum size as a step line: (s since t0, participants), cut at ``until``."""
        t0 = self.t0() or 0.0
        q = [x for x in self.quorum if until is None or x[0] <= until]
        return {"t": np.array([x[0] - t0 for x in q]), "participants": np.array([x[1] for x in q], dtype=np.int64)}

    def queue_series(self, until: Optional[float] = None) -> dict[str, np.ndarray]:
        """Dead (and hung) groups over time: (s since t0, dead, hung), cut at ``until``."""
        t0 = self.t0() or 0.0
        q = [x for x in self.queue if until is None or x[0] <= until]
        return {
            "t": np.array([x[0] - t0 for x in q]),
            "dead": np.array([x[1] for x in q], dtype=np.int64),
            "hung": np.array([x[2] for x in q], dtype=np.int64),
        }

    def marks_until(self, until: Optional[float] = None, kind: str = "fault") -> list[Mark]:
        return [m for m in self.marks if m.kind == kind and (until is None or m.t <= until)]

    def backlog(self) -> dict:
        """Whether relaunch and spares kept up: the queue's peak, its time-weighted mean, the dead
        groups now, and ``kept_up`` false when the queue's mean over the second half of the run is
        more than one group above the first half's (it grows: a fault rate not absorbed)."""
        q = self.queue
        if not q:
            return {"peak": 0, "mean": 0.0, "at_end": 0, "kept_up": True}
        ts = np.array([x[0] for x in q] + [max(q[-1][0], self.run.last_event_t or q[-1][0])])
        dead = np.array([x[1] for x in q], dtype=np.float64)
        span = ts[-1] - ts[0]
        mean = float((dead * np.diff(ts)).sum() / span) if span > 0 else float(dead[-1])
        half = ts[0] + span / 2
        first, second = _weighted(dead, ts, ts[0], half), _weighted(dead, ts, half, ts[-1])
        return {"peak": int(dead.max()), "mean": mean, "at_end": int(q[-1][1]), "kept_up": not (second > first + 1.0)}


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The run at time ``t``: the grid and every wall-clock series up to ``t``."""

    t: float
    cells: list[Cell]
    quorum: dict
    throughput: dict
    queue: dict
    faults: list[Mark]
    syncs: list[Mark]


class Replay:
    """The whole log folded once, event by event in time order, for the scrubber."""

    def __init__(
        self,
        events: Iterable[dict],
        replicas: int,
        steps: int = 0,
        samples_per_step: int = 1,
        bin_s: Optional[float] = None,
    ) -> None:
        ordered = _in_time_order(events)
        self.run = RunState(replicas, steps)
        self.timeline = Timeline(self.run, samples_per_step)
        for _, e in ordered:
            self.run.apply((e,))
            self.timeline.observe((e,), only_touched=True)
        self.start = self.run.t0 or 0.0
        self.end = ordered[-1][0] if ordered else self.start
        span = max(self.end - self.start, 1e-9)
        self.bin_s = bin_s or max(1.0, span / 120.0)

    def at(self, t: float) -> Snapshot:
        """The run as it stood at ``t`` (absolute event time; clipped to the log's span)."""
        t = min(max(float(t), self.start), self.end)
        tl = self.timeline
        return Snapshot(
            t,
            tl.cells_at(t),
            tl.quorum_series(t),
            tl.throughput(self.bin_s, until=t),
            tl.queue_series(t),
            tl.marks_until(t, "fault"),
            tl.marks_until(t, "sync"),
        )


def fold_until(events: Iterable[dict], t: float, replicas: int, steps: int = 0) -> RunState:
    """A fresh fold of the events at or before ``t``, in time order."""
    run = RunState(replicas, steps)
    run.apply([e for te, e in _in_time_order(events) if te <= t])
    return run


def useful_rate(events: Iterable[dict], samples_per_step: int, window_s: Optional[float] = None) -> dict:
    """Useful samples/s of a run: useful steps (:class:`UsefulSteps`) × samples, over the time from
    the first committed step (to ``window_s`` after it, or the last one)."""
    steps = _in_time_order(e for e in events if e.get("kind") == "step")
    u = UsefulSteps()
    ts = np.sort(np.array([x for t, e in steps for x in u.add(e, t)], dtype=np.float64))
    if len(ts) < 2:
        return {"samples": 0, "seconds": 0.0, "rate": None}
    end = ts[0] + window_s if window_s else ts[-1]
    n = int((ts <= end).sum())
    seconds = float(end - ts[0])
    return {"samples": n * samples_per_step, "seconds": seconds, "rate": n * samples_per_step / seconds}


def _weighted(values: np.ndarray, ts: np.ndarray, a: float, b: float) -> float:
    """The time-weighted mean of a step function (``values[i]`` from ``ts[i]`` to ``ts[i+1]``) on [a, b]."""
    lo, hi = np.clip(ts[:-1], a, b), np.clip(ts[1:], a, b)
    w = hi - lo
    return float((values * w).sum() / w.sum()) if w.sum() > 0 else 0.0


def _t(e: dict) -> Optional[float]:
    t = e.get("t")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def _in_time_order(events: Iterable[dict]) -> list[tuple[float, dict]]:
    """(t, event) for each event with a numeric ``t``, in stable ``t`` order."""
    timed = [(t, e) for e in events if (t := _t(e)) is not None]
    timed.sort(key=lambda te: te[0])
    return timed
