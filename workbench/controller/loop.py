"""The run controller: one detached process per run that keeps the run going.

``workbench.submit`` starts it (``python -m workbench.controller.loop RUN_DIR``) in
its own session, so the run outlives the notebook kernel that started it. It:

- starts the lighthouse (elastic trainers) and keeps it up: a lighthouse that
  dies is restarted on the same address, and the replicas' Managers reconnect
  (``lighthouse.LighthouseSupervisor``);
- submits one job per replica group through the cluster backend, and the hot
  spares (``spares.SparePool``);
- notices a job that ended without its trainer saying ``exit
  reason=completed``, and relaunches that replica group as the next attempt
  (``relaunch: auto``), up to ``max_restarts``: ``relaunch.RelaunchPolicy``
  decides, the loop carries it out;
- says when every group died with no live peer holding the model state, and resumes, restarts or fails
  the run (``total_loss.TotalLossWatch``);
- fires the spec's fault schedule and armed faults (``fault_schedule.FaultSchedule``);
- reports (and with ``hang.action: kill`` kills) a hung group (``watchdog.HangWatchdog``);
- samples node health (``nodehealth``) and writes the step index (``analysis.step_index``);
- on SIGTERM (``run.stop()``) stops every job and the lighthouse;
- ends the run the same way, ``run_root_unwritable``, when its own event log has taken no write for
  ``unwritable_timeout_s``, and says an end it cannot write somewhere a user finds it (``unwritable``);
- writes ``run_end`` with the final state when no replica group is left.

It learns everything about the jobs from the event log, like any other
reader: one reader, folded into the same ``RunState`` a ``Run`` keeps, which
names each group's current process for faults and stop. It writes its own
decisions to ``events/controller.jsonl``. Once one
group has completed the target step, a dead group is not relaunched (it would
find no live peer to heal from and train alone from scratch).
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from workbench.analysis import StepColumns, step_index
from workbench.cluster import make_cluster
from workbench.controller import job_end, nodehealth, unwritable
from workbench.controller.fault_schedule import FaultSchedule
from workbench.controller.lighthouse import Lighthouse, LighthouseSupervisor
from workbench.controller.relaunch import RelaunchPolicy
from workbench.controller.slots import ReplicaSlot
from workbench.controller.spares import SparePool
from workbench.controller.total_loss import TotalLossWatch
from workbench.controller.watchdog import HangWatchdog
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.models import Spec
from workbench.state.fold import RunState
from workbench.trainers import JobContext, job_entrypoint, trainer_kind

POLL_S = 0.1


class Controller:
    """The loop over the run's collaborators; also the run handle (``run_dir``, ``spec``, ``run_state``,
    ``cluster``) that the faults it fires are injected through."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        record = rundir.read_record(self.run_dir)
        self.run_id = self.id = record["run_id"]
        self.spec = Spec.model_validate(record["spec"])
        # Inherited by every process the run starts (lighthouse, fork server, submitit's and Slurm's jobs).
        os.environ["RUST_LOG"] = self.spec.torchft.rust_log
        self.writer = EventWriter(self.run_dir, "controller", run=self.run_id)
        self.unwritable = unwritable.UnwritableWatch(self.writer, self.run_dir, self.spec.unwritable_timeout_s)
        self.end_written = False
        self.health, self.health_at = nodehealth.Sampler(), 0.0
        self.reader = EventReader(self.run_dir)
        self.cluster = make_cluster(self.spec, self.run_dir)
        self.elastic = trainer_kind(self.spec.trainer).elastic
        self.lighthouse: Optional[LighthouseSupervisor] = None
        self.slots = {r: ReplicaSlot(r) for r in range(self.spec.replicas if self.elastic else 1)}
        self.run_state = RunState(self.spec.replicas, self.spec.steps)  # ranks of a one-job trainer too
        self.relaunch = RelaunchPolicy(self.spec)
        self.spares = SparePool(self.run_dir, limit=self.spec.spares + self.spec.max_restarts)
        self.watchdog = HangWatchdog(self.spec.hang, self.slots.values(), self.run_state, self.writer, run=self)
        self.faults = FaultSchedule(self.spec.faults, len(self.slots) - 1, self.writer, run=self)
        self.total_loss = TotalLossWatch(self.spec, self.slots, self.run_state, self.writer)
        self.exits: dict[tuple[int, int], dict] = {}
        self.max_step = 0
        self.stopping = False
        self.t0 = time.time()
        self.t_first_step: Optional[float] = None
        self.bad_events = 0
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
                self.lighthouse = LighthouseSupervisor(
                    Lighthouse(self.spec, self.run_dir / "lighthouse", self.cluster.lighthouse_host),
                    self.run_dir,
                    self.writer,
                )
                self.lighthouse.start()
            for slot in self.slots.values():
                self._launch(slot)
            for _ in range(self.spec.spares):
                self._launch_spare()
            state, reason = self._loop()
        except Exception as e:
            reason = f"controller error: {type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            self._shutdown()
            self.faults.warn_unfired(self.max_step)
            self._write_step_index()  # before run_end: a reader that sees the end finds the index complete
            reason = reason or (self.total_loss.end_reason if state == "completed" else "")
            self.writer.emit(
                "run_end", state=state, reason=reason, steps=self.max_step, **self.unwritable.end_fields(reason)
            )
            self.end_written = self.unwritable.finish(state, reason, stopping=lambda: self.stopping)
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
            if self.unwritable.expired(time.time()):
                return "failed", unwritable.REASON
            if self.lighthouse:
                self.lighthouse.supervise()
            self.faults.fire(self.max_step, self.t_first_step)
            self.watchdog.check()
            now = time.time()
            if now >= self.index_at:
                self._write_step_index()
            if now >= self.health_at:
                self.health_at = now + nodehealth.PERIOD_S
                for row in self.health.sample(nodehealth.nodes_of(self.run_state), now):
                    self.writer.emit("node_health", **row)
            for spare_id in self.spares.ended(self.cluster.is_done):
                self.writer.emit("warning", message=f"spare {spare_id} ended before it was used")
                if self.spares.may_replace():
                    self._launch_spare()
            for slot in self.slots.values():
                if slot.state == "running" and self.cluster.is_done(slot.job):
                    self._poll()
                    self._job_ended(slot)
                elif slot.state == "relaunch_wait" and now >= slot.relaunch_at:
                    self._launch(slot)
            if self.total_loss.failed:
                return "failed", self.total_loss.end_reason
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
    def _context(self, replica: int, attempt: int, spare_id: Optional[int] = None) -> JobContext:
        env = {"PYTHONUNBUFFERED": "1"}
        if self.lighthouse:
            env["TORCHFT_LIGHTHOUSE"] = self.lighthouse.address
            env["TORCHFT_QUORUM_RETRIES"] = str(self.spec.torchft.quorum_retries)
        return JobContext(
            run_dir=str(self.run_dir),
            run_id=self.run_id,
            spec=self.spec.to_dict(),
            replica=replica,
            attempt=attempt,
            lighthouse_addr=self.lighthouse.address if self.lighthouse else None,
            env=env,
            loopback_only=self.cluster.loopback_only,
            spare_id=spare_id,
        )

    def _launch(self, slot: ReplicaSlot) -> None:
        slot.begin_attempt()
        self.total_loss.launched(slot.replica, slot.attempt)
        ctx = self._context(slot.replica, slot.attempt)
        slot.job = self.cluster.submit(job_entrypoint, ctx, name=f"{self.spec.name}-r{slot.replica}")
        slot.state = "running"
        self.writer.emit("submit", replica=slot.replica, attempt=slot.attempt, job_id=str(slot.job.job_id))

    def _launch_spare(self) -> None:
        """A checkpoint-restart trainer's spare is the run's next job: it takes whole nodes (``--exclusive`` on
        Slurm), or a node's fault would end it with the job it is to replace (seen on the dev cluster, whose
        nodes have 4 CPUs: MaxText's spare shared both of the job's nodes and was cancelled with it)."""
        spare_id = self.spares.new_id()
        ctx = self._context(-1, -1, spare_id=spare_id)
        job = self.cluster.submit(
            job_entrypoint, ctx, name=f"{self.spec.name}-spare{spare_id}", whole_nodes=not self.elastic
        )
        self.spares.add(spare_id, job)
        self.writer.emit("submit", spare=spare_id, job_id=str(job.job_id))

    def _job_ended(self, slot: ReplicaSlot) -> None:
        """Record how the attempt ended, then carry out the relaunch policy's decision."""
        exit_event = self.exits.get((slot.replica, slot.attempt))
        self.writer.emit(
            "job",
            replica=slot.replica,
            attempt=slot.attempt,
            job_id=str(slot.job.job_id),
            state="ended",
            clean=bool(exit_event and exit_event.get("reason") == "completed"),
            reason=(exit_event or {}).get("reason", "died"),
            **job_end.gathered(self, slot, exit_event),
        )
        if self.total_loss.ended(slot.replica, exit_event, self.slots.values(), stopping=self.stopping):
            slot.state = "failed"  # the state is lost and the spec says fail: the run ends (total_loss)
            return
        decision = self.relaunch.decide(
            slot,
            exit_event,
            stopping=self.stopping,
            peer_completed=any(s.state == "completed" for s in self.slots.values()),
            spares_ready=self.spares.ready,
            now=time.time(),
        )
        if decision.restarts:
            slot.restarts += 1
        if decision.spare is not None:
            self._assign_spare(slot, decision.spare, decision.reason)
            return
        slot.state = decision.state
        if decision.state == "relaunch_wait":
            slot.relaunch_at = decision.at
            self.writer.emit(
                "restart",
                replica=slot.replica,
                attempt=slot.attempt + 1,
                reason=decision.reason,
                from_step=self.max_step,
            )

    def _assign_spare(self, slot: ReplicaSlot, spare_id: int, reason: str) -> None:
        """The ready spare ``spare_id`` becomes the group's next attempt at once; another spare takes its place."""
        job = self.spares.take(spare_id)
        slot.begin_attempt()
        self.total_loss.launched(slot.replica, slot.attempt)
        slot.job = job
        slot.state = "running"
        self.spares.assign(spare_id, slot.replica, slot.attempt)
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

    def _signal_attempt(self, slot: ReplicaSlot, sig: int) -> None:
        proc = self.run_state.replicas[slot.replica].live_proc(slot.attempt)
        if proc is not None and not proc.signal(sig, self.cluster.marker):
            self._not_signalled(proc, f"replica {slot.replica}, attempt {slot.attempt}")

    def _not_signalled(self, proc, what: str) -> None:
        """A warning for a live process of the run that did not prove it is the run's (``workbench.cluster.procs``)."""
        why = proc.why_not_ours(self.cluster.marker)
        if why is not None and "exited" not in why:
            self.writer.emit("warning", message=f"{what}: {why}; not signalled")

    # -- events --------------------------------------------------------------
    def _poll(self) -> None:
        self._observe(self.run_state.apply(self.reader.poll()))

    def _observe(self, events: list[dict]) -> None:
        for e in events:
            try:
                self._observe_one(e)
            except (TypeError, ValueError, KeyError):  # a malformed line must not stop the run
                self.bad_events += 1

    def _observe_one(self, e: dict) -> None:
        kind = e.get("kind")
        r = e.get("replica")
        self.faults.observe(e)
        self.spares.observe(e)
        self.total_loss.observe(e)
        if kind == "exit" and r is not None and e.get("role") is None:
            self.exits[(r, e.get("attempt", 0))] = e
        elif kind == "step" and r in self.slots:
            slot = self.slots[r]
            step = e.get("step", 0)
            if not isinstance(step, int):
                raise ValueError(f"step {step!r}")
            if e.get("attempt") == slot.attempt and e.get("committed"):
                self.watchdog.observe_commit(slot, e)
                slot.committed_steps += 1
                slot.last_step = step
                slot.last_progress_t = e["t"]
                self.max_step = max(self.max_step, step)
                if self.t_first_step is None:
                    self.t_first_step = e["t"]

    def _shutdown(self) -> None:
        self._poll()
        # First: a frozen process takes no signal, not even SIGKILL, until it is thawed.
        undone = self.cluster.release_faults(self.run_state)
        if undone:
            self.writer.emit("warning", message=f"undone at stop: {', '.join(undone)}")
        for helper in self.cluster.undo_helpers(self.run_state):
            self._not_signalled(helper, "a fault's undo helper")
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
        for spare_id, job in self.spares.jobs.items():
            proc = self.run_state.spares.get(spare_id)
            if proc is not None and not proc.signal(signal.SIGKILL, self.cluster.marker):
                self._not_signalled(proc, f"spare {spare_id}")
            self.cluster.cancel(job)
        if self.lighthouse:
            self.lighthouse.stop()
        self.cluster.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m workbench.controller.loop RUN_DIR", file=sys.stderr)
        return 2
    os.umask(0o077)  # everything the run writes (submitit's pickles and logs too) is private to the user
    controller = Controller(Path(argv[0]))
    state = controller.run()
    return 0 if state in ("completed", "stopped") and controller.end_written else 1


if __name__ == "__main__":
    sys.exit(main())
