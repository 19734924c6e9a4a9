"""Timeouts recommended from a measured run: each value with the measurement it rests on.

:func:`measure` reads a run's events into :class:`~workbench.spec.timeouts.Measured` (the
figures preflight's timeout rules compare against); :func:`recommend` turns them into one
:class:`Recommendation` per timeout the run's trainer and backend set. Pure: events in,
figures out.

What is measured, from the event schema (``docs/events.md``):

- step time: ``step_time_s`` of the ``step`` events that committed, but not an attempt's first
  (it carries the start: imports, compilation, the heal) nor one in a new quorum (a ``quorum_id``
  other than its attempt's step before: it carries the quorum's wait, measured below). A step
  voted down is left out: it lasted as long as the timeout that failed it, and a timeout
  recommended from it would only grow. Percentiles are nearest-rank: p99 is the
  ``ceil(0.99 n)``-th smallest of ``n``.
- step interval: the longest gap between two committed steps of one attempt (a save, a heal,
  or a stall inside it): what the hang detector must not take for a hang. A fault's target's gap
  across the fault is left out: that one is what the detector is for.
- heal: ``heal`` events' ``seconds`` (the transfer), failed heals left out.
- save: ``checkpoint`` events with ``durable`` and ``seconds``.
- quorum: per attempt, from its last ``step`` (or its ``manager_ready`` phase) to each ``quorum``
  event, which torchft logs when a quorum forms; and ``t_quorum_rtt_s`` where the run timed its
  steps (``torchft.step_timing``).
- restart: a ``restart`` event to the first ``step`` of the attempt it starts.

A recommendation is the largest of its candidates: a measured tail × ``margin`` (3 unless told),
a measured maximum × :data:`HEADROOM`, and the orderings preflight checks (a timeout above the one
that must fire first, × :data:`HEADROOM`). The one that wins is printed as its reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Iterable, Optional, Sequence

from workbench.spec.models import Spec
from workbench.spec.timeouts import SIGNAL_DELAY_S, Measured, pg_timeout, titan_config
from workbench.trainers import trainer_kind

MARGIN = 3.0
HEADROOM = 1.25
"""A timeout that must exceed a measured maximum, or another timeout, is set this much above it."""


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """One timeout: its spec key (or the cluster's setting), the value, its unit, why, and what the spec has."""

    key: str
    value: float
    unit: str
    basis: str
    current: Optional[float] = None

    def line(self) -> str:
        now = "" if self.current is None else f"; now {self.current:g} {self.unit}"
        return f"{self.key}: {self.value:g} {self.unit} ({self.basis}{now})"


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The ``ceil(q n)``-th smallest of ``values`` (q in (0, 1])."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(round(q * len(ordered), 9))) - 1]


def _attempt(e: dict) -> tuple:
    return e.get("replica"), e.get("attempt")


def measure(events: Iterable[dict], source: str = "") -> Measured:
    """A run's events → the figures its timeouts rest on (see the module docstring)."""
    ordered = sorted((e for e in events if isinstance(e.get("t"), (int, float))), key=lambda e: e["t"])
    steps: dict[tuple, list[dict]] = defaultdict(list)
    times: list[float] = []
    quorum_waits: list[float] = []
    last_progress: dict[tuple, float] = {}
    heals, saves, restarts = [], [], []
    pending_restart: dict[tuple, float] = {}
    for e in ordered:
        kind, key = e.get("kind"), _attempt(e)
        if kind == "step":
            if e.get("committed", True) is not False:
                before = steps[key][-1] if steps[key] else None
                same_quorum = before is not None and before.get("quorum_id") == e.get("quorum_id")
                if same_quorum and isinstance(e.get("step_time_s"), (int, float)):
                    times.append(float(e["step_time_s"]))
                steps[key].append(e)
            if isinstance(e.get("t_quorum_rtt_s"), (int, float)):
                quorum_waits.append(float(e["t_quorum_rtt_s"]))
            last_progress[key] = e["t"]
            if key in pending_restart:
                restarts.append(e["t"] - pending_restart.pop(key))
        elif kind == "phase" and e.get("phase") == "manager_ready":
            last_progress[key] = e["t"]
        elif kind == "quorum" and key in last_progress:
            quorum_waits.append(e["t"] - last_progress[key])
        elif kind == "heal" and not e.get("error") and isinstance(e.get("seconds"), (int, float)):
            heals.append(float(e["seconds"]))
        elif kind == "checkpoint" and e.get("durable") and isinstance(e.get("seconds"), (int, float)):
            saves.append(float(e["seconds"]))
        elif kind == "restart":
            pending_restart[key] = e["t"]
    hit = [(e["target"], e["t"]) for e in ordered if e.get("kind") == "fault" and isinstance(e.get("target"), int)]
    intervals = [
        b["t"] - a["t"]
        for (replica, _), s in steps.items()
        for a, b in zip(s, s[1:])
        if not any(r == replica and a["t"] <= t <= b["t"] for r, t in hit)
    ]
    return Measured(
        steps=len(times),
        step_p50_s=nearest_rank(times, 0.5) if times else None,
        step_p99_s=nearest_rank(times, 0.99) if times else None,
        step_max_s=max(times, default=None),
        interval_max_s=max(intervals, default=None),
        heal_max_s=max(heals, default=None),
        save_max_s=max(saves, default=None),
        quorum_max_s=max(quorum_waits, default=None),
        restart_max_s=max(restarts, default=None),
        source=source,
    )


def measurement_lines(m: Measured) -> list[str]:
    """What was measured, one line each (what :func:`recommend`'s reasons refer to)."""
    rows = [
        (
            "step time",
            m.step_p50_s
            and f"p50 {m.step_p50_s:.3g} s, p99 {m.step_p99_s:.3g} s, max {m.step_max_s:.3g} s over {m.steps} steps",
        ),
        ("slowest step interval", m.interval_max_s and f"{m.interval_max_s:.3g} s"),
        ("slowest heal", m.heal_max_s and f"{m.heal_max_s:.3g} s"),
        ("slowest save", m.save_max_s and f"{m.save_max_s:.3g} s"),
        ("slowest quorum", m.quorum_max_s and f"{m.quorum_max_s:.3g} s"),
        ("slowest restart", m.restart_max_s and f"{m.restart_max_s:.3g} s (restart to first step)"),
    ]
    return [f"{name}: {text if text else 'none in this run'}" for name, text in rows]


class _Pick:
    """Candidates for one timeout; the largest wins, and its reason with it."""

    def __init__(self) -> None:
        self.best: Optional[tuple[float, str]] = None

    def add(self, value: Optional[float], basis: str) -> "_Pick":
        if value is not None and value > 0 and (self.best is None or value > self.best[0]):
            self.best = (value, basis)
        return self


def _up(x: float, unit: str) -> float:
    """Rounded up: whole milliseconds, minutes and steps; seconds to 0.1."""
    if unit in ("ms", "min", "steps"):
        return float(math.ceil(round(x, 6)))
    return math.ceil(round(x * 10, 6)) / 10


def recommend(spec: Spec, m: Measured, margin: float = MARGIN) -> list[Recommendation]:
    """One recommendation per timeout the spec's trainer and backend set, from the measurements ``m``."""
    kind = trainer_kind(spec.trainer)
    out: list[Recommendation] = []

    def emit(key: str, pick: _Pick, unit: str, current: Optional[float]) -> Optional[float]:
        if pick.best is None:
            return None
        value = _up(pick.best[0], unit)
        out.append(Recommendation(key, value, unit, pick.best[1], current))
        return value

    tail = m.step_p99_s and f"step time p99 {m.step_p99_s:.3g} s over {m.steps} steps × {margin:g}"
    lh, tf = spec.lighthouse, spec.torchft
    pg_s: Optional[float] = None
    if kind.elastic and "torchft" in kind.sections:
        pick = _Pick()
        if m.step_p99_s is not None:
            pick.add(m.step_p99_s * margin * 1000, str(tail))
        if m.step_max_s is not None:
            pick.add(m.step_max_s * HEADROOM * 1000, f"slowest step {m.step_max_s:.3g} s × {HEADROOM:g}")
        pick.add(
            float(lh.heartbeat_timeout_ms),
            f"lighthouse.heartbeat_timeout_ms {lh.heartbeat_timeout_ms}: the quorum cannot drop a dead peer sooner",
        )
        key = (
            "titan.overrides.fault_tolerance.process_group_timeout_ms"
            if "titan" in kind.sections
            else "torchft.pg_timeout_ms"
        )
        pg_ms = emit(key, pick, "ms", pg_timeout(spec)[1])
        pg_s = pg_ms / 1000 if pg_ms is not None else None
    if "torchft" in kind.sections:
        pick = _Pick()
        if m.step_p99_s is not None:
            pick.add(m.step_p99_s * margin, str(tail))
        if m.heal_max_s is not None:
            pick.add(m.heal_max_s * margin, f"slowest heal {m.heal_max_s:.3g} s × {margin:g}")
        if pg_s is not None:
            pick.add(
                pg_s * HEADROOM, f"the process-group timeout {pg_s:g} s × {HEADROOM:g}: torchft's must not fire first"
            )
        if not kind.elastic and m.restart_max_s is not None:
            basis = f"slowest restart {m.restart_max_s:.3g} s × {margin:g}: the job's ranks meet under it at start"
            pick.add(m.restart_max_s * margin, basis)
        timeout_s = emit("torchft.timeout_s", pick, "s", tf.timeout_s)
    else:
        timeout_s = None
    if kind.elastic and "torchft" in kind.sections:
        pick = _Pick()
        if m.quorum_max_s is not None:
            pick.add(m.quorum_max_s * margin, f"slowest quorum {m.quorum_max_s:.3g} s × {margin:g}")
        slowest = max(lh.join_timeout_ms, lh.heartbeat_timeout_ms)
        pick.add(
            slowest / 1000 * HEADROOM,
            f"the lighthouse's join and heartbeat timeouts, at most {slowest} ms, × {HEADROOM:g}: a quorum waits for them",
        )
        emit("torchft.quorum_timeout_s", pick, "s", tf.quorum_timeout_s)
    if "titan" in kind.sections:
        train = _titan_train(spec, m, pg_s, margin, emit)
        pick = _Pick()
        if train is not None:
            pick.add(train * HEADROOM, f"comm.train_timeout_seconds {train:g} s × {HEADROOM:g}")
        if timeout_s is not None:
            pick.add(
                timeout_s * HEADROOM,
                f"torchft.timeout_s {timeout_s:g} s × {HEADROOM:g}: a relaunched group heals in its first step",
            )
        config = titan_config(spec)
        emit("titan.overrides.comm.init_timeout_seconds", pick, "s", config.get("comm.init_timeout_seconds"))
    pick = _Pick()
    if m.interval_max_s is not None:
        pick.add(m.interval_max_s * margin, f"slowest step interval {m.interval_max_s:.3g} s × {margin:g}")
    if pg_s is not None and not (kind.says_waiting_at_sync and spec.ft.algorithm != "ddp"):
        pick.add(pg_s * HEADROOM, f"the process-group timeout {pg_s:g} s × {HEADROOM:g}: survivors wait it out")
    emit("hang.timeout_s", pick, "s", spec.hang.timeout_s)
    _checkpoint_period(spec, m, emit)
    if spec.cluster == "slurm":
        _slurm(spec, m, margin, emit)
    return out


def _checkpoint_period(spec: Spec, m: Measured, emit) -> None:
    """Steps between saves: Young's interval sqrt(2 × save × MTBF) under chaos, else saves a tenth of the time."""
    kind = trainer_kind(spec.trainer)
    key = kind.checkpoint_period or ("checkpoint.every_steps" if "checkpoint" in kind.sections else None)
    if key is None or m.save_max_s is None or not m.step_p50_s:
        return
    section, _, name = key.partition(".")
    current = getattr(spec, section).get(name) if isinstance(getattr(spec, section), dict) else None
    if current is None and not isinstance(getattr(spec, section), dict):
        current = getattr(getattr(spec, section), name)
    if spec.chaos is not None:
        interval = math.sqrt(2 * m.save_max_s * spec.chaos.mtbf_s)
        basis = f"Young's sqrt(2 × slowest save {m.save_max_s:.3g} s × chaos.mtbf_s {spec.chaos.mtbf_s:g}) = {interval:.3g} s"
    else:
        interval = 10 * m.save_max_s
        basis = f"slowest save {m.save_max_s:.3g} s × 10 = {interval:.3g} s: saves take a tenth of the time"
    pick = _Pick().add(interval / m.step_p50_s, f"{basis}, over step time p50 {m.step_p50_s:.3g} s")
    emit(key, pick, "steps", current)


def _titan_train(spec: Spec, m: Measured, pg_s: Optional[float], margin: float, emit) -> Optional[float]:
    pick = _Pick()
    if m.step_max_s is not None:
        pick.add(m.step_max_s * margin, f"slowest step {m.step_max_s:.3g} s × {margin:g}")
    if pg_s is not None:
        pick.add(pg_s * HEADROOM, f"the process-group timeout {pg_s:g} s × {HEADROOM:g}: torchft's fires first")
    current = titan_config(spec).get("comm.train_timeout_seconds")
    return emit("titan.overrides.comm.train_timeout_seconds", pick, "s", current)


def _slurm(spec: Spec, m: Measured, margin: float, emit) -> None:
    if m.step_p50_s is not None:
        minutes = (spec.steps * m.step_p50_s * HEADROOM + SIGNAL_DELAY_S) / 60
        basis = (
            f"steps {spec.steps} × step time p50 {m.step_p50_s:.3g} s × {HEADROOM:g} + the {SIGNAL_DELAY_S} s "
            "stop signal lead"
        )
        emit("slurm.time_min", _Pick().add(minutes, basis), "min", spec.slurm.time_min)
    if m.save_max_s is not None:
        step = m.step_max_s or 0.0
        basis = f"(slowest step {step:.3g} s + slowest save {m.save_max_s:.3g} s) × {margin:g}"
        emit("KillWait (slurm.conf)", _Pick().add((step + m.save_max_s) * margin, basis), "s", None)
