"""What the dashboard shows, computed from events alone (no ipywidgets here).

The replica groups' health (one tile each) is the run-state fold's
(:class:`~workbench.state.fold.RunState`, states listed there): a dashboard on
a ``Run`` shares that run's fold and reader. :class:`DashboardState` adds
only what is presentation: the loss series of each replica group, the plot
markers (faults, heals, durable checkpoints, restores), the quorum history,
checkpoints, peer-heal transfers and a tail of notable events. The
presentation layer (``dashboard.py`` and the ``panels``, ``lossplot``
and ``clockview`` it composes) only renders these; tests drive this
class with events written by a real ``EventWriter``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Iterable, Optional

import numpy as np

from workbench.controller import nodehealth
from workbench.faults import kinds as faultkinds
from workbench.state.causes import EndCause
from workbench.state.fold import RunState
from workbench.state.replica import REPLICA_STATES, ReplicaView
from workbench.widgets.series import LossSeries, decimate

Tile = ReplicaView

STATES = REPLICA_STATES
MARKER_KINDS = ("fault", "heal", "checkpoint", "restore", "diverged", "sync")
# Periodic samples: each group writes them every step or every few seconds, the controller one
# ``node_health`` per node every 2 s. Their news is in the tiles and the health panels; in the
# feed they would push a kill, a heal or an end out of its few lines within seconds.
PERIODIC_KINDS = frozenset({"step", "heartbeat", "commit", "node_health"})
# The states in which a tile says why the group's last attempt ended, until the group takes part again.
CAUSE_STATES = frozenset({"dead", "pending", "starting", "healing"})


def in_feed(e: dict) -> bool:
    """Whether ``e`` belongs in the "latest events" feed: what happens once, not a periodic sample.

    A ``sync`` is one of each group's outer syncs (periodic, and marked on the loss plot); one that
    did not commit, or a new attempt's joining sync, is news.
    """
    kind = e.get("kind")
    if kind in PERIODIC_KINDS:
        return False
    if kind == "sync":
        return e.get("committed", True) is False or bool(e.get("join"))
    return True


@dataclasses.dataclass
class Marker:
    kind: str
    t: float
    step: float
    loss: float
    replica: Optional[int]
    label: str


class DashboardState:
    """Everything the dashboard shows, folded from events; see the module docstring.

    ``run_state``: the fold of a ``Run`` this dashboard shares (it applies the
    events, then calls :meth:`present` through its subscription); without one,
    :meth:`apply` folds both (tests, the benchmark).
    """

    def __init__(self, replicas: int, steps: int, tail: int = 8, run_state: Optional[RunState] = None) -> None:
        self.run = run_state if run_state is not None else RunState(replicas, steps)
        self._owns_run = run_state is None
        self.replicas = replicas
        self.steps_planned = steps
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
        self.markers_version = 0
        self.quorum_version = 0
        self._diverged: set = set()
        self._synced: set = set()  # sync_index values marked (every group reports each sync)
        self._took_part: dict[int, int] = {}  # replica -> its newest attempt with a committed, participating step

    # -- what the fold knows -----------------------------------------------------
    @property
    def tiles(self) -> dict[int, ReplicaView]:
        return self.run.replicas

    @property
    def run_state(self) -> Optional[str]:
        return self.run.run_end.get("state") or "ended" if self.run.run_end is not None else None

    @property
    def t0(self) -> Optional[float]:
        return self.run.t0

    @property
    def events_seen(self) -> int:
        return self.run.events_seen

    @property
    def last_event_t(self) -> Optional[float]:
        return self.run.last_event_t

    @property
    def max_committed(self) -> int:
        return self.run.max_committed

    def node_rows(self) -> list[dict]:
        """The node view: per node its address, state (``down`` after a node fault) and the parts of
        replica groups' current attempts on it; a group over two nodes shows on both."""
        return [
            {**row, "health_line": nodehealth.tile_line(row.get("health"))}
            for row in self.run.nodes.table(self.run.attempts())
        ]

    def rss_bytes(self, replica: int) -> Optional[int]:
        """The resident memory of ``replica``'s current attempt, summed over its nodes, from the newest
        ``node_health`` sample of each (None: no sample has it, or the group is not running)."""
        view = self.run.replicas.get(replica)
        if view is None or view.state in ("dead", "finished", "stopped"):
            return None
        found = []
        for node in self.run.nodes.nodes.values():  # the fold keeps each node's newest sample
            groups = (node.health or {}).get("groups")
            for g in groups if isinstance(groups, list) else []:
                if isinstance(g, dict) and (g.get("replica"), g.get("attempt")) == (replica, view.attempt):
                    found += [g["rss_bytes"]] if isinstance(g.get("rss_bytes"), int) else []
        return sum(found) if found else None

    def end_shown(self, replica: int) -> Optional[EndCause]:
        """The end a tile explains: the group's newest ended attempt's, if that end was not planned
        (a failure, or an injected fault), while the group is dead or on its way back
        (:data:`CAUSE_STATES`) and has not taken part in a committed step since."""
        view = self.run.replicas.get(replica)
        end = view.last_end if view is not None else None
        if end is None or end.planned or view.state not in CAUSE_STATES:
            return None
        return None if self._took_part.get(replica, -1) > end.attempt else end

    # -- folding ---------------------------------------------------------------
    def apply(self, events: Iterable[dict]) -> int:
        """Fold new events in (the run state too, when this state owns it); returns how many."""
        batch = list(events)
        if self._owns_run:
            self.run.apply(batch)
        return self.present(batch)

    def present(self, events: list[dict]) -> int:
        """The presentation part of the fold, for events the run state has already applied."""
        for e in events:
            kind = e.get("kind")
            if in_feed(e):
                self.tail.append(e)
            handler = getattr(self, f"_on_{kind}", None)
            if handler is not None:
                t = e.get("t")
                handler(e, float(t) if isinstance(t, (int, float)) else 0.0)
        if self._pending_markers:
            self._place_markers()
        return len(events)

    def _series(self, replica) -> Optional[LossSeries]:
        view = self.run.view(replica)
        if view is None:
            return None
        if view.replica not in self.loss:
            self.loss[view.replica] = LossSeries()
        return self.loss[view.replica]

    def _on_phase(self, e: dict, t: float) -> None:
        if e.get("checkpoint_address"):
            self._checkpoint_servers[e["checkpoint_address"]] = e.get("replica")
        if e.get("phase") == "restored":
            lost = next((r["lost"] for r in reversed(self.run.restores) if r["event"] is e), 0)
            self._pending_markers.append(
                {
                    "kind": "restore",
                    "e": e,
                    "label": f"restart resumed from checkpoint step {e.get('from_step')} ({lost} steps to redo)",
                }
            )

    def _on_step(self, e: dict, t: float) -> None:
        r, a = e.get("replica"), e.get("attempt")
        if (
            isinstance(r, int)
            and isinstance(a, int)
            and e.get("participating") is not False
            and e.get("committed", True)
        ):
            self._took_part[r] = max(a, self._took_part.get(r, -1))
        series = self._series(e.get("replica"))
        loss = e.get("loss")
        # A healing step's loss is its forward on the weights it had before the heal: not plotted.
        numeric = isinstance(loss, (int, float)) and not isinstance(loss, bool)
        if series is not None and numeric and e.get("participating") is not False:
            step = e.get("step")
            if math.isfinite(loss):
                series.append(
                    t, float(step) if isinstance(step, (int, float)) else 0.0, float(loss), _int(e.get("attempt"))
                )
            elif e.get("replica") not in self._diverged:
                # Not plotted (no y for NaN), but marked: a divergence must be visible.
                self._diverged.add(e.get("replica"))
                self._pending_markers.append(
                    {
                        "kind": "diverged",
                        "e": e,
                        "label": f"replica {e.get('replica')} diverged: loss {loss} at step {step}",
                    }
                )
        qid = e.get("quorum_id")
        if qid is not None:
            self._quorum(t, qid, e.get("step"), e.get("participants"))

    def _quorum(self, t: float, qid, step, participants) -> None:
        if participants is not None and not isinstance(participants, (int, float)):
            participants = len(participants)
        changed = qid != self.quorum_id or (participants is not None and participants != self.participants)
        if self.quorum_id is None or (isinstance(qid, (int, float)) and qid >= self.quorum_id):
            self.quorum_id = qid
            if participants is not None:
                self.participants = int(participants)
        if changed:
            self.quorum_history.append({"t": t, "step": step, "quorum_id": qid, "participants": self.participants})
            self.quorum_version += 1

    def _on_quorum(self, e: dict, t: float) -> None:
        if e.get("quorum_id") is not None:
            self._quorum(t, e["quorum_id"], e.get("step"), e.get("participants"))

    def _on_heal(self, e: dict, t: float) -> None:
        source = e.get("from_replica")
        if source is None and e.get("from_address") in self._checkpoint_servers:
            source = f"replica {self._checkpoint_servers[e['from_address']]}"
        if source is None:
            source = e.get("from_address")
        self.heals.append(
            {
                "t": t,
                "replica": e.get("replica"),
                "from": source,
                "step": e.get("step"),
                "seconds": e.get("seconds"),
                "bytes": e.get("bytes"),
                "served_from": e.get("served_from"),
                "interface": e.get("interface"),
                "bytes_per_s": e.get("bytes_per_s"),
            }
        )
        self._pending_markers.append(
            {
                "kind": "heal",
                "e": e,
                "label": f"replica {e.get('replica')} healed" + (f" from {source}" if source is not None else ""),
            }
        )

    def _on_checkpoint(self, e: dict, t: float) -> None:
        if not e.get("durable", True):
            return
        key = e.get("replica") if e.get("replica") is not None else 0
        self.checkpoints[key] = {
            "t": t,
            "step": e.get("step"),
            "bytes": e.get("bytes"),
            "seconds": e.get("seconds"),
            "path": e.get("path"),
        }
        late = " (recorded late: its attempt was killed first)" if e.get("late") else ""
        self._pending_markers.append(
            {"kind": "checkpoint", "e": e, "label": f"checkpoint step {e.get('step')} durable{late}"}
        )

    def _on_fault(self, e: dict, t: float) -> None:
        action = e.get("action")
        if action == faultkinds.RESUME:
            return
        where = f"replica {e.get('target')}" if e.get("target") not in (None, "lighthouse") else "lighthouse"
        self._pending_markers.append({"kind": "fault", "e": e, "label": f"{action} {where} ({e.get('origin', '?')})"})

    def _on_sync(self, e: dict, t: float) -> None:
        """A DiLoCo-style outer sync (``ft.algorithm``): one marker per ``sync_index``, on the curve
        of the first group that reported it."""
        key = e.get("sync_index", e.get("step"))
        if key in self._synced:
            return
        self._synced.add(key)
        label = (
            f"sync {key} ({e.get('algorithm', '?')}"
            + (f", fragment {e['fragment']}" if e.get("fragment") is not None else "")
            + f"): {e.get('participants', '?')} groups"
            + (f", {e['bytes'] / 1e6:.1f} MB" if isinstance(e.get("bytes"), (int, float)) else "")
            + (f" in {e['seconds']:.2f} s" if isinstance(e.get("seconds"), (int, float)) else "")
            + ("" if e.get("committed", True) else ", not committed")
        )
        self._pending_markers.append({"kind": "sync", "e": e, "label": label})

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
            self.markers.append(
                Marker(m["kind"], t, step, loss, replica if isinstance(replica, int) else None, m["label"])
            )
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
        return self.run.progress()


def _int(x) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0
