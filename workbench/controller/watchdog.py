"""Hang detection: a replica group that stopped making progress while it should not have.

The controller feeds the watchdog each committed step's interval (for the
timeout) and calls :meth:`HangWatchdog.check` every tick; a hang is reported as
a ``hang`` event, and with ``hang.action: kill`` the group is killed (a fault of
origin ``watchdog``), which the relaunch policy then restarts like any death.

With the ``hang`` event the stacks of every process of the group are taken
(``workbench.run.stacks``: py-spy, a ``stacks`` event): in a thread, so the
controller's tick goes on meanwhile (a group takes about 0.5 s here, 10 s at
most a process); a kill waits for them, up to :data:`KILL_AFTER_STACKS_S`.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable

from workbench.controller.slots import ReplicaSlot
from workbench.errors import FaultError
from workbench.events.writer import EventWriter
from workbench.faults import inject as faults
from workbench.run import stacks
from workbench.spec.sections import HangSpec
from workbench.state.fold import RunState

MAX_INTERVALS = 2000  # step intervals kept for the median: the run's early steps set the timeout
KILL_AFTER_STACKS_S = stacks.TIMEOUT_S + 1.0  # the most a kill waits for the hung group's stacks


class HangWatchdog:
    def __init__(
        self,
        hang: HangSpec,
        slots: Iterable[ReplicaSlot],
        run_state: RunState,
        writer: EventWriter,
        run: faults.RunHandle,
    ) -> None:
        self.hang = hang
        self.slots = list(slots)
        self.run_state = run_state
        self.writer = writer
        self.run = run  # the handle a kill is injected through (the controller)
        self.step_intervals: list[float] = []
        self.kills: dict[int, tuple[threading.Thread, int, float]] = {}  # replica -> (sampler, attempt, kill by)

    def observe_commit(self, slot: ReplicaSlot, e: dict) -> None:
        """A committed step ``e`` of ``slot``'s current attempt, before the slot records it as its progress."""
        if slot.last_progress_t and len(self.step_intervals) < MAX_INTERVALS:
            self.step_intervals.append(e["t"] - slot.last_progress_t)

    def timeout_s(self) -> float:
        """``hang.timeout_s`` if set; else 20 median step intervals (30 s until 5 are known), at least
        ``hang.min_timeout_s``."""
        h = self.hang
        if h.timeout_s is not None:
            return h.timeout_s
        if len(self.step_intervals) < 5:
            return max(h.min_timeout_s, 30.0)
        return max(h.min_timeout_s, 20 * float(sorted(self.step_intervals)[len(self.step_intervals) // 2]))

    def check(self) -> None:
        """A group that committed before and has made no step progress for the hang timeout is hung if a
        peer has committed a later step (if every group stopped, the run as a whole is stalled: no one
        group's hang). By step, not by time: a group whose peer froze inside an all-reduce waits out the
        process group's timeout (2 s in the ablation notebook) at the step that peer committed 2 ms after
        it; read by time, the frozen peer had progressed since, and a 2 s window evicted the waiting group
        instead (the likely end of a CI run of that notebook whose survivor was relaunched, leaving no
        survivor's stall to show). A group running alone (MaxText, ddp-restart, or the last one left) is
        hung only if it also stopped heartbeating: a compile, a checkpoint or a slow step keeps its
        heartbeat going, a stopped or frozen process does not.

        A group whose heartbeat said, within the timeout, that it waits in a sync (semi-synchronous
        algorithms) waits for a peer: it is not the hung one. Without this, a 5 s hang of one group
        inside a DiLoCo sync (``torchft.pg_timeout_ms`` 8000 holds the all-reduce for it) flagged 15
        of 16 groups of the classroom run: each had arrived at the sync after some other group, which
        counted as a peer having progressed while it did not. Not only the last heartbeat: one that
        came after the sync ended and before the sync step's event was written (its weights'
        checksum, on a loaded machine) said "not waiting" and flagged a peer (a CI run, and 1 of 4 runs of
        ``test_groups_waiting_in_a_sync_for_a_stopped_peer_are_not_flagged_as_hung`` here).

        A hang is reported once until the group steps again, judged by the step's own time: a group
        stopped (SIGSTOP) between stamping a step event and writing it writes that step when it runs
        again, and reading it as progress made after the report flagged the same hang twice (a
        fresh clone's run of the test above: stopped at 0.0, its step 14 stamped -0.009 s and written at
        5.0 s, the second ``hang`` at 5.02 s)."""
        self._kill_sampled()
        now = time.time()
        limit = self.timeout_s()
        running = [s for s in self.slots if s.state == "running" and s.committed_steps > 0]
        for slot in running:
            idle = now - slot.last_progress_t
            if idle < limit or slot.last_progress_t < slot.hang_reported_t:  # reported, no step since
                continue
            view = self.run_state.replicas[slot.replica]
            if len(running) > 1:
                if not any(p.last_step > slot.last_step for p in running if p is not slot):
                    continue
                if now - (view.waited_t or 0.0) < limit:  # waited for its peers: no progress to be had
                    continue
            else:
                seen = view.last_seen or slot.last_progress_t
                if now - seen < limit:
                    continue
            slot.hang_reported_t = now
            self.writer.emit(
                "hang",
                target=slot.replica,
                attempt=slot.attempt,
                step=slot.last_step,
                seconds_without_progress=round(idle, 3),
                timeout_s=round(limit, 3),
            )
            sampler = self._sample(slot)
            if self.hang.action == "kill":
                self.kills[slot.replica] = (sampler, slot.attempt, now + KILL_AFTER_STACKS_S)

    def _sample(self, slot: ReplicaSlot) -> threading.Thread:
        """Take the hung group's stacks in a thread (its processes are found here, in the loop's thread,
        whose fold they are read from)."""
        procs, errors, attempt = stacks.group_processes(
            self.run_state, slot.replica, self.run.cluster.marker, self.run.run_dir
        )

        def take() -> None:
            try:
                stacks.sample(self.run.run_dir, self.writer, slot.replica, procs, "watchdog", attempt, errors)
            except Exception as e:  # a view of the hang: the run goes on without it
                self.writer.emit("warning", message=f"stacks of replica {slot.replica}: {type(e).__name__}: {e}")

        thread = threading.Thread(target=take, name=f"wb-stacks-r{slot.replica}", daemon=True)
        thread.start()
        return thread

    def _kill_sampled(self) -> None:
        """``hang.action: kill``: kill each hung group whose stacks are taken (or took too long), unless it
        moved on to another attempt or stepped again meanwhile (the stacks take ~0.5 s: a group that was
        slow, not hung, has come back by itself)."""
        now = time.time()
        for replica, (sampler, attempt, kill_by) in list(self.kills.items()):
            if sampler.is_alive() and now < kill_by:
                continue
            del self.kills[replica]
            slot = next(s for s in self.slots if s.replica == replica)
            if slot.attempt != attempt or slot.state != "running":
                continue
            if slot.last_progress_t >= slot.hang_reported_t:
                self.writer.emit(
                    "warning", message=f"replica {replica} stepped again after its hang report: not killed"
                )
                continue
            try:
                faults.inject(self.run, "kill", replica, origin="watchdog", writer=self.writer)
            except FaultError as e:
                self.writer.emit("warning", message=f"hang action failed: {e}")
