"""The fault kind `abort` (SIGABRT: what a failed CUDA device assertion does to a rank), added as one
row of the fault table: scheduled, injected from the CLI, offered by the dashboard, replayed, and
recovered from like a kill, on a real local run."""

import json

import pytest

from workbench import analysis
from workbench.cluster import procs
from workbench.run.replay import replay_spec
from workbench.widgets import Dashboard

from .conftest import workbench_cli

pytestmark = pytest.mark.slow


def test_abort_is_a_fault_kind_everywhere_and_a_run_recovers_from_it(start_run, run_root):
    # That it is SIGABRT: tests/test_runstate.py, on a process of its own. Here: what it does to a run.
    run = start_run(
        "demo",
        {
            "steps": 500,
            "min_replicas": 1,
            "run_root": str(run_root),
            "faults": [{"action": "abort", "target": 1, "at_step": 60}],
        },
    )
    assert "abort" in Dashboard(run, start=False).action_picker.options
    # The scheduled abort's group is back: its next attempt healed (not a late group's start-up heal of attempt 0).
    run.wait_for(
        lambda r: any(e["kind"] == "heal" and e.get("replica") == 1 and e.get("attempt") == 1 for e in r.events_read),
        timeout=240,
    )
    cli = workbench_cli("kill", str(run.run_dir), "--replica", "2", "--how", "abort")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["action"] == "abort"
    status = run.wait(timeout=300)
    assert status["state"] == "completed" and status["step"] == 500
    events = run.event_records()
    died = {e["replica"] for e in events if e["kind"] == "job" and not e.get("clean") and e["attempt"] == 0}
    assert died == {1, 2}  # each aborted process ended, and its group came back as attempt 1
    starts = {(e["replica"], e["attempt"]): e for e in events if e["kind"] == "start" and e.get("replica") is not None}
    aborts = [e for e in events if e["kind"] == "fault" and e["action"] == "abort"]
    assert [(e["target"], e["origin"]) for e in aborts] == [(1, "schedule"), (2, "cli")]
    for fault in aborts:
        # It hit the group's process of the time, which is gone: no process has its PID and start time.
        victim = starts[(fault["target"], 0)]
        assert fault["pid"] == victim["pid"]
        assert procs.start_time(victim["pid"]) != victim["pid_start"]
        ended = next(e for e in events if e["kind"] == "job" and e["replica"] == fault["target"] and e["attempt"] == 0)
        assert fault["t"] < ended["t"] < starts[(fault["target"], 1)]["t"], (fault, ended)
        # ... and the next attempt healed from a live peer and took part again.
        heal = next(e for e in events if e["kind"] == "heal" and e["replica"] == fault["target"] and e["attempt"] == 1)
        assert heal["t"] > fault["t"] and heal["bytes"] > 0
        assert any(
            e["kind"] == "step"
            and (e["replica"], e["attempt"]) == (fault["target"], 1)
            and e.get("committed")
            and e.get("participating")
            for e in events
        )
    # The group nobody aborted ran one process throughout and lost no committed step.
    assert [a for (r, a) in starts if r == 0] == [0]
    steps = [e["step"] for e in events if e["kind"] == "step" and e["replica"] == 0 and e.get("committed")]
    assert steps == sorted(set(steps)) and steps[-1] == 500
    timeline = analysis.recovery_timeline(events)
    assert list(timeline["action"]) == ["abort", "abort"] and timeline["complete"].all(), timeline.to_string()
    spec, added = replay_spec(run)
    assert [f["action"] for f in spec["faults"]] == ["abort", "abort"] and added == [
        {"action": "abort", "at_step": added[0]["at_step"], "target": 2}
    ]
