"""The fault kind `abort` (SIGABRT: what a failed CUDA device assertion does to a rank), added as one
row of the fault table: scheduled, injected from the CLI, offered by the dashboard, replayed, and
recovered from like a kill, on a real local run."""

import json

import pytest

from workbench import analysis
from workbench.run.replay import replay_spec
from workbench.widgets import Dashboard

from .conftest import workbench_cli

pytestmark = pytest.mark.slow


def test_abort_is_a_fault_kind_everywhere_and_a_run_recovers_from_it(start_run, run_root):
    # That it is SIGABRT: tests/test_runstate.py, on a process of its own.
    assert "abort" in workbench_cli("kill", "--help").stdout
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
    run.wait_for(lambda r: any(e["kind"] == "heal" and e.get("replica") == 1 for e in r.events_read), timeout=240)
    cli = workbench_cli("kill", str(run.run_dir), "--replica", "2", "--how", "abort")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["action"] == "abort"
    status = run.wait(timeout=300)
    assert status["state"] == "completed" and status["step"] == 500
    events = run.event_records()
    died = {e["replica"] for e in events if e["kind"] == "job" and not e.get("clean") and e["attempt"] == 0}
    assert died == {1, 2}  # each aborted process ended, and its group came back as attempt 1
    timeline = analysis.recovery_timeline(events)
    assert list(timeline["action"]) == ["abort", "abort"] and timeline["complete"].all(), timeline.to_string()
    spec, added = replay_spec(run)
    assert [f["action"] for f in spec["faults"]] == ["abort", "abort"] and added == [
        {"action": "abort", "at_step": added[0]["at_step"], "target": 2}
    ]
