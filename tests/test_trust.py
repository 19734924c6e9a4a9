"""Control stays trustworthy when parts of a run break: a dead controller, malformed event lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pandas as pd
import pytest

from workbench.errors import ControllerGone

from .conftest import workbench_cli


def small(run_root, **kw):
    return {"faults": [], "replicas": 2, "min_replicas": 1, "run_root": str(run_root), **kw}


def test_a_dead_controller_is_reported_and_stop_still_ends_every_process(start_run, run_root):
    run = start_run("demo", small(run_root, steps=100000, **{"model.step_delay_s": 0.02}))
    run.wait_for_step(5, timeout=180)
    ctl, lighthouse = run.run_state.controller, run.run_state.lighthouse
    assert ctl is not None and lighthouse is not None and lighthouse.alive()
    os.kill(ctl.pid, signal.SIGKILL)  # the OOM killer, say
    run.wait_for(lambda r: r.state() == "lost", timeout=30)
    assert "has exited" in run.status()["controller"]
    with pytest.raises(ControllerGone, match="controller pid .* has exited"):
        run.wait(timeout=10)
    cli = workbench_cli("wait", str(run.run_dir), timeout=60)
    assert cli.returncode == 2 and "controller pid" in cli.stderr and "workbench stop" in cli.stderr
    assert len(run.pids()) >= 3  # the jobs and the lighthouse outlive their controller
    stopped = run.stop(timeout=5)
    assert stopped["state"] == "stopped" and stopped["not_stopped"] == []  # each process proved it is the run's
    run.wait_for(lambda r: not r.pids(), timeout=15)
    assert not lighthouse.alive()


def test_malformed_event_lines_are_counted_and_the_run_goes_on(start_run, run_root):
    run = start_run("demo", small(run_root, steps=300, **{"model.step_delay_s": 0.01}))
    run.wait_for_step(5, timeout=180)
    bad = [
        {"t": "noon", "kind": "step", "replica": 0, "attempt": 0, "step": 7, "committed": True},
        {"t": time.time(), "kind": "step", "replica": 0, "attempt": 0, "step": "seven", "committed": True},
        {"t": time.time(), "kind": "fault", "action": ["kill"], "target": {"r": 1}},
    ]
    path = run.run_dir / "events" / "stray-writer.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in bad) + "not json at all\n")
    status = run.wait(timeout=300)
    assert status["state"] == "completed" and status["step"] == 300
    assert status["bad_lines"] >= 3
    controller_log = (run.run_dir / "controller.log").read_text()
    assert "Traceback" not in controller_log, controller_log


def test_a_lone_group_that_is_slow_but_alive_is_not_a_hang_and_a_stopped_one_is(start_run, run_root):
    """One replica group (as MaxText or ddp-restart run): a step slower than the hang timeout
    (a compile, a checkpoint) keeps heartbeating and is no hang; SIGSTOP stops the heartbeat."""
    run = start_run(
        "demo",
        {
            "faults": [],
            "replicas": 1,
            "min_replicas": 1,
            "steps": 40,
            "heartbeat_s": 0.3,
            "hang.timeout_s": 1.0,
            "model.step_delay_s": 2.0,
            "run_root": str(run_root),
        },
    )
    run.wait_for_step(3, timeout=180)
    hangs = [e for e in run.events_read if e["kind"] == "hang"]
    assert hangs == [], hangs  # three 2 s steps with a 1 s timeout: no false alarm
    fault = run.kill(replica=0, how="hang", seconds=4)
    run.wait_for(lambda r: any(e["kind"] == "hang" for e in r.events_read), timeout=10)
    hang = next(e for e in run.events_read if e["kind"] == "hang")
    last_sign = max(
        e["t"]
        for e in run.events_read
        if e.get("replica") == 0 and e["t"] <= fault["t"] and e["kind"] in ("heartbeat", "step")
    )
    # Reported past the timeout and while the group is stopped (it runs again at its ``resume``, 4 s on). How
    # soon after the timeout is a speed figure: ``hang_reported_s`` of ``python -m bench.netfaults``.
    resumed = run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == "hang" for e in r.events_read), timeout=30
    )
    resume = next(e for e in resumed.events_read if e["kind"] == "fault" and e.get("resumed") == "hang")
    assert hang["t"] - last_sign >= 1.0 and fault["t"] < hang["t"] < resume["t"], (fault, hang, resume)
    run.stop()


@contextlib.contextmanager
def hand_run(tmp_path, **overrides):
    """A run directory with a controller over it and two groups' event writers, written by the test (no
    process is started): the watchdog's decisions over steps the test stamps."""
    from workbench.controller.loop import Controller
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    spec = load_spec("demo", {"faults": [], "replicas": 2, "min_replicas": 1, **overrides})
    run_dir = rundir.create(tmp_path, "20250101-000000-hand-abcdef", spec.to_dict())
    groups = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="r", replica=r, attempt=0) for r in (0, 1)]
    controller = Controller(run_dir)
    try:
        for slot in controller.slots.values():
            slot.state, slot.attempt = "running", 0
        yield controller, groups
    finally:
        controller.writer.close()
        for w in groups:
            w.close()


def hangs_after_a_check(controller) -> list[tuple[int, int]]:
    from workbench.events.reader import read_all

    controller._poll()
    controller.watchdog.check()
    return [(e["target"], e["step"]) for e in read_all(controller.run_dir) if e["kind"] == "hang"]


def committed_steps(group, steps, now: float, late: float = 0.0) -> None:
    """``group``'s committed steps, stamped 0.2 s apart from ``now - 8`` (``late`` s later each)."""
    for step in steps:
        group.emit("step", t=now - 8 + step * 0.2 + late, step=step, committed=True, participating=True)


def test_a_step_written_late_by_a_stopped_group_does_not_report_its_hang_twice(tmp_path):
    """SIGSTOP can land between a trainer stamping a step event and writing it: the step arrives when
    the group runs again, stamped before its hang was reported. That is no progress since the report,
    so the hang stays reported once; a step stamped after the report is, and clears it."""
    from workbench.events.reader import read_all

    with hand_run(tmp_path, **{"hang.timeout_s": 1.5}) as (controller, groups):
        now = time.time()
        committed_steps(groups[1], range(1, 14), now)
        committed_steps(groups[0], range(1, 40), now)
        assert hangs_after_a_check(controller) == [(1, 13)]
        committed_steps(groups[1], [14], now)
        assert hangs_after_a_check(controller) == [(1, 13)]
        resumed = groups[1].emit("step", step=15, committed=True, participating=True)
        groups[0].emit("step", step=40, committed=True, participating=True)
        assert hangs_after_a_check(controller) == [(1, 13)]
        deadline = time.monotonic() + 10  # the next stall, 1.5 s on, is a hang of its own
        while len(hangs_after_a_check(controller)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        (second,) = [e for e in read_all(controller.run_dir) if e["kind"] == "hang"][1:]
        assert (second["target"], second["step"]) == (1, 15) and second["t"] - resumed["t"] >= 1.5


def test_a_group_waiting_at_the_step_its_frozen_peer_committed_last_is_not_the_hung_one(tmp_path):
    """A peer frozen inside an all-reduce leaves the other group waiting out the process group's timeout
    at the step both committed last, the frozen one a few ms after it. Neither is hung while both stand
    at that step (the later stamp is no progress); once the waiting group steps on alone, the frozen one is."""
    with hand_run(tmp_path, **{"hang.timeout_s": 1.5}) as (controller, groups):
        now = time.time()
        committed_steps(groups[0], range(1, 21), now)
        committed_steps(groups[1], range(1, 21), now, late=0.002)
        assert hangs_after_a_check(controller) == []
        groups[0].emit("step", step=21, committed=True, participating=True)
        assert hangs_after_a_check(controller) == [(1, 20)]


def test_a_hung_group_that_steps_again_before_its_kill_is_not_killed(tmp_path):
    """``hang.action: kill`` waits for the hung group's stacks first (~0.5 s); a group that committed a step
    meanwhile was slow, not hung, and is left running, and the run says why it was not killed."""
    from workbench.events.reader import read_all

    with hand_run(tmp_path, **{"hang.timeout_s": 1.5, "hang.action": "kill"}) as (controller, groups):
        now = time.time()
        committed_steps(groups[1], range(1, 14), now)
        committed_steps(groups[0], range(1, 40), now)
        assert hangs_after_a_check(controller) == [(1, 13)]
        groups[1].emit("step", step=14, committed=True, participating=True)
        controller._poll()
        sampler, _, _ = controller.watchdog.kills[1]
        sampler.join(timeout=30)
        controller.watchdog.check()
        assert 1 not in controller.watchdog.kills
        events = read_all(controller.run_dir)
        assert not [e for e in events if e["kind"] == "fault" or "hang action failed" in e.get("message", "")]
        assert [e["message"] for e in events if e["kind"] == "warning"] == [
            "replica 1 stepped again after its hang report: not killed"
        ]


def test_a_diverged_run_reports_nan_and_where_it_diverged(tmp_path):
    """A diverged point of a comparison must not report a finite final loss from its earlier steps."""
    from workbench.analysis import compare
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.run.handle import attach
    from workbench.spec.load import load_spec

    dirs = []
    for name, losses in (("fine", [3.0, 2.0, 1.5, 1.2]), ("diverged", [3.0, 2.0, float("nan"), float("nan")])):
        run_dir = rundir.create(
            tmp_path / "runs", name, load_spec("demo", {"faults": [], "replicas": 1, "min_replicas": 1}).to_dict()
        )
        w = EventWriter(run_dir, "replica-0.attempt-0", run=name, replica=0, attempt=0)
        for step, loss in enumerate(losses, start=1):
            w.emit("step", step=step, loss=loss, committed=True, participating=True)
        dirs.append(run_dir)
    df = compare.table([attach(d) for d in dirs], labels=["fine", "diverged"]).set_index("label")
    assert df.loc["fine", "final_loss"] == 1.2 and pd.isna(df.loc["fine", "diverged_at"])
    assert pd.isna(df.loc["diverged", "final_loss"]) and df.loc["diverged", "diverged_at"] == 3
