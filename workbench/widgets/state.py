"""What the dashboard shows, computed from events alone (no ipywidgets here).

:class:`DashboardState` folds events, in the order an :class:`~workbench.events.EventReader`
returns them, into the loss series of each replica group, the plot markers
(faults, heals, durable checkpoints), one :class:`Tile` per replica group, the
quorum history, checkpoints, peer-heal transfers and a tail of notable events.
The presentation layer (``dashboard.py``) only renders these; tests drive this
class with events written by a real ``EventWriter``.

Tile states, from the events of one replica group:

========== ==================================================================
pending    submitted (or planned), no ``start`` yet
starting   ``start``/``phase`` of the current attempt, no step yet
healing    a ``heal``, or a step with ``participating=false``, not yet
           followed by a committed step
participating  committed steps
hung       a ``hang`` fault (or the controller's ``hang`` event) and no
           progress since: no ``resume``, the step has not advanced and the
           hang's ``seconds`` have not passed
dead       a ``kill``/``preempt`` fault, an ``exit`` with reason ``error`` or a
           controller ``job`` event that ended unclean; stays dead until a
           newer attempt starts (late events of the dead attempt are ignored)
finished   ``exit`` with reason ``completed``
stopped    ``exit`` with reason ``stopped`` or ``preempted``
========== ==================================================================
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Iterable, Optional

import numpy as np

STATES = ("pending", "starting", "participating", "healing", "hung", "dead", "finished", "stopped")
MARKER_KINDS = ("fault", "heal", "checkpoint", "restore")
QUIET_KINDS = frozenset({"step", "heartbeat", "commit"})
KILL_ACTIONS = frozenset({"kill", "preempt"})


class Series:
    """A growing float64 column with amortised O(1) append and a zero-copy view."""

    def __init__(self, capacity: int = 1024) -> None:
        self._buf = np.empty(capacity, dtype=np.float64)
        self.n = 0

    def append(self, value: float) -> None:
        if self.n == len(self._buf):
            self._buf = np.concatenate([self._buf, np.empty(len(self._buf), dtype=np.float64)])
        self._buf[self.n] = value
        self.n += 1

    @property
    def values(self) -> np.ndarray:
        return self._buf[: self.n]


class LossSeries:
    """One replica group's loss points: wall time, step, loss, attempt."""

    def __init__(self) -> None:
        self.t, self.step, self.loss, self.attempt = Series(), Series(), Series(), Series()
        self.version = 0

    def append(self, t: float, step: float, loss: float, attempt: int) -> None:
        self.t.append(t)
        self.step.append(step)
        self.loss.append(loss)
        self.attempt.append(attempt)
        self.version += 1

    def __len__(self) -> int:
        return self.t.n

    def at_time(self, t: float) -> Optional[tuple[float, float]]:
        """(step, loss) of the last point at or before ``t`` (the first point if none)."""
        if not len(self):
            return None
        i = int(np.searchsorted(self.t.values, t, side="right")) - 1
        i = min(max(i, 0), len(self) - 1)
        return float(self.step.values[i]), float(self.loss.values[i])


def decimate(x: np.ndarray, max_points: int) -> np.ndarray:
    """Indices that keep the shape of ``x`` in at most ~``max_points`` points.

    The series is cut into ``max_points // 2`` equal index buckets and each
    bucket keeps its minimum and its maximum (in index order), plus the first
    and last point overall, so spikes (a loss jump after a fault) survive.
    """
    n = len(x)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    width = n // buckets
    body = x[: width * buckets].reshape(buckets, width)
    clean = np.where(np.isnan(body), np.inf, body)
    lo = clean.argmin(axis=1)
    hi = np.where(np.isnan(body), -np.inf, body).argmax(axis=1)
    base = np.arange(buckets) * width
    idx = np.concatenate([base + lo, base + hi, [0, n - 1]])
    if width * buckets < n:
        tail = np.arange(width * buckets, n)
        idx = np.concatenate([idx, tail[[x[tail].argmin(), x[tail].argmax()]] if len(tail) > 1 else tail])
    return np.unique(idx)


@dataclasses.dataclass
class Tile:
    """One replica group's health, as a grid tile shows it."""

    replica: int
    state: str = "pending"
    attempt: int = 0
    step: Optional[int] = None
    loss: Optional[float] = None
    last_seen: Optional[float] = None
    step_time_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    mem_gb: Optional[float] = None
    hosts: list = dataclasses.field(default_factory=list)
    restarts: int = 0
    steps_lost: int = 0
    dead_attempt: int = -1
    hang: Optional[dict] = None

    def heartbeat_age(self, now: Optional[float] = None) -> Optional[float]:
        if self.last_seen is None or self.state in ("dead", "finished", "stopped"):
            return None
        return max(0.0, (now if now is not None else time.time()) - self.last_seen)


@dataclasses.dataclass
class Marker:
    kind: str
    t: float
    step: float
    loss: float
    replica: Optional[int]
    label: str


class DashboardState:
    """Everything the dashboard shows, folded from events; see the module docstring."""

    def __init__(self, replicas: int, steps: int, tail: int = 8) -> None:
        self.replicas = replicas
        self.steps_planned = steps
        self.tiles = {r: Tile(r) for r in range(replicas)}
        self.loss = {r: LossSeries() for r in range(replicas)}
        self.markers: list[Marker] = []
        self._pending_markers: list[dict] = []
        self.quorum_id: Optional[int] = None
        self.participants: Optional[int] = None
        self.quorum_history: list[dict] = []
        self.checkpoints: dict[int, dict] = {}
        self._checkpoint_servers: dict[str, int] = {}  # a heal's source address -> its replica
        self.heals: list[dict] = []
        self.tail: collections.deque = collections.deque(maxlen=tail)
        self.run_state: Optional[str] = None
        self.t0: Optional[float] = None
        self.max_committed = 0
        self.events_seen = 0
        self.last_event_t: Optional[float] = None
        self.markers_version = 0
        self.quorum_version = 0

    # -- folding ---------------------------------------------------------------
    def apply(self, events: Iterable[dict]) -> int:
        """Fold new events in; returns how many were applied."""
        n = 0
        for e in events:
            self._apply_one(e)
            n += 1
        if self._pending_markers:
            self._place_markers()
        return n

    def _tile(self, replica) -> Optional[Tile]:
        if replica is None or isinstance(replica, bool):
            return None
        try:
            r = int(replica)
        except (TypeError, ValueError):
            return None
        if r not in self.tiles:
            if r < 0 or r > 4096:
                return None
            self.tiles[r] = Tile(r)
            self.loss[r] = LossSeries()
        return self.tiles[r]

    def _apply_one(self, e: dict) -> None:
        kind = e.get("kind")
        t = float(e.get("t") or 0.0)
        self.events_seen += 1
        self.last_event_t = t
        if self.t0 is None or (t and t < self.t0):
            self.t0 = t
        if kind not in QUIET_KINDS:
            self.tail.append(e)
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(e, t)

    def _own(self, e: dict) -> Optional[Tile]:
        """The tile of a replica's own event, or None if it is a stale attempt's."""
        if e.get("role") == "controller":
            return None
        tile = self._tile(e.get("replica"))
        if tile is None:
            return None
        attempt = int(e.get("attempt") or 0)
        if attempt < tile.attempt or attempt <= tile.dead_attempt:
            return None
        if attempt > tile.attempt:
            tile.attempt = attempt
            tile.hang = None
        return tile

    def _on_start(self, e: dict, t: float) -> None:
        tile = self._own(e)
        if tile is None:
            return
        tile.state = "starting"
        tile.last_seen = t
        host = e.get("node") or e.get("host")
        if host and host not in tile.hosts:
            tile.hosts.append(host)

    def _on_phase(self, e: dict, t: float) -> None:
        if e.get("checkpoint_address"):
            self._checkpoint_servers[e["checkpoint_address"]] = e.get("replica")
        tile = self._own(e)
        if tile is not None:
            tile.last_seen = t
            if tile.state == "pending":
                tile.state = "starting"
        if e.get("phase") == "restored":
            # checkpoint-restart: where the restarted job resumed, and what it has to redo
            lost = max(0, (tile.step if tile is not None else 0) - int(e.get("from_step") or 0))
            if tile is not None:
                tile.steps_lost += lost
            self._pending_markers.append(
                {"kind": "restore", "e": e, "label": f"restart resumed from checkpoint step {e.get('from_step')}"
                 f" ({lost} steps to redo)"}
            )

    def _progress(self, tile: Tile, e: dict, t: float) -> bool:
        """Record liveness; returns False while the tile is hung."""
        tile.last_seen = t
        step = e.get("step")
        if tile.hang is not None:
            h = tile.hang
            advanced = step is not None and h["step"] is not None and step > h["step"]
            expired = h["seconds"] is not None and t >= h["t"] + h["seconds"]
            if not (advanced or expired):
                return False
            tile.hang = None
        return True

    def _on_heartbeat(self, e: dict, t: float) -> None:
        tile = self._own(e)
        if tile is None or not self._progress(tile, e, t):
            return
        if tile.state == "hung":
            tile.state = "participating"
        if e.get("step") is not None:
            tile.step = int(e["step"])

    def _on_step(self, e: dict, t: float) -> None:
        tile = self._tile(e.get("replica"))
        loss = e.get("loss")
        # A healing step's loss is its forward on the weights it had before the heal: not plotted.
        if (tile is not None and isinstance(loss, (int, float)) and not isinstance(loss, bool) and math.isfinite(loss)
                and e.get("participating") is not False):
            self.loss[tile.replica].append(t, float(e.get("step") or 0), float(loss), int(e.get("attempt") or 0))
        committed = bool(e.get("committed", True))
        if committed and e.get("step") is not None:
            self.max_committed = max(self.max_committed, int(e["step"]))
        qid = e.get("quorum_id")
        if qid is not None:
            self._quorum(t, qid, e.get("step"), e.get("participants"))
        tile = self._own(e)
        if tile is None or not self._progress(tile, e, t):
            return
        if e.get("step") is not None:
            tile.step = int(e["step"])
        if isinstance(loss, (int, float)):
            tile.loss = float(loss)
        for field in ("step_time_s", "tokens_per_s", "mem_gb"):
            if e.get(field) is not None:
                setattr(tile, field, e[field])
        if e.get("participating") is False:
            tile.state = "healing"
        elif committed:
            tile.state = "participating"
        elif tile.state in ("starting", "pending", "hung"):
            tile.state = "healing"

    def _quorum(self, t: float, qid, step, participants) -> None:
        if participants is not None and not isinstance(participants, (int, float)):
            participants = len(participants)
        changed = qid != self.quorum_id or (participants is not None and participants != self.participants)
        if self.quorum_id is None or (isinstance(qid, (int, float)) and qid >= self.quorum_id):
            self.quorum_id = qid
            if participants is not None:
                self.participants = int(participants)
        if changed:
            self.quorum_history.append(
                {"t": t, "step": step, "quorum_id": qid, "participants": self.participants}
            )
            self.quorum_version += 1

    def _on_quorum(self, e: dict, t: float) -> None:
        if e.get("quorum_id") is not None:
            self._quorum(t, e["quorum_id"], e.get("step"), e.get("participants"))

    def _on_heal(self, e: dict, t: float) -> None:
        tile = self._own(e)
        if tile is not None:
            tile.state = "healing"
            tile.last_seen = t
        source = e.get("from_replica")
        if source is None and e.get("from_address") in self._checkpoint_servers:
            source = f"replica {self._checkpoint_servers[e['from_address']]}"
        if source is None:
            source = e.get("from_address")
        self.heals.append(
            {"t": t, "replica": e.get("replica"), "from": source, "step": e.get("step"),
             "seconds": e.get("seconds"), "bytes": e.get("bytes")}
        )
        self._pending_markers.append({"kind": "heal", "e": e, "label": f"replica {e.get('replica')} healed"
                                      + (f" from {source}" if source is not None else "")})

    def _on_checkpoint(self, e: dict, t: float) -> None:
        if not e.get("durable", True):
            return
        key = e.get("replica") if e.get("replica") is not None else 0
        self.checkpoints[key] = {
            "t": t, "step": e.get("step"), "bytes": e.get("bytes"), "seconds": e.get("seconds"),
            "path": e.get("path"),
        }
        self._pending_markers.append({"kind": "checkpoint", "e": e, "label": f"checkpoint step {e.get('step')} durable"})

    def _on_fault(self, e: dict, t: float) -> None:
        action = e.get("action")
        tile = self._tile(e.get("target")) if e.get("target") != "lighthouse" else None
        if tile is not None:
            if action in KILL_ACTIONS:
                tile.state = "dead"
                tile.dead_attempt = max(tile.dead_attempt, tile.attempt)
                tile.hang = None
            elif action == "hang":
                tile.state = "hung"
                tile.hang = {"t": t, "step": tile.step, "seconds": e.get("seconds")}
            elif action == "resume" and tile.state == "hung":
                tile.hang = None
                tile.state = "participating"
        if action == "resume":
            return
        where = f"replica {e.get('target')}" if e.get("target") not in (None, "lighthouse") else "lighthouse"
        self._pending_markers.append(
            {"kind": "fault", "e": e, "label": f"{action} {where} ({e.get('origin', '?')})"}
        )

    def _on_hang(self, e: dict, t: float) -> None:
        tile = self._tile(e.get("target", e.get("replica")))
        if tile is not None and tile.state not in ("dead", "finished", "stopped"):
            tile.state = "hung"
            tile.hang = {"t": t, "step": tile.step, "seconds": None}

    def _on_exit(self, e: dict, t: float) -> None:
        tile = self._own(e)
        if tile is None:
            return
        reason = e.get("reason")
        tile.last_seen = t
        if reason == "completed":
            tile.state = "finished"
        elif reason in ("stopped", "preempted"):
            tile.state = "stopped"
        else:
            tile.state = "dead"
            tile.dead_attempt = max(tile.dead_attempt, tile.attempt)

    def _on_job(self, e: dict, t: float) -> None:
        tile = self._tile(e.get("replica"))
        if tile is None or e.get("state") != "ended" or e.get("clean", True):
            return
        attempt = int(e.get("attempt") or 0)
        if attempt >= tile.attempt and tile.state not in ("finished", "stopped"):
            tile.state = "dead"
            tile.dead_attempt = max(tile.dead_attempt, attempt)

    def _on_restart(self, e: dict, t: float) -> None:
        tile = self._tile(e.get("replica"))
        if tile is not None:
            tile.restarts += 1

    def _on_run_end(self, e: dict, t: float) -> None:
        self.run_state = e.get("state") or "ended"

    # -- markers ---------------------------------------------------------------
    def _place_markers(self) -> None:
        """Put each new marker on its replica's loss curve at the event's time."""
        for m in self._pending_markers:
            e = m["e"]
            t = float(e.get("t") or 0.0)
            replica = e.get("target") if m["kind"] == "fault" else e.get("replica")
            point = self._point_near(replica, t)
            step, loss = point if point else (0.0, math.nan)
            if m["kind"] != "fault" and e.get("step") is not None:
                step = float(e["step"])
            self.markers.append(Marker(m["kind"], t, step, loss, replica if isinstance(replica, int) else None, m["label"]))
        self._pending_markers.clear()
        self.markers_version += 1

    def _point_near(self, replica, t: float) -> Optional[tuple[float, float]]:
        """(step, loss) on ``replica``'s curve at ``t``; another curve if it has nothing recent."""
        series = self.loss.get(replica) if isinstance(replica, int) else None
        if series is not None and len(series):
            i = int(np.searchsorted(series.t.values, t, side="right")) - 1
            if i >= 0 and t - series.t.values[i] < 5.0:
                return series.at_time(t)
        live = [s for s in self.loss.values() if len(s)]
        if not live:
            return series.at_time(t) if series is not None else None

        def last_t_before(s: LossSeries) -> float:
            return s.t.values[max(0, int(np.searchsorted(s.t.values, t, side="right")) - 1)]

        return max(live, key=last_t_before).at_time(t)

    def marker_arrays(self, kind: str) -> dict[str, np.ndarray]:
        ms = [m for m in self.markers if m.kind == kind]
        return {
            "t": np.array([m.t for m in ms], dtype=np.float64),
            "step": np.array([m.step for m in ms], dtype=np.float64),
            "loss": np.array([m.loss for m in ms], dtype=np.float64),
            "label": [m.label for m in ms],
        }

    # -- views -----------------------------------------------------------------
    def loss_view(self, replica: int, x: str = "step", max_points: int = 2000) -> dict[str, np.ndarray]:
        """The (decimated) points of one replica's loss curve: x, loss, step."""
        s = self.loss[replica]
        loss = s.loss.values
        idx = decimate(loss, max_points)
        steps = s.step.values[idx]
        xs = steps if x == "step" else s.t.values[idx] - (self.t0 or 0.0)
        return {"x": xs, "y": loss[idx], "step": steps}

    def total_points(self) -> int:
        return sum(len(s) for s in self.loss.values())

    def progress(self) -> tuple[int, int]:
        return min(self.max_committed, self.steps_planned), self.steps_planned
