"""Every recovery measured: chaos runs, the recovery timeline, goodput, hang detection."""

import pytest

from workbench import analysis
from workbench.experiments.soak import unexplained_crashes

pytestmark = pytest.mark.slow


def test_chaos_run_with_random_kills_and_hangs_reaches_its_target(start_run):
    chaos = {
        "mtbf_s": 3.5,
        "seed": 11,
        "actions": ["kill", "hang"],
        "max_faults": 10,
        "start_s": 2.0,
        "hang_seconds": 2.0,
    }
    # The faults are drawn in seconds (the last at 26.8 s), the run's length is in steps: 1300 steps of at
    # least 0.03 s outlast the last fault and its recovery however fast the steps go.
    run = start_run(
        "demo", {"faults": [], "chaos": chaos, "steps": 1300, "min_replicas": 1, "model.step_delay_s": 0.03}
    )
    assert len(run.spec.faults) == 10 and run.spec.chaos is None and run.record["chaos"]["seed"] == 11
    status = run.wait(timeout=900)
    assert status["state"] == "completed" and status["step"] == 1300, status
    events = run.event_records()
    fault_events = [e for e in events if e["kind"] == "fault" and e["action"] in ("kill", "hang")]
    assert len(fault_events) == 10, [e for e in events if e["kind"] == "warning"]
    assert unexplained_crashes(events) == []
    timeline = analysis.recovery_timeline(events)
    assert len(timeline) == 10
    assert timeline["complete"].all(), timeline.to_string()
    # Recovered means healed from a live peer: the group's weights agree with its peers' at the end.
    final = [e for e in events if e["kind"] == "exit" and e.get("reason") == "completed"]
    assert len({e["weights"] for e in final}) == 1


def test_goodput_of_a_fault_free_run_is_one_and_kill_badput_adds_up(start_run):
    clean = start_run("demo", {"faults": [], "steps": 600})
    killed = start_run(
        "demo",
        {
            "faults": [
                {"action": "kill", "target": 1, "at_step": 150},
                {"action": "kill", "target": 2, "at_step": 400},
            ],
            "steps": 900,
        },
    )
    assert clean.wait(timeout=300)["state"] == "completed"
    assert killed.wait(timeout=300)["state"] == "completed"
    g = analysis.goodput(clean.event_records(), clean.spec)
    assert 0.9 <= g["goodput"] <= 1.1, g
    k = analysis.goodput(killed.event_records(), killed.spec)
    assert k["goodput"] < g["goodput"]
    parts = k["badput_s"]
    assert parts["missing"] > 0 and parts["restart"] > 0 and parts["discarded"] > 0
    # Time-based parts and work-based loss are computed independently; they must agree.
    assert abs(sum(parts.values()) - k["lost_s"]) < 0.05 * k["T_s"], k
    # Each kill costs about one group's absence, i.e. kill→rejoin / replicas of full-rate time.
    timeline = analysis.recovery_timeline(killed.event_records())
    expected = timeline.loc[analysis.ends_process(timeline), "participating"].sum() / killed.spec.replicas
    assert parts["missing"] + parts["restart"] + parts["heal"] == pytest.approx(expected, rel=0.35)


def test_a_sigstopped_replica_is_detected_as_hung_within_the_window(start_run):
    run = start_run("demo", {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1, "hang.timeout_s": 2.0})
    run.wait_for_step(30, replica=1, timeout=180)  # the group to hang must have committed (under load it starts late)
    fault = run.kill(replica=1, how="hang", seconds=8)
    run.wait_for(lambda r: any(e["kind"] == "hang" and e.get("target") == 1 for e in r.events_read), timeout=30)
    hang = next(e for e in run.events_read if e["kind"] == "hang" and e.get("target") == 1)
    last_step = max(
        e["t"] for e in run.events_read if e["kind"] == "step" and e["replica"] == 1 and e["t"] < fault["t"]
    )
    # Reported once the peer has moved on without it: a dead peer holds the survivor up for
    # about the process-group plus heartbeat timeouts (1 s each here).
    assert 2.0 <= hang["seconds_without_progress"] < 2.0 + 2.0
    assert hang["t"] - last_step < 2.0 + 2.0
    assert run.status()["replicas"]["1"]["state"] == "hung"
    run.stop()
