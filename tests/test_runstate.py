"""The run-state fold and process identity, on event logs written by a real EventWriter.

The processes a test signals are `sleep` processes it starts itself and stops by PID.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import workbench as wb
from workbench.cluster import procs
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec
from workbench.state.fold import RunState


@pytest.fixture
def sleeper():
    started = []

    def start(run_dir=None):
        """A ``sleep``; with ``run_dir``, started as the run starts its processes: with its marker."""
        env = {**os.environ, **procs.Marker.of(run_dir).env()} if run_dir is not None else None
        p = subprocess.Popen(["sleep", "300"], env=env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def make_run(tmp_path, **overrides):
    spec = load_spec("demo", {"replicas": 3, "faults": [], **overrides})
    return rundir.create(tmp_path / "runs", "r1", spec.to_dict())


def test_fold_follows_a_group_through_kill_relaunch_and_heal(tmp_path):
    run_dir = make_run(tmp_path)
    ctl = EventWriter(run_dir, "controller", run="r1")
    ctl.emit("start", role="controller")
    ctl.emit("submit", replica=1, attempt=0, job_id="11")
    a0 = EventWriter(run_dir, "replica-1.attempt-0", run="r1", replica=1, attempt=0)
    a0.emit("start", node="n1")
    a0.emit("step", step=1, loss=4.0, committed=True, participating=True)
    a0.emit("step", step=2, loss=3.5, committed=True, participating=True)
    EventWriter(run_dir, "control-1", run="r1").emit("fault", action="kill", target=1, origin="api")
    a0.emit("heartbeat", step=2)  # a late line of the killed attempt: ignored
    ctl.emit("job", replica=1, attempt=0, job_id="11", state="ended", clean=False)
    ctl.emit("restart", replica=1, attempt=1, reason="died")
    ctl.emit("submit", replica=1, attempt=1, job_id="12")
    state = RunState(3, 100)
    state.apply(EventReader(run_dir).poll())
    v = state.replicas[1]
    assert (v.state, v.attempt, v.committed_step, v.loss) == ("dead", 0, 2, 3.5)
    assert v.current_job() == (1, "12") and v.live_proc() is None
    a1 = EventWriter(run_dir, "replica-1.attempt-1", run="r1", replica=1, attempt=1)
    a1.emit("start", node="n2")
    reader_state = RunState(3, 100)
    reader_state.apply(EventReader(run_dir).poll())
    v = reader_state.replicas[1]
    assert (v.state, v.attempt, v.node, v.job_id, v.restarts) == ("starting", 1, "n2", "12", 1)
    a1.emit("heal", step=2, seconds=0.1, bytes=1000)
    a1.emit("step", step=3, loss=3.4, committed=True, participating=False)
    a1.emit("step", step=4, loss=3.3, committed=True, participating=True)
    reader_state = RunState(3, 100)
    reader_state.apply(EventReader(run_dir).poll())
    v = reader_state.replicas[1]
    assert (v.state, v.committed_step) == ("participating", 4)
    assert reader_state.counts() == {"faults": 1, "restarts": 1, "heals": 1}
    assert reader_state.state == "running"


@pytest.mark.parametrize("order", ["as written", "the restore read first"])
def test_a_total_loss_resumes_from_what_the_groups_loaded_not_from_what_the_log_recorded(tmp_path, order):
    """Seen in a real run: a group killed after its snapshot of step 60 was renamed into place and before its
    ``checkpoint`` event was written. The controller's ``state_lost`` names step 40 (the newest it read); the
    relaunched groups load 60. The fold, the end and the summary say 60: what the run really resumed from."""
    run_dir = make_run(tmp_path, replicas=2)
    ctl = EventWriter(run_dir, "controller", run="r1")
    ctl.emit("start", role="controller")
    a0 = EventWriter(run_dir, "replica-0.attempt-0", run="r1", replica=0, attempt=0)
    a0.emit("checkpoint", step=40, durable=True, path=None)
    a0.emit("step", step=59, loss=2.0, committed=True, participating=True)
    ctl.emit("restart", replica=0, attempt=1, reason="died")
    ctl.emit("state_lost", step=59, action="resume", resumed_from=40, source="snapshot")
    a1 = EventWriter(run_dir, "replica-0.attempt-1", run="r1", replica=0, attempt=1)
    a1.emit("start", node="n1")
    a1.emit("phase", phase="restored", from_step=60, path="snapshots/replica-1.pt")
    events = EventReader(run_dir).poll()
    if order == "the restore read first":  # another file's line can reach the fold first
        events.sort(key=lambda e: e["kind"] != "phase")
    state = RunState(2, 100)
    for e in events:
        state.apply([e])
    assert (state.state_lost["resumed_from"], state.state_lost["recorded_from"]) == (60, 40), state.state_lost
    ctl.emit("run_end", state="completed", reason="state_lost")
    end = RunState(2, 100)
    end.apply(EventReader(run_dir).poll())
    assert "resumed from the snapshot of step 60: no committed step lost" in end.end_reason, end.end_reason
    summary = wb.Run(run_dir).summary()["state_lost"]
    assert (summary["resumed_from"], summary["recorded_from"], summary["step"]) == (60, 40, 59), summary


def test_a_spares_takeover_names_the_groups_job(tmp_path):
    """On Slurm a spare's takeover is a `restart` with the spare's job id, not a `submit`."""
    run_dir = make_run(tmp_path)
    ctl = EventWriter(run_dir, "controller", run="r1")
    ctl.emit("submit", replica=2, attempt=0, job_id="20")
    ctl.emit("submit", spare=0, job_id="30")
    ctl.emit("job", replica=2, attempt=0, job_id="20", state="ended", clean=False)
    ctl.emit("restart", replica=2, attempt=1, reason="died", spare=0, job_id="30")
    state = RunState(3)
    state.apply(EventReader(run_dir).poll())
    assert state.replicas[2].current_job() == (1, "30")


def test_a_spare_on_two_nodes_is_known_by_its_job_not_by_its_other_nodes_task(tmp_path):
    """Every task of a spare writes as the spare (``spare``, no ``replica``); the process the run records for
    it is task 0's, the job's own, whichever task's ``start`` comes last."""
    run_dir = make_run(tmp_path)
    task0 = EventWriter(run_dir, "spare-0", run="r1", replica=None, spare=0, host="n1")
    task1 = EventWriter(run_dir, "spare-0.task-1", run="r1", replica=None, spare=0, host="n2")
    task0.emit("start", role="spare", task=0, pid=4100, pid_start=10.0)
    task1.emit("start", role="task", task=1, pid=4200, pid_start=11.0)
    state = RunState(3)
    state.apply(EventReader(run_dir).poll())
    assert [(p.pid, p.host) for p in state.processes()] == [(4100, "n1")]


def test_a_reused_pid_is_never_signalled(tmp_path, sleeper):
    """The recorded PID now belongs to another process (its start time differs): the kill is
    refused with the reason, and that process lives on, even though it carries the run's marker."""
    run_dir = make_run(tmp_path)
    stranger = sleeper(run_dir)
    ident = procs.identity(stranger.pid)
    w = EventWriter(run_dir, "replica-1.attempt-0", run="r1", replica=1, attempt=0)
    w.emit("start", pid=stranger.pid, pid_start=ident["pid_start"] - 3600.0)
    run = wb.attach(run_dir)
    with pytest.raises(wb.FaultError, match="is now another process"):
        run.kill(replica=1)
    assert stranger.poll() is None


def test_a_pid_recorded_without_start_time_is_not_signalled(tmp_path, sleeper):
    run_dir = make_run(tmp_path)
    stranger = sleeper(run_dir)
    EventWriter(run_dir, "replica-1.attempt-0", run="r1", replica=1, attempt=0).emit(
        "start", pid=stranger.pid, pid_start=None
    )
    with pytest.raises(wb.FaultError, match="without its start time"):
        wb.attach(run_dir).kill(replica=1)
    assert stranger.poll() is None


def test_stop_without_a_controller_kills_the_runs_processes_and_spares_strangers(tmp_path, sleeper):
    run_dir = make_run(tmp_path)
    ours, stranger = sleeper(run_dir), sleeper()
    EventWriter(run_dir, "replica-0.attempt-0", run="r1", replica=0, attempt=0).emit(
        "start", **procs.identity(ours.pid)
    )
    EventWriter(run_dir, "replica-1.attempt-0", run="r1", replica=1, attempt=0).emit(
        "start", pid=stranger.pid, pid_start=procs.start_time(stranger.pid) + 100.0
    )
    status = wb.attach(run_dir).stop(timeout=5)
    assert status["state"] == "stopped"
    assert ours.wait(timeout=10) == -9
    assert stranger.poll() is None


def test_a_run_recorded_with_wall_clock_start_times_is_still_stopped(tmp_path, sleeper):
    """A workbench before 2026-12-03 recorded psutil's ``create_time`` (wall clock: boot time in whole
    seconds, which a clock adjustment moves by one). Its runs' processes, read one second off after such
    a move, are still its own: stop kills them; a stranger a minute off is spared."""
    import psutil

    run_dir = make_run(tmp_path)
    ours, moved, stranger = sleeper(run_dir), sleeper(run_dir), sleeper()
    for replica, proc, off in ((0, ours, 0.0), (1, moved, -1.0), (2, stranger, 60.0)):
        EventWriter(run_dir, f"replica-{replica}.attempt-0", run="r1", replica=replica, attempt=0).emit(
            "start", pid=proc.pid, pid_start=round(psutil.Process(proc.pid).create_time() + off, 3)
        )
    assert wb.attach(run_dir).stop(timeout=5)["state"] == "stopped"
    assert ours.wait(timeout=10) == -9 and moved.wait(timeout=10) == -9
    assert stranger.poll() is None


@pytest.mark.parametrize("how, signal_number", [("kill", 9), ("abort", 6), ("preempt", 15)])
def test_the_kill_signals_the_recorded_process(tmp_path, sleeper, how, signal_number):
    """Each fault kind that ends a process ends the recorded one with its signal: SIGKILL, SIGABRT
    (what a failed CUDA device assertion does), SIGTERM (a preemption notice)."""
    run_dir = make_run(tmp_path)
    ours = sleeper(run_dir)
    EventWriter(run_dir, "replica-2.attempt-0", run="r1", replica=2, attempt=0).emit(
        "start", **procs.identity(ours.pid)
    )
    event = wb.attach(run_dir).kill(replica=2, how=how)
    assert (event["action"], event["target"], event["pid"]) == (how, 2, ours.pid)
    assert ours.wait(timeout=10) == -signal_number
