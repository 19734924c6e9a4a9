"""The run controller: one detached process per run that keeps the run going.

``workbench.submit`` starts it (``python -m workbench.controller.loop RUN_DIR``) in
its own session, so the run outlives the notebook kernel that started it. It:

- starts the lighthouse (elastic trainers) and keeps it up: a lighthouse that
  dies is restarted on the same address, and the replicas' Managers reconnect;
- submits one job per replica group through the cluster backend;
- notices a job that ended without its trainer saying ``exit
  reason=completed``, and relaunches that replica group as the next attempt
  (``relaunch: auto``), up to ``max_restarts``;
- fires the spec's fault schedule;
- on SIGTERM (``run.stop()``) stops every job and the lighthouse;
- writes ``run_end`` with the final state when no replica group is left.

It learns everything about the jobs from the event log, like any other
reader: one reader, folded into the same ``RunState`` a ``Run`` keeps, which
names each group's current process for faults and stop. It writes its own
decisions to ``events/controller.jsonl``. Once one
group has completed the target step, a dead group is not relaunched (it would
find no live peer to heal from and train alone from scratch).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from workbench.analysis import StepColumns, step_index
from workbench.cluster import make_cluster, procs
from workbench.controller import nodehealth
from workbench.controller.lighthouse import Lighthouse
from workbench.events.log import EventReader, EventWriter
from workbench.faults import armed
from workbench.faults import inject as faults
from workbench.run import rundir
from workbench.spec.models import Spec
from workbench.state.fold import RunState
from workbench.trainers import JobContext, job_entrypoint, trainer_kind
from workbench.trainers.torchft import quorum_epochs

POLL_S = 0.1
LIGHTHOUSE_START_S = 30.0
LIGHTHOUSE_RETRIES = 8
LIGHTHOUSE_BACKOFF_S = 0.5


@dataclasses.dataclass
class ReplicaSlot:
    replica: int
    attempt: int = -1
    job: Any = None
    state: str = "pending"  # pending | running | relaunch_wait | completed | failed | stopped
    relaunch_at: float = 0.0
    restarts: int = 0
    last_step: int = 0
    committed_steps: int = 0
    last_progress_t: float = 0.0
    hang_reported_t: float = 0.0  # when its hang was reported; 0.0: none since its last progress


class Controller:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        record = rundir.read_record(self.run_dir)
        self.run_id = self.id = record["run_id"]
        self.spec = Spec.model_validate(record["spec"])
        # Inherited by every process the run starts (lighthouse, fork server, submitit's and Slurm's jobs).
        os.environ["RUST_LOG"] = self.spec.torchft.rust_log
        self.writer = EventWriter(self.run_dir, "controller", run=self.run_id)
        self.health, self.health_at = nodehealth.Sampler(), 0.0
        self.reader = EventReader(self.run_dir)
        self.cluster = make_cluster(self.spec, self.run_dir)
        self.elastic = trainer_kind(self.spec.trainer).elastic
        self.lighthouse: Optional[Lighthouse] = None
        self.lighthouse_down_t: Optional[float] = None
        self.lighthouse_next_try = 0.0
        self.lighthouse_pending: Optional[float] = None  # launched, not listening yet: give up at this time
        self.lighthouse_failures = 0
        self.lighthouse_launched_t: Optional[float] = None
        self.slots = {r: ReplicaSlot(r) for r in range(self.spec.replicas if self.elastic else 1)}
        self.run_state = RunState(self.spec.replicas, self.spec.steps)  # ranks of a one-job trainer too
        self.exits: dict[tuple[int, int], dict] = {}
        self.max_step = 0
        self.stopping = False
        self.t0 = time.time()
        self.t_first_step: Optional[float] = None
        self.step_intervals: list[float] = []
        self.fired: set[int] = set()
        self.deferred_until: dict[int, float] = {}
        self.spares: dict[int, Any] = {}  # spare id -> submitit job
        self.spares_ready: set[int] = set()
        self.next_spare_id = 0
        self.bad_events = 0
        self.triggers = armed.Triggers()
        self.due_triggers: list[tuple[dict, dict]] = []
        self.steps = StepColumns(self.run_dir, index=False)
        self.index_at = time.time() + step_index.PERIOD_S

    # -- lifecycle -----------------------------------------------------------
    def run(self) -> str:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        self.writer.emit("start", role="controller", trainer=self.spec.trainer, cluster=self.cluster.name)
        state, reason = "failed", ""
        try:
            self.cluster.prepare()  # local: the fork server imports while the lighthouse starts
            if self.elastic:
                self.lighthouse = Lighthouse(self.spec, self.run_dir / "lighthouse", self.cluster.lighthouse_host)
                self._write_lighthouse_epoch()
                self.lighthouse.start()
                self._lighthouse_event("up")
            for slot in self.slots.values():
                self._launch(slot)
            for _ in range(self.spec.spares if self.elastic else 0):
                self._launch_spare()
            state, reason = self._loop()
        except Exception as e:
            reason = f"controller error: {type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            self._shutdown()
            for i, f in enumerate(self.spec.faults):
                if i not in self.fired:
                    when = f"at {f.at_s} s" if f.at_s is not None else f"at step {f.at_step}"
                    self.writer.emit(
                        "warning",
                        message=f"scheduled fault {i} ({f.action} {when}) never fired: "
                        f"the run ended at step {self.max_step} first",
                    )
            self._write_step_index()  # before run_end: a reader that sees the end finds the index complete
            self.writer.emit("run_end", state=state, reason=reason, steps=self.max_step)
            self.writer.close()
        return state

    def _write_step_index(self) -> None:
        """The run's step index (``analysis.step_index``), next due ``PERIOD_S`` later or 100 times this
        write's duration, whichever is later: its cost grows with the run and stays under 1 % of a core."""
        t0 = time.time()
        try:
            step_index.write(self.steps, self.run_dir)
        except Exception as e:  # derived data: a reader parses the log instead; the run goes on
            self.writer.emit("warning", message=f"step index not written: {type(e).__name__}: {e}")
        self.index_at = time.time() + max(step_index.PERIOD_S, 100 * (time.time() - t0))

    def _on_stop_signal(self, *_: Any) -> None:
        self.stopping = True

    def _loop(self) -> tuple[str, str]:
        while True:
            self._poll()
            if self.stopping:
                return "stopped", "stop requested"
            self._supervise_lighthouse()
            self._fire_schedule()
            self._fire_triggers()
            self._detect_hangs()
            now = time.time()
            if now >= self.index_at:
                self._write_step_index()
            if now >= self.health_at:
                self.health_at = now + nodehealth.PERIOD_S
                for row in self.health.sample(nodehealth.nodes_of(self.run_state), now):
                    self.writer.emit("node_health", **row)
            for spare_id, job in list(self.spares.items()):
                if self.cluster.is_done(job):
                    del self.spares[spare_id]
                    self.spares_ready.discard(spare_id)
                    self.writer.emit("warning", message=f"spare {spare_id} ended before it was used")
                    if self.next_spare_id < self.spec.spares + self.spec.max_restarts:
                        self._launch_spare()
            for slot in self.slots.values():
                if slot.state == "running" and self.cluster.is_done(slot.job):
                    self._poll()
                    self._job_ended(slot)
                elif slot.state == "relaunch_wait" and now >= slot.relaunch_at:
                    self._launch(slot)
            states = {s.state for s in self.slots.values()}
            if "completed" in states:
                for slot in self.slots.values():
                    if slot.state == "relaunch_wait":
                        slot.state = "stopped"
                    elif slot.state == "running" and slot.committed_steps == 0 and slot.attempt > 0:
                        self._stop_job(slot, "peers completed before this replacement joined")
            if states <= {"completed", "failed", "stopped"}:
                if "completed" in states:
                    return "completed", ""
                return "failed", "every replica group failed or exhausted max_restarts"
            time.sleep(POLL_S)

    # -- jobs ----------------------------------------------------------------
    def _launch(self, slot: ReplicaSlot) -> None:
        slot.attempt += 1
        slot.committed_steps = 0
        slot.last_progress_t = 0.0  # a relaunch gap is no step interval
        slot.hang_reported_t = 0.0
        ctx = JobContext(
            run_dir=str(self.run_dir),
            run_id=self.run_id,
            spec=self.spec.to_dict(),
            replica=slot.replica,
            attempt=slot.attempt,
            lighthouse_addr=self.lighthouse.address if self.lighthouse else None,
            env=self._job_env(),
            loopback_only=self.cluster.loopback_only,
        )
        slot.job = self.cluster.submit(job_entrypoint, ctx, name=f"{self.spec.name}-r{slot.replica}")
        slot.state = "running"
        self.writer.emit("submit", replica=slot.replica, attempt=slot.attempt, job_id=str(slot.job.job_id))

    def _job_env(self) -> dict:
        env = {"PYTHONUNBUFFERED": "1"}
        if self.lighthouse:
            env["TORCHFT_LIGHTHOUSE"] = self.lighthouse.address
            env["TORCHFT_QUORUM_RETRIES"] = str(self.spec.torchft.quorum_retries)
        return env

    def _job_ended(self, slot: ReplicaSlot) -> None:
        exit_event = self.exits.get((slot.replica, slot.attempt))
        clean = bool(exit_event and exit_event.get("reason") == "completed")
        self.writer.emit(
            "job",
            replica=slot.replica,
            attempt=slot.attempt,
            job_id=str(slot.job.job_id),
            state="ended",
            clean=clean,
            reason=(exit_event or {}).get("reason", "died"),
        )
        if clean:
            slot.state = "completed"
            return
        if slot.state == "stopped" or self.stopping:
            slot.state = "stopped"
            return
        if any(s.state == "completed" for s in self.slots.values()):
            slot.state = "stopped"
            return
        if self.spec.relaunch == "off" or slot.restarts >= self.spec.max_restarts:
            slot.state = "failed"
            return
        slot.restarts += 1
        reason = (exit_event or {}).get("reason", "died")
        if self.spares_ready and not self.spec.relaunch_delay_s:
            self._assign_spare(slot, reason)
            return
        slot.state = "relaunch_wait"
        slot.relaunch_at = time.time() + self.spec.relaunch_delay_s
        self.writer.emit(
            "restart", replica=slot.replica, attempt=slot.attempt + 1, reason=reason, from_step=self.max_step
        )

    def _launch_spare(self) -> None:
        """A hot spare: a job that imports, builds the model and waits to be assigned."""
        spare_id = self.next_spare_id
        self.next_spare_id += 1
        ctx = JobContext(
            run_dir=str(self.run_dir),
            run_id=self.run_id,
            spec=self.spec.to_dict(),
            replica=-1,
            attempt=-1,
            lighthouse_addr=self.lighthouse.address if self.lighthouse else None,
            env=self._job_env(),
            loopback_only=self.cluster.loopback_only,
            spare_id=spare_id,
        )
        self.spares[spare_id] = self.cluster.submit(job_entrypoint, ctx, name=f"{self.spec.name}-spare{spare_id}")
        self.writer.emit("submit", spare=spare_id, job_id=str(self.spares[spare_id].job_id))

    def _assign_spare(self, slot: ReplicaSlot, reason: str) -> None:
        spare_id = min(self.spares_ready)
        self.spares_ready.discard(spare_id)
        slot.attempt += 1
        slot.committed_steps = 0
        slot.last_progress_t = 0.0
        slot.hang_reported_t = 0.0
        slot.job = self.spares.pop(spare_id)
        slot.state = "running"
        (self.run_dir / "spares").mkdir(mode=0o700, exist_ok=True)
        rundir.write_json_text(
            self.run_dir / "spares" / f"{spare_id}.json", json.dumps({"replica": slot.replica, "attempt": slot.attempt})
        )
        self.writer.emit(
            "restart",
            replica=slot.replica,
            attempt=slot.attempt,
            reason=reason,
            from_step=self.max_step,
            spare=spare_id,
            job_id=str(slot.job.job_id),
        )
        self._launch_spare()

    def _stop_job(self, slot: ReplicaSlot, reason: str) -> None:
        self._signal_attempt(slot, signal.SIGTERM)
        self.cluster.cancel(slot.job)
        slot.state = "stopped"
        self.writer.emit("warning", replica=slot.replica, message=f"stopped attempt {slot.attempt}: {reason}")

    def _poll(self) -> None:
        self._observe(self.run_state.apply(self.reader.poll()))

    def _signal_attempt(self, slot: ReplicaSlot, sig: int) -> None:
        proc = self.run_state.replicas[slot.replica].live_proc(slot.attempt)
        if proc is not None:
            proc.signal(sig)

    def _observe(self, events: list[dict]) -> None:
        for e in events:
            try:
                self._observe_one(e)
            except (TypeError, ValueError, KeyError):  # a malformed line must not stop the run
                self.bad_events += 1

    def _observe_one(self, e: dict) -> None:
        kind = e.get("kind")
        r = e.get("replica")
        hit = self.triggers.observe(e)
        if hit is not None:
            self.due_triggers.append(hit)
        if kind == "phase" and e.get("phase") == "spare_ready" and e.get("spare") in self.spares:
            self.spares_ready.add(e["spare"])
        if kind == "exit" and r is not None and e.get("role") is None:
            self.exits[(r, e.get("attempt", 0))] = e
        elif kind == "step" and r in self.slots:
            slot = self.slots[r]
            step = e.get("step", 0)
            if not isinstance(step, int):
                raise ValueError(f"step {step!r}")
            if e.get("attempt") == slot.attempt and e.get("committed"):
                if slot.last_progress_t and len(self.step_intervals) < 2000:
                    self.step_intervals.append(e["t"] - slot.last_progress_t)
                slot.committed_steps += 1
                slot.last_step = step
                slot.last_progress_t = e["t"]
                self.max_step = max(self.max_step, step)
                if self.t_first_step is None:
                    self.t_first_step = e["t"]

    # -- lighthouse and faults ----------------------------------------------
    def _supervise_lighthouse(self) -> None:
        """Restart a dead lighthouse on the same address, without ever blocking the loop: launch,
        then check each tick whether it listens. A start that fails (its port was taken meanwhile,
        say) is retried with exponential backoff, ``LIGHTHOUSE_RETRIES`` times, then the run fails."""
        lh, now = self.lighthouse, time.time()
        if lh is None:
            return
        if self.lighthouse_pending is not None:
            try:
                if lh.ready():
                    self.lighthouse_pending, self.lighthouse_down_t, self.lighthouse_failures = None, None, 0
                    self._lighthouse_event("up", restarted=True, launched_t=self.lighthouse_launched_t)
                    return
                if now < self.lighthouse_pending:
                    return
                error = f"did not listen within {LIGHTHOUSE_START_S:.0f} s"
            except RuntimeError as e:
                error = str(e)
            lh.stop()
            self.lighthouse_pending = None
            self.lighthouse_failures += 1
            if self.lighthouse_failures > LIGHTHOUSE_RETRIES:
                raise RuntimeError(f"lighthouse: {self.lighthouse_failures} restarts failed, the last: {error}")
            backoff = min(LIGHTHOUSE_BACKOFF_S * 2 ** (self.lighthouse_failures - 1), 10.0)
            self.lighthouse_next_try = now + backoff
            self.writer.emit(
                "warning",
                message=f"lighthouse restart {self.lighthouse_failures} failed ({error}); retrying in {backoff:.1f} s",
            )
            return
        if lh.alive():
            return
        if self.lighthouse_down_t is None:
            self.lighthouse_down_t = now
            self.lighthouse_next_try = now + self.spec.lighthouse.restart_delay_s
            self._lighthouse_event("down", returncode=lh.proc.returncode)
        if now < self.lighthouse_next_try:
            return
        self._write_lighthouse_epoch()
        lh.launch()
        self.lighthouse_launched_t = time.time()
        self.lighthouse_pending = now + LIGHTHOUSE_START_S

    def _lighthouse_event(self, state: str, **fields: Any) -> None:
        lh = self.lighthouse
        identity = procs.identity(lh.pid) if state == "up" else {"pid": lh.pid}
        self.writer.emit("lighthouse", state=state, address=lh.address, **identity, **fields)

    def _write_lighthouse_epoch(self) -> None:
        """Before each (re)start: see trainers/quorum_epochs.py for why replicas need it."""
        rundir.write_json_text(quorum_epochs.epoch_path(self.run_dir), str(self.lighthouse.starts))

    def _fire_schedule(self) -> None:
        """Fire due faults. ``at_s`` counts from the first committed step, so startup jitter
        does not shift a schedule between a run and its replay. A fault whose target is
        between attempts waits (up to 60 s) for the target's next process."""
        now = time.time()
        elapsed = now - self.t_first_step if self.t_first_step else -1.0
        for i, f in enumerate(self.spec.faults):
            if i in self.fired:
                continue
            due = (f.at_step is not None and self.max_step >= f.at_step) or (f.at_s is not None and elapsed >= f.at_s)
            if not due or now < self.deferred_until.get(i, 0.0):
                continue
            target = f.target if f.target is not None else len(self.slots) - 1
            try:
                faults.inject(self, f.action, target, origin="schedule", seconds=f.seconds, writer=self.writer)
            except faults.FaultError as e:
                first_try = self.deferred_until.setdefault(-1 - i, now)
                if now - first_try < 60:
                    self.deferred_until[i] = now + 0.5
                    continue
                self.writer.emit("warning", message=f"scheduled fault {i} not injected: {e}")
            self.fired.add(i)

    def _fire_triggers(self) -> None:
        """Armed faults whose trigger came (``workbench.faults.armed``): inject them now, then disarm."""
        while self.due_triggers:
            arm, trigger = self.due_triggers.pop(0)
            on = arm.get("trigger") or "checkpoint"
            try:
                faults.inject(
                    self,
                    arm["action"],
                    arm["target"],
                    origin=arm.get("origin") or "schedule",
                    writer=self.writer,
                    fire=True,
                    armed_t=arm.get("t"),
                    **{f"{on}_step": trigger.get("step")},
                )
            except faults.FaultError as e:
                self.writer.emit("warning", message=f"armed {arm['action']} not injected: {e}")
            finally:
                armed.disarm(self.run_dir, on, arm["target"])

    def hang_timeout_s(self) -> float:
        h = self.spec.hang
        if h.timeout_s is not None:
            return h.timeout_s
        if len(self.step_intervals) < 5:
            return max(h.min_timeout_s, 30.0)
        return max(h.min_timeout_s, 20 * float(sorted(self.step_intervals)[len(self.step_intervals) // 2]))

    def _detect_hangs(self) -> None:
        """A group that committed before and has made no step progress for the hang timeout is
        hung if its peers progressed meanwhile (if every group stopped, the run as a whole is
        stalled: no one group's hang). A group running alone (MaxText, ddp-restart, or the last
        one left) is hung only if it also stopped heartbeating: a compile, a checkpoint or a slow
        step keeps its heartbeat going, a stopped or frozen process does not.

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
        now = time.time()
        limit = self.hang_timeout_s()
        running = [s for s in self.slots.values() if s.state == "running" and s.committed_steps > 0]
        for slot in running:
            idle = now - slot.last_progress_t
            if idle < limit or slot.last_progress_t < slot.hang_reported_t:  # reported, no step since
                continue
            view = self.run_state.replicas[slot.replica]
            if len(running) > 1:
                if not any(p.last_progress_t > slot.last_progress_t for p in running if p is not slot):
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
            if self.spec.hang.action == "kill":
                try:
                    faults.inject(self, "kill", slot.replica, origin="watchdog", writer=self.writer)
                except faults.FaultError as e:
                    self.writer.emit("warning", message=f"hang action failed: {e}")

    def _shutdown(self) -> None:
        self._poll()
        # First: a frozen process takes no signal, not even SIGKILL, until it is thawed.
        undone = self.cluster.release_faults(self.run_state)
        if undone:
            self.writer.emit("warning", message=f"undone at stop: {', '.join(undone)}")
        for slot in self.slots.values():
            if slot.state in ("running",) and slot.job is not None and not self.cluster.is_done(slot.job):
                self._signal_attempt(slot, signal.SIGTERM)
        deadline = time.time() + 10
        for slot in self.slots.values():
            if slot.job is None:
                continue
            while not self.cluster.is_done(slot.job) and time.time() < deadline:
                time.sleep(POLL_S)
            if not self.cluster.is_done(slot.job):
                self._poll()  # it may have started since
                self._signal_attempt(slot, signal.SIGKILL)
                self.cluster.cancel(slot.job)
        for spare_id, job in self.spares.items():
            proc = self.run_state.spares.get(spare_id)
            if proc is not None:
                proc.signal(signal.SIGKILL)
            self.cluster.cancel(job)
        if self.lighthouse:
            self.lighthouse.stop()
            self._lighthouse_event("down")
        self.cluster.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m workbench.controller.loop RUN_DIR", file=sys.stderr)
        return 2
    os.umask(0o077)  # everything the run writes (submitit's pickles and logs too) is private to the user
    state = Controller(Path(argv[0])).run()
    return 0 if state in ("completed", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main())
