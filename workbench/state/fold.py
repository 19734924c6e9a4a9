"""The run state: one incremental fold of the event log that everything reads.

:class:`RunState` takes events in the order an :class:`~workbench.events.reader.EventReader`
returns them (``apply`` any number of times, each with only the new ones) and
keeps, per replica group, a :class:`~workbench.state.replica.ReplicaView`: its state, current attempt,
that attempt's process identity (PID, start time, host), Slurm job id and node,
step, last heartbeat and loss. Also: the run's state, the controller's and the
lighthouse's processes, the spares, and the counts the CLI prints. ``Run``,
``workbench status``, the dashboard's tiles, the controller and fault
targeting all read this one fold; nobody re-reads the log to answer "which
process is replica r now".

Each group's states, and the events that move it between them: :mod:`workbench.state.replica`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

from workbench.cluster.procs import Proc
from workbench.events.states import RunEndReason
from workbench.faults import kinds as faultkinds
from workbench.state.causes import CauseLedger
from workbench.state.checkpoints import CheckpointLedger
from workbench.state.event_fields import int_or_zero, well_formed
from workbench.state.nodes import NodeMap, hit_by
from workbench.state.replica import ReplicaView
from workbench.state.run_status import as_resumed, no_write_since, run_state, state_lost_text
from workbench.state.steptimes import StepTimes

MAX_REPLICAS = 4096


class RunState:
    """The fold; see the module docstring. ``subscribe`` gets each applied batch."""

    def __init__(self, replicas: int, steps: int = 0) -> None:
        self.groups = replicas  # replica groups, or the ranks of a one-job trainer (each writes its own events)
        self.replicas: dict[int, ReplicaView] = {r: ReplicaView(r) for r in range(replicas)}
        self.steps_planned = steps
        self.run_end: Optional[dict] = None
        self._lost_event: Optional[dict] = None  # the last ``state_lost``: ``state_lost`` says it as resumed
        self.started = False
        self.stepped = False
        self.controller: Optional[Proc] = None
        self.lighthouse: Optional[Proc] = None
        self.lighthouse_up = False
        self.lighthouse_procs: list[Proc] = []
        self.spares: dict[int, Proc] = {}
        self.restores: list[dict] = []
        self.checkpoints = CheckpointLedger()
        self.ends = CauseLedger()  # why each ended attempt ended (workbench.state.causes)
        self.nodes = NodeMap()  # which node each part of each group runs on (workbench.state.nodes)
        self.step_times = StepTimes()  # each group's recent own step times (the straggler score's)
        self.max_committed = 0
        self.faults = self.restarts = self.heals = 0
        self.host_faults: dict = {}  # (kind, replica) -> a machine fault's event (hostfaults), until its resume
        self.events_seen = 0
        self.bad_events = 0
        self.write_gaps = self.events_lost = 0  # a writer's file unwritable for a while (``write_gap``), events it lost
        self.t0: Optional[float] = None
        self.last_event_t: Optional[float] = None
        self._subscribers: list[Callable[[list[dict]], None]] = []

    # -- folding -------------------------------------------------------------
    def apply(self, events: Iterable[dict]) -> list[dict]:
        batch = list(events)
        for e in batch:
            self._apply_one(e)
        for fn in list(self._subscribers):
            fn(batch)
        return batch

    def subscribe(self, fn: Callable[[list[dict]], None]) -> Callable[[], None]:
        self._subscribers.append(fn)
        return lambda: self._subscribers.remove(fn) if fn in self._subscribers else None

    def view(self, replica) -> Optional[ReplicaView]:
        if replica is None or isinstance(replica, bool):
            return None
        try:
            r = int(replica)
        except (TypeError, ValueError):
            return None
        if r not in self.replicas:
            if r < 0 or r > MAX_REPLICAS:
                return None
            self.replicas[r] = ReplicaView(r)
        return self.replicas[r]

    def _apply_one(self, e: dict) -> None:
        kind = e.get("kind")
        t = e.get("t")
        t = float(t) if isinstance(t, (int, float)) else 0.0
        self.events_seen += 1
        self.last_event_t = t
        if self.t0 is None or (t and t < self.t0):
            self.t0 = t
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return
        if kind not in _CHECKS_INLINE and not well_formed(e):
            self.bad_events += 1
            return
        try:
            handler(self, e, t)
        except (TypeError, ValueError, KeyError, AttributeError):  # a malformed event: counted, skipped
            self.bad_events += 1

    def _own(self, e: dict) -> Optional[ReplicaView]:
        """The view of a replica's own event, or None if it is a stale attempt's."""
        if e.get("role") == "controller":
            return None
        v = self.view(e.get("replica"))
        if v is None:
            return None
        attempt = int_or_zero(e.get("attempt"))
        if attempt < v.attempt or attempt <= v.dead_attempt:
            return None
        if attempt > v.attempt:
            v.follow(attempt)
        return v

    def _on_start(self, e: dict, t: float) -> None:
        self.started = True
        if e.get("role") == "controller":
            self.controller = Proc.from_event(e)
            return
        if e.get("spare") is not None and e.get("replica") is None:
            proc = Proc.from_event(e)
            if proc is not None and int_or_zero(e.get("task")) == 0:  # the spare's job, not its other nodes' tasks
                self.spares[int_or_zero(e["spare"])] = proc
            return
        v = self.view(e.get("replica"))
        if v is None:
            return
        proc = Proc.from_event(e)
        self.nodes.start(e, proc)
        if int_or_zero(e.get("task")) > 0:  # another node's part of a group: placement only (workbench.state.nodes)
            return
        if proc is not None:
            v.procs[int_or_zero(e.get("attempt"))] = proc
        v = self._own(e)
        if v is None:
            return
        v.proc = proc
        v.state = "starting"
        v.last_seen = t
        v.node = e.get("node") or v.node
        if e.get("job_id") and int_or_zero(e.get("attempt")) not in v.jobs:
            v.jobs[v.attempt] = str(e["job_id"])
            v.job_id = v.jobs[v.attempt]
        host = e.get("node") or e.get("host")
        if host and host not in v.hosts:
            v.hosts.append(host)

    def _on_submit(self, e: dict, t: float) -> None:
        v = self.view(e.get("replica"))
        if v is None or e.get("job_id") is None:
            return
        attempt = int_or_zero(e.get("attempt"))
        v.jobs[attempt] = str(e["job_id"])
        if attempt == v.attempt:
            v.job_id = v.jobs[attempt]

    def _on_restart(self, e: dict, t: float) -> None:
        self.restarts += 1
        v = self.view(e.get("replica"))
        if v is None:
            return
        v.restarts += 1
        if e.get("job_id") is not None:  # a spare took over: its job is the group's next attempt
            v.jobs[int_or_zero(e.get("attempt"))] = str(e["job_id"])

    def _on_phase(self, e: dict, t: float) -> None:
        v = self._own(e)
        if v is not None:
            v.last_seen = t
            if v.state == "pending":
                v.state = "starting"
            if e.get("phase") == "restored":
                lost = max(0, (v.step or 0) - int_or_zero(e.get("from_step")))
                v.steps_lost += lost
                self.restores.append({"event": e, "replica": v.replica, "lost": lost})

    def _on_heartbeat(self, e: dict, t: float) -> None:
        v = self._own(e)
        if v is None or not v.progressed(e.get("step"), t):
            return
        if v.state == "hung":
            v.state = "participating"
        v.waiting = e.get("waiting")
        if v.waiting:
            v.waited_t = t
        if isinstance(e.get("step"), int):
            v.step = e["step"]

    def _on_step(self, e: dict, t: float) -> None:
        self.stepped = True
        committed = bool(e.get("committed", True))
        step = e.get("step")
        if committed and isinstance(step, int):
            self.max_committed = max(self.max_committed, step)
        if self.checkpoints.open:
            self.checkpoints.stepped(e)
        v = self._own(e)
        if v is None or not v.progressed(e.get("step"), t):
            return
        v.waiting = None
        self.step_times.add(v.replica, v.attempt, e, t)
        if isinstance(step, int):
            v.step = step
            if committed:
                v.committed_step = max(v.committed_step, step)
        loss = e.get("loss")
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            v.loss = float(loss)
            if not math.isfinite(loss) and v.diverged_at is None and e.get("participating") is not False:
                v.diverged_at = step if isinstance(step, int) else v.step
        for field in ("step_time_s", "tokens_per_s", "mem_gb"):
            if e.get(field) is not None:
                setattr(v, field, e[field])
        if e.get("participating") is False:
            v.state = "healing"
        elif committed:
            v.state = "participating"
        elif v.state in ("starting", "pending", "hung"):
            v.state = "healing"

    def _on_heal(self, e: dict, t: float) -> None:
        self.heals += 1
        group = self.view(e.get("replica"))
        if group is not None:
            group.heals += 1
        v = self._own(e)
        if v is not None:
            v.state = "healing"
            v.last_seen = t

    def _on_fault(self, e: dict, t: float) -> None:
        action = e.get("action")  # a str, or absent (``well_formed``)
        k = faultkinds.kind(action) if isinstance(action, str) else None
        if action != faultkinds.RESUME:
            self.faults += 1
        if k is not None and hit_by(k.name, e.get("node")):  # every group with a part on the node, not only the target
            self.nodes.fault(k.name, e["node"])
            for r in self.nodes.groups_on(e["node"], self.attempts()):
                self.replicas[r].ended(k)
                self.ends.fault(e, t, self.replicas[r])
        elif action == faultkinds.RESUME and hit_by(e.get("resumed"), e.get("node")):
            self.nodes.resume(e["node"])
        v = self.view(e.get("target")) if e.get("target") != "lighthouse" else None
        if v is None:
            return
        if action != faultkinds.RESUME:
            v.faults += 1
        if k is not None and k.host:
            self.host_faults[(action, v.replica)] = e
        elif action == faultkinds.RESUME:
            self.host_faults.pop((e.get("resumed"), v.replica), None)
        if k is not None and k.ends_process:
            v.ended(k)
            self.ends.fault(e, t, v)
        elif k is not None and k.pauses_process:
            v.state = k.state_after or "hung"
            v.hang = {"t": t, "step": v.step, "seconds": e.get("seconds")}
        elif k is not None and k.impairs:
            v.impaired = {"kind": action, "t": t, "seconds": e.get("seconds")}
        elif action == faultkinds.RESUME:
            if v.impaired and v.impaired["kind"] == e.get("resumed"):
                v.impaired = None
            if v.state == "hung":
                v.hang = None
                v.state = "participating"

    def _on_node_health(self, e: dict, t: float) -> None:
        self.nodes.sampled(e)

    def _on_checkpoint(self, e: dict, t: float) -> None:
        self.checkpoints.apply(e, t)

    def _on_hang(self, e: dict, t: float) -> None:
        v = self.view(e.get("target", e.get("replica")))
        if v is not None and v.state not in ("dead", "finished", "stopped"):
            v.state = "hung"
            v.hang = {"t": t, "step": v.step, "seconds": None}

    def _on_exit(self, e: dict, t: float) -> None:
        if e.get("role") == "controller":
            return
        v = self.view(e.get("replica"))
        if v is not None:
            v.exited.add(int_or_zero(e.get("attempt")))
            self.ends.exit(e, t, v)
        v = self._own(e)
        if v is None:
            return
        reason = e.get("reason")
        v.last_seen = t
        if reason == "completed":
            v.state = "finished"
        elif reason in ("stopped", "preempted"):
            v.state = "stopped"
        else:
            v.state = "dead"
            v.dead_attempt = max(v.dead_attempt, v.attempt)

    def _on_job(self, e: dict, t: float) -> None:
        v = self.view(e.get("replica"))
        if v is None or e.get("state") != "ended":
            return
        attempt = int_or_zero(e.get("attempt"))
        v.exited.add(attempt)
        v.ended_jobs.add(attempt)
        self.ends.job(e, t, v)
        if not e.get("clean", True) and attempt >= v.attempt and v.state not in ("finished", "stopped"):
            v.state = "dead"
            v.dead_attempt = max(v.dead_attempt, attempt)

    def _on_lighthouse(self, e: dict, t: float) -> None:
        up = e.get("state") == "up"
        self.lighthouse_up = up
        if up:
            self.lighthouse = Proc.from_event(e)
            if self.lighthouse is not None:
                self.lighthouse_procs.append(self.lighthouse)

    def _on_run_end(self, e: dict, t: float) -> None:
        self.run_end = e

    def _on_state_lost(self, e: dict, t: float) -> None:
        self._lost_event = e

    def _on_write_gap(self, e: dict, t: float) -> None:
        self.write_gaps += 1
        self.events_lost += int_or_zero(e.get("lost"))

    # -- answers -------------------------------------------------------------
    @property
    def state_lost(self) -> Optional[dict]:
        """The last ``state_lost``: every group died and no peer held the state; ``resumed_from`` as the
        restores after it loaded it (a restore may be read before it, from another file)."""
        return as_resumed(self._lost_event, [r["event"] for r in self.restores])

    @property
    def state(self) -> str:
        """pending | starting | running | completed | failed | stopped."""
        return run_state(self.run_end, self.started, self.stepped)

    @property
    def end_reason(self) -> Optional[str]:
        """Why the run ended (``run_end``'s ``reason``; for ``run_root_unwritable`` from when and why); None before."""
        end = self.run_end
        if end is not None and end.get("reason") == RunEndReason.STATE_LOST:
            return f"{end['reason']}: {state_lost_text(self.state_lost)}"
        if end is None or end.get("reason") != RunEndReason.RUN_ROOT_UNWRITABLE:
            return None if end is None else str(end.get("reason") or "")
        return f"{end['reason']}: {no_write_since(end.get('since'), end.get('error'))}; the controller stopped the run"

    def processes(self) -> list[Proc]:
        """Every process the run recorded: controller, lighthouses, every attempt, spares."""
        out = [self.controller] if self.controller else []
        out += self.lighthouse_procs
        for v in self.replicas.values():
            out += list(v.procs.values())
        out += list(self.spares.values()) + self.nodes.procs()
        seen, unique = set(), []
        for p in out:
            if p is not None and (p.pid, p.host) not in seen:
                seen.add((p.pid, p.host))
                unique.append(p)
        return unique

    def attempts(self) -> dict[int, int]:
        """Replica -> its current attempt."""
        return {r: v.attempt for r, v in self.replicas.items()}

    def live_processes(self) -> list[Proc]:
        return [p for p in self.processes() if p.alive()]

    def progress(self) -> tuple[int, int]:
        return min(self.max_committed, self.steps_planned), self.steps_planned

    def counts(self) -> dict:
        return {"faults": self.faults, "restarts": self.restarts, "heals": self.heals}

    def checkpoint_status(self) -> dict:
        """The last durable checkpoint and the saves that did not commit (``checkpoint_ledger``)."""
        return self.checkpoints.status(self.replicas)


_HANDLERS = {name[4:]: fn for name, fn in vars(RunState).items() if name.startswith("_on_")}
_CHECKS_INLINE = frozenset({"step", "heartbeat"})  # the hot kinds, whose handlers check each field they use
