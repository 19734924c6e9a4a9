"""One replica group as the run-state fold sees it: its state, current attempt and process, job, step.

:class:`~workbench.state.fold.RunState` keeps one :class:`ReplicaView` per
group and moves it through these states, from the events of that group:

============== ================================================================
pending        submitted (or planned), no ``start`` yet
starting       ``start``/``phase`` of the current attempt, no step yet
healing        a ``heal``, or a step with ``participating=false``, not yet
               followed by a committed step
participating  committed steps
hung           a fault whose kind pauses the process (``hang``), or the
               controller's ``hang`` event, and no progress since: no
               ``resume``, the step has not advanced, ``seconds`` not passed
dead           a fault whose kind ends the process, an ``exit`` with reason
               ``error``, or a controller ``job`` event that ended unclean;
               stays dead until a newer attempt starts (late events of the
               dead attempt are ignored)
finished       ``exit`` with reason ``completed``
stopped        ``exit`` with reason ``stopped`` or ``preempted`` (a preemption
               the workbench did not inject)
============== ================================================================
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from workbench.cluster.procs import Proc
from workbench.faults.kinds import FaultKind
from workbench.state.causes import EndCause

REPLICA_STATES = ("pending", "starting", "participating", "healing", "hung", "dead", "finished", "stopped")


@dataclasses.dataclass
class ReplicaView:
    """One replica group as the fold sees it."""

    replica: int
    state: str = "pending"
    attempt: int = 0
    proc: Optional[Proc] = None
    job_id: Optional[str] = None
    node: Optional[str] = None
    step: Optional[int] = None
    committed_step: int = 0
    loss: Optional[float] = None
    last_seen: Optional[float] = None
    step_time_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    mem_gb: Optional[float] = None
    hosts: list = dataclasses.field(default_factory=list)
    restarts: int = 0
    heals: int = 0
    faults: int = 0  # injected into this group (a resume is none)
    steps_lost: int = 0
    diverged_at: Optional[int] = None  # the first step whose loss was NaN or infinite
    dead_attempt: int = -1
    hang: Optional[dict] = None
    waiting: Optional[str] = None  # its last heartbeat said it waits for its peers ("sync"), no step since
    waited_t: Optional[float] = None  # the last heartbeat that said so
    impaired: Optional[dict] = None  # a fault that slows or cuts it off while it runs: kind, t, seconds
    procs: dict = dataclasses.field(default_factory=dict)  # attempt -> Proc
    jobs: dict = dataclasses.field(default_factory=dict)  # attempt -> job id
    exited: set = dataclasses.field(default_factory=set)  # attempts that wrote exit or whose job ended
    ended_jobs: set = dataclasses.field(default_factory=set)  # attempts whose job the controller saw end
    last_end: Optional[EndCause] = None  # why its newest ended attempt ended (``workbench.state.causes``)

    def heartbeat_age(self, now: Optional[float] = None) -> Optional[float]:
        if self.last_seen is None or self.state in ("dead", "finished", "stopped"):
            return None
        return max(0.0, (now if now is not None else time.time()) - self.last_seen)

    def current_job(self) -> Optional[tuple[int, str]]:
        """(attempt, job id) of the newest submitted attempt whose job has not ended."""
        for a in sorted(self.jobs, reverse=True):
            return None if a in self.ended_jobs else (a, self.jobs[a])
        return None

    def live_proc(self, attempt: Optional[int] = None) -> Optional[Proc]:
        """The process of ``attempt`` (default: the current one) if it has not exited."""
        a = self.attempt if attempt is None else attempt
        return None if a in self.exited else self.procs.get(a)

    def as_dict(self) -> dict:
        return {
            "state": self.state,
            "impaired": self.impaired["kind"] if self.impaired else None,
            "attempt": self.attempt,
            "step": self.step or 0,
            "pid": self.proc.pid if self.proc else None,
            "host": self.proc.host if self.proc else None,
            "job_id": self.job_id,
            "node": self.node,
            "t": self.last_seen,
            "loss": self.loss,
            "restarts": self.restarts,
            "diverged_at": self.diverged_at,
            "last_end": self.last_end.as_dict() if self.last_end is not None else None,
        }

    # -- transitions, applied by the fold ------------------------------------
    def follow(self, attempt: int) -> None:
        """A newer attempt wrote: it is the current one now, with its own process and job, not hung."""
        self.attempt = attempt
        self.hang = None
        self.proc = self.procs.get(attempt)
        self.job_id = self.jobs.get(attempt, self.job_id)

    def progressed(self, step: object, t: float) -> bool:
        """Record liveness at ``t``; returns False while the group is hung (its step has not
        advanced past the hang's and the hang's ``seconds`` have not passed)."""
        self.last_seen = t
        if self.hang is not None:
            h = self.hang
            advanced = isinstance(step, int) and h["step"] is not None and step > h["step"]
            expired = h["seconds"] is not None and t >= h["t"] + h["seconds"]
            if not (advanced or expired):
                return False
            self.hang = None
        return True

    def ended(self, kind: FaultKind) -> None:
        """A fault of ``kind`` ended the current attempt's process."""
        self.state = kind.state_after or "dead"
        self.dead_attempt = max(self.dead_attempt, self.attempt)
        self.hang = None
