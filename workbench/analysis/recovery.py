"""Per fault, how the run recovered and what it cost: one row per fault, the one table every view reads.

Milestones, each in seconds after the ``fault`` event (NaN: not reached):

- replica fault, elastic (torchft): fault → ``detected`` (a survivor's step
  voted down, or its next quorum) → ``quorum_without_victim`` →
  ``replacement_started`` (the next attempt's ``start``; for a fault that
  pauses the process, its ``resume``) → ``imports_done`` → ``heal_done`` →
  ``participating`` (the group's first committed step taking part, not
  before its heal). Checkpoint-restart (MaxText, ddp-restart): fault →
  restart → ``heal_done`` = restore done → ``participating`` = first step,
  with ``steps_lost``.
- a fault that impairs the group while it runs (``partition``, ``slow_link``,
  ``straggler``): fault (cut) → ``quorum_without_victim`` (where its peers go on
  without it) → ``replacement_started`` = its undo (link back) → ``heal_done`` →
  ``participating`` (rejoined), each counted from the undo on; a ``freeze``
  reads as a hang. A pause its peers waited out (``torchft.pg_timeout_ms``) left
  no quorum and needed no heal: ``detected`` stays NaN, complete once it steps.
- lighthouse fault: ``detected`` (seen down) → ``replacement_started`` (up
  again) → ``participating`` (training commits again).
- an end no fault explains (``action`` ``unplanned``: a crash, the OOM killer,
  a lost node; ``workbench.state.causes``): read as a kill at the death's time.

Per row that ended a process, also ``cause`` and ``end`` (its cause and its one
line, ``EndCause``), ``noticed`` (the controller saw its job gone) and
``restarted`` (its ``restart`` event), in seconds after the row's ``t``.

Per replica fault, also:

- ``survivor_stall_s``: the longest gap between a survivor's last committed
  step before the fault and its first committed step without the victim,
  minus that survivor's median step interval; the max over survivors. A
  *survivor* is a group that was never a fault's target and never relaunched
  (attempt 0 throughout).
- ``heal_seconds``/``heal_bytes`` of the victim's heal, ``steps_lost`` (steps
  redone after a restore from a checkpoint; under a semi-synchronous
  ``ft.algorithm``, the victim's inner steps since its last committed sync,
  which died with it), ``from_scratch`` (the group came
  back with no live peer to heal from), ``complete`` (every milestone this
  kind of recovery has was reached).

*Kill → rejoin* is the ``participating`` milestone of a fault that ends the
process: a group has rejoined when it trains in step with its peers, which a
lone step before its heal is not (torchft follows every heal with a
non-participating step). The attempt a fault hit is the newest one seen at the
fault (its last step's, its last ``start``'s, or the attempt the fault event
names): a fault targets a group's newest process, even one that had not
stepped yet. A heal or restore counts for the attempt that took part again or
an earlier one: a later attempt's is a later fault's (a TorchTitan group that
restored its durable checkpoint at its peers' step came back without a heal).

A semi-synchronous algorithm's steps are read as :mod:`.useful` decides them
(an inner step is committed once its process's next sync committed), so
``participating`` is the replacement's first step that a committed sync kept,
and a survivor's inner steps before a sync voted down are not committed steps.

Computed from the events sorted once and indexed by (replica, kind): each
milestone is a bisection to the fault's time plus a scan over the few events
of that kind that do not qualify (the dead attempt's stragglers).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.useful import decided
from workbench.faults import kinds as faultkinds
from workbench.state.causes import EndCause
from workbench.state.fold import RunState
from workbench.trainers.registry import UnknownTrainer, trainer_kind

MILESTONES = ("detected", "quorum_without_victim", "replacement_started", "imports_done", "heal_done", "participating")
COLUMNS = [
    "t",
    "action",
    "target",
    "origin",
    *MILESTONES,
    "heal_seconds",
    "heal_bytes",
    "steps_lost",
    "from_scratch",
    "complete",
    "survivor_stall_s",
    "cause",
    "end",
    "noticed",
    "restarted",
]

NAN = float("nan")
UNPLANNED = "unplanned"  # ``action`` of a row for an end no fault explains (a crash, the OOM killer, a lost node)


class _Series:
    """Events in time order with their times, for bisection."""

    __slots__ = ("events", "ts")

    def __init__(self, events: list[dict]) -> None:
        self.events = events
        self.ts = [e["t"] for e in events]

    def after(self, t: float) -> Iterator[dict]:
        return itertools.islice(self.events, bisect.bisect_right(self.ts, t), None)

    def first_after(self, t: float, pred: Callable[[dict], bool] = lambda e: True) -> Optional[dict]:
        return next((e for e in self.after(t) if pred(e)), None)

    def any_within(self, lo_exclusive: float, lo: float, hi: float) -> bool:
        """An event at a time > ``lo_exclusive``, >= ``lo`` and <= ``hi``."""
        i = max(bisect.bisect_right(self.ts, lo_exclusive), bisect.bisect_left(self.ts, lo))
        return i < len(self.ts) and self.ts[i] <= hi


_EMPTY = _Series([])


class _Survivor:
    """One survivor's committed steps as arrays, and the first step after any index with fewer participants."""

    def __init__(self, steps: list[dict]) -> None:
        self.t = np.array([e["t"] for e in steps], dtype=float)
        self.participants = np.array(
            [np.nan if e.get("participants") is None else e["participants"] for e in steps], dtype=float
        )
        self.normal = float(np.median(np.diff(self.t))) if len(self.t) > 2 else 0.0
        self._below: dict[float, np.ndarray] = {}

    def first_with_fewer(self, i: int, n: float) -> Optional[int]:
        if math.isnan(n):
            return None
        if n not in self._below:
            self._below[n] = np.flatnonzero(self.participants < n)
        below = self._below[n]
        k = int(np.searchsorted(below, i))
        return int(below[k]) if k < len(below) else None

    def stall(self, tf: float) -> Optional[float]:
        """The longest gap from the last step before ``tf`` to the first without the victim, beyond normal.

        The stall can land a step late (the peer died after its share of the step in flight), so
        every gap up to the first step with fewer participants counts; with none, the next four.
        """
        i = int(np.searchsorted(self.t, tf, side="right"))
        if i == 0 or i == len(self.t):
            return None
        end = self.first_with_fewer(i, self.participants[i - 1])
        end = min(len(self.t) - 1, i + 3) if end is None else end
        return float(np.diff(self.t[i - 1 : end + 1]).max()) - self.normal


class _Log:
    """A run's events sorted once by time, indexed by (replica, kind) and by kind."""

    def __init__(self, events: list[dict]) -> None:
        self._by_kind: dict = defaultdict(list)
        self._by_replica_kind: dict = defaultdict(list)
        committed: dict = {}  # every group that stepped: its committed steps
        relaunched = set()
        for e in sorted(events, key=lambda e: e.get("t", 0.0)):
            kind, replica = e.get("kind"), e.get("replica")
            self._by_kind[kind].append(e)
            self._by_replica_kind[(replica, kind)].append(e)
            if kind == "step":
                steps = committed.setdefault(replica, [])
                if e.get("committed"):
                    steps.append(e)
                if e.get("attempt", 0) != 0:
                    relaunched.add(replica)
        self._series: dict = {}
        committed.pop(None, None)
        self.committed_by_replica = {r: _Series(v) for r, v in committed.items()}
        self.committed = _Series([e for e in self._by_kind["step"] if e.get("committed")])
        self.failed_commits = _Series([e for e in self._by_kind["commit"] if e.get("commit_result") is False])
        self.has_quorums = bool(self._by_kind["quorum"])
        faults = self._by_kind["fault"]
        resumes: dict = defaultdict(list)
        for e in faults:
            if e.get("action") == faultkinds.RESUME:
                resumes[e.get("target")].append(e)
        self.resumes_by_target = {k: _Series(v) for k, v in resumes.items()}
        self.victims = {e.get("target") for e in faults if isinstance(e.get("target"), int)}
        self.survivors = {
            r: _Survivor(self.committed_by_replica[r].events)
            for r in sorted(set(committed) - self.victims - relaunched)
        }
        self._cummax: dict = {}

    def kind(self, kind: str) -> _Series:
        if kind not in self._series:
            self._series[kind] = _Series(self._by_kind.get(kind, []))
        return self._series[kind]

    def of(self, replica, kind: str) -> _Series:
        if (replica, kind) not in self._series:
            self._series[(replica, kind)] = _Series(self._by_replica_kind.get((replica, kind), []))
        return self._series[(replica, kind)]

    def steps_until(self, replica, t: float) -> tuple[Optional[dict], int]:
        """The group's last step event at or before ``t``, and its highest committed step by then."""
        steps = self.of(replica, "step")
        i = bisect.bisect_right(steps.ts, t)
        if replica not in self._cummax:
            self._cummax[replica] = list(
                itertools.accumulate(
                    (e.get("step", 0) if e.get("committed") else 0 for e in steps.events), max, initial=0
                )
            )
        return (steps.events[i - 1] if i else None), self._cummax[replica][i]

    def undecided_of(self, replica, attempt: int, t: float) -> int:
        """Inner steps of a semi-synchronous attempt, up to ``t``, that no sync decided: lost with its process."""
        steps = self.of(replica, "step")
        return sum(
            1
            for e in steps.events[: bisect.bisect_right(steps.ts, t)]
            if e.get("undecided") and e.get("attempt", 0) == attempt
        )

    def newest_start_until(self, replica, t: float) -> int:
        starts = self.of(replica, "start")
        i = bisect.bisect_right(starts.ts, t)
        return max((e.get("attempt", 0) for e in starts.events[:i]), default=0)


def _since(e: Optional[dict], tf: float) -> float:
    return e["t"] - tf if e is not None else NAN


def _first_from_others(series: _Series, tf: float, victim) -> Optional[dict]:
    return series.first_after(tf, lambda e: e.get("replica") not in (None, victim))


def _replica_recovery(f: dict, kind: faultkinds.FaultKind, log: _Log) -> dict:
    tf, victim = f["t"], f["target"]
    last_step, last_before = log.steps_until(victim, tf)
    attempt0 = max(
        last_step.get("attempt", 0) if last_step else 0, log.newest_start_until(victim, tf), f.get("attempt") or 0
    )
    row = {"t": tf, "action": f["action"], "target": victim, "origin": f.get("origin")}
    quorum = _first_from_others(log.kind("quorum"), tf, victim)
    vote = _first_from_others(log.failed_commits, tf, victim)
    row["detected"] = min(_since(quorum, tf), _since(vote, tf), key=lambda x: math.inf if math.isnan(x) else x)
    row["quorum_without_victim"] = _since(quorum, tf)
    same_process = not kind.ends_process
    if same_process:
        resumed = log.resumes_by_target.get(victim, _EMPTY).first_after(
            tf, lambda e: e.get("resumed") in (None, kind.name)
        )
        row["replacement_started"] = row["imports_done"] = _since(resumed, tf)
        new_attempt: Callable[[dict], bool] = lambda e: True  # noqa: E731 - the same process carries on
        if kind.impairs:  # it stepped on while impaired: what counts is after the undo
            back_at = resumed["t"] if resumed else math.inf
            new_attempt = lambda e: e["t"] >= back_at  # noqa: E731
    else:
        new_attempt = lambda e: e.get("attempt", 0) > attempt0  # noqa: E731
        row["replacement_started"] = _since(log.of(victim, "start").first_after(tf, new_attempt), tf)
        row["imports_done"] = _since(
            log.of(victim, "phase").first_after(tf, lambda e: e.get("phase") == "imports_done" and new_attempt(e)), tf
        )

    def taking_part(e: dict) -> bool:
        return bool(e.get("committed") and e.get("participating", True) and new_attempt(e))

    steps = log.of(victim, "step")
    back = steps.first_after(tf, taking_part)
    upto = back.get("attempt", 0) if back is not None else math.inf  # a later attempt's heal: module docstring
    this_recovery = lambda e: new_attempt(e) and e.get("attempt", 0) <= upto  # noqa: E731
    heal = log.of(victim, "heal").first_after(tf, this_recovery)
    restored = log.of(victim, "phase").first_after(tf, lambda e: e.get("phase") == "restored" and this_recovery(e))
    row["heal_done"] = _since(heal or restored, tf)
    row["heal_seconds"] = heal.get("seconds") if heal else None
    row["heal_bytes"] = heal.get("bytes") if heal else None
    row["participating"] = _since(
        back
        if heal is None or back is None or back["t"] >= heal["t"]
        else steps.first_after(tf, lambda e: taking_part(e) and e["t"] >= heal["t"]),
        tf,
    )
    if restored:
        row["steps_lost"] = max(0, last_before - int(restored.get("from_step") or 0))
    elif kind.ends_process and log.undecided_of(victim, attempt0, tf):
        row["steps_lost"] = log.undecided_of(victim, attempt0, tf)
    else:
        row["steps_lost"] = 0 if heal else None
    # A group that comes back behind its peers must heal; a paused one that was still the furthest ahead
    # (its peers died meanwhile) carries on from its own next step, and so does one that stayed in the quorum
    # (a straggler, or a pause its peers waited out within the process-group timeout: nothing detected it).
    waited_out = same_process and back is not None and math.isnan(row["detected"])
    ahead = back is not None and (back.get("step") == last_before + 1 or not kind.leaves_quorum)
    carried_on = waited_out or (same_process and ahead)
    # With every peer down too (overlapping faults), there is no one to heal from: the group
    # restarts from scratch. That recovery completes, but it is a loss, and is flagged.
    lone = False
    if back is not None and heal is None:
        lo = tf + (0 if math.isnan(row["replacement_started"]) else row["replacement_started"])
        lone = not any(s.any_within(tf, lo, back["t"]) for r, s in log.committed_by_replica.items() if r != victim)
    row["from_scratch"] = bool(lone and not same_process)
    required = ["replacement_started", "participating"] + ([] if carried_on or lone else ["heal_done"])
    if log.has_quorums and kind.leaves_quorum and not waited_out:
        required += ["detected", "quorum_without_victim"]
    row["complete"] = bool(all(not math.isnan(row[k]) for k in required))
    stalls = [s for s in (sv.stall(tf) for sv in log.survivors.values()) if s is not None]
    row["survivor_stall_s"] = max(stalls) if stalls else None
    return row


def _lighthouse_recovery(f: dict, log: _Log) -> dict:
    """Lighthouse killed → seen down → restarted → training commits again."""
    tf = f["t"]
    lighthouse = log.kind("lighthouse")
    row: dict[str, Any] = dict.fromkeys(MILESTONES, NAN)
    row.update(
        t=tf,
        action=f["action"],
        target="lighthouse",
        origin=f.get("origin"),
        heal_seconds=None,
        heal_bytes=None,
        steps_lost=0,
        from_scratch=False,
        survivor_stall_s=None,
    )
    row["detected"] = _since(lighthouse.first_after(tf, lambda e: e.get("state") == "down"), tf)
    row["replacement_started"] = _since(lighthouse.first_after(tf, lambda e: e.get("state") == "up"), tf)
    if not math.isnan(row["replacement_started"]):
        row["participating"] = _since(log.committed.first_after(tf + row["replacement_started"]), tf)
    row["complete"] = bool(not math.isnan(row["replacement_started"]) and not math.isnan(row["participating"]))
    return row


def ends_of(events: Sequence[dict]) -> list[EndCause]:
    """Every ended attempt's cause, as the run-state fold joins it (``workbench.state.causes``), from ``events``
    in time order; a checkpoint-restart trainer's ranks (named by the controller's ``start``) end together."""
    state = RunState(0)
    trainer = next(
        (e.get("trainer") for e in events if e.get("kind") == "start" and e.get("role") == "controller"), None
    )
    try:
        state.ends.one_job = isinstance(trainer, str) and not trainer_kind(trainer).elastic
    except UnknownTrainer:
        pass
    state.apply(
        sorted((e for e in events if e.get("kind") not in ("step", "heartbeat")), key=lambda e: e.get("t", 0.0))
    )
    return list(state.ends)


def _end_phases(row: dict, end: Optional[EndCause], log: _Log) -> dict:
    """The end's cause and summary, and when the controller saw its job gone and relaunched the group."""
    if end is None:
        return {**row, "cause": None, "end": None, "noticed": NAN, "restarted": NAN}
    restart = log.of(end.replica, "restart").first_after(row["t"], lambda e: (e.get("attempt") or 0) > end.attempt)
    noticed = end.job_t - row["t"] if end.job_t is not None else NAN
    return {
        **row,
        "cause": end.cause(),
        "end": end.summary(),
        "noticed": noticed,
        "restarted": _since(restart, row["t"]),
    }


def recovery_timeline(events: Sequence[dict]) -> pd.DataFrame:
    """One row per fault (a ``resume`` is not one) and per unplanned end no fault explains (``action``
    ``unplanned``; the death's time is ``t``, its ``cause`` and ``end`` say why), in time order: ``COLUMNS``;
    see the module docstring."""
    events = decided(events)
    log, ends = _Log(events), ends_of(events)
    by_fault = {(c.replica, c.injected["t"]): c for c in ends if c.injected is not None}
    rows = []
    for f in log.kind("fault").events:
        action = f.get("action")
        kind = faultkinds.kind(action) if isinstance(action, str) else None
        if kind is None:
            continue
        if kind.targets == "lighthouse":
            rows.append(_end_phases(_lighthouse_recovery(f, log), None, log))
        elif kind.targets == "replica" and isinstance(f.get("target"), int):
            end = by_fault.get((f["target"], f["t"])) if kind.ends_process else None
            rows.append(_end_phases(_replica_recovery(f, kind, log), end, log))
    for c in ends:
        if c.unexplained and c.t is not None:
            death = {"t": c.t, "target": c.replica, "attempt": c.attempt, "action": UNPLANNED, "origin": None}
            rows.append(_end_phases(_replica_recovery(death, faultkinds.KINDS["kill"], log), c, log))
    rows.sort(key=lambda row: row["t"])
    return pd.DataFrame(rows, columns=COLUMNS)


def ends_process(timeline: pd.DataFrame) -> pd.Series:
    """Per row: its fault ended the targeted process (a kill, in the wide sense), so it came back as a new attempt."""
    return timeline["action"].map(lambda a: bool(getattr(faultkinds.kind(a), "ends_process", False))).astype(bool)
