"""Hot spares: a pre-started process takes over a killed replica group, and is replaced."""

import pytest

from workbench import analysis

pytestmark = pytest.mark.slow


def test_a_hot_spare_replaces_a_killed_group_heals_and_is_replaced(start_run):
    run = start_run("demo", {"faults": [], "spares": 1, "steps": 100000, "model.step_delay_s": 0.01})
    run.wait_for(lambda r: any(e["kind"] == "phase" and e.get("phase") == "spare_ready" for e in r._events), 240)
    run.wait_for_step(50, timeout=120)
    fault = run.kill(replica=1)
    run.wait_for(lambda r: any(e["kind"] == "step" and e["replica"] == 1 and e["attempt"] == 1
                               and e.get("participating") and e.get("committed") for e in r._events), 120)
    events = run.event_records()
    restart = next(e for e in events if e["kind"] == "restart" and e["replica"] == 1)
    assert restart["spare"] == 0
    start = next(e for e in events if e["kind"] == "start" and e.get("replica") == 1 and e["attempt"] == 1)
    assert start["from_spare"] == 0 and start["pid"] != fault["pid"]
    assert any(e["kind"] == "heal" and e["replica"] == 1 and e["attempt"] == 1 for e in events)
    assert analysis.recovery_timeline(events)["participating"].iloc[0] < 10
    # The used spare is replaced in the background.
    run.wait_for(lambda r: any(e["kind"] == "phase" and e.get("phase") == "spare_ready" and e.get("spare") == 1
                               for e in r._events), 240)
    run.stop()
    assert run.pids() == []
