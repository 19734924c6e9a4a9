"""Control stays trustworthy when parts of a run break: a dead controller, malformed event lines."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

import workbench as wb
from workbench.run import ControllerGone

from .conftest import workbench_cli


def small(run_root, **kw):
    return {"faults": [], "replicas": 2, "min_replicas": 1, "run_root": str(run_root), **kw}


def test_a_dead_controller_is_reported_and_stop_still_ends_every_process(start_run, run_root):
    run = start_run("demo", small(run_root, steps=100000, **{"model.step_delay_s": 0.02}))
    run.wait_for_step(5, timeout=180)
    ctl, lighthouse = run.run_state.controller, run.run_state.lighthouse
    assert ctl is not None and lighthouse is not None and lighthouse.alive()
    os.kill(ctl.pid, signal.SIGKILL)  # the OOM killer, say
    t_killed = time.monotonic()
    run.wait_for(lambda r: r.state() == "lost", timeout=10)
    assert time.monotonic() - t_killed < 5
    assert "has exited" in run.status()["controller"]
    with pytest.raises(ControllerGone, match="controller pid .* has exited"):
        run.wait(timeout=10)
    cli = workbench_cli("wait", str(run.run_dir), timeout=60)
    assert cli.returncode == 2 and "controller pid" in cli.stderr and "workbench stop" in cli.stderr
    assert len(run.pids()) >= 3  # the jobs and the lighthouse outlive their controller
    assert run.stop(timeout=5)["state"] == "stopped"
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
