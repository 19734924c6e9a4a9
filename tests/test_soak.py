"""The short chaos soak (``make soak`` runs the long one): random kills, hangs and lighthouse
kills against one run, then every invariant checked from the run directory alone."""

import pytest

from workbench.experiments.soak import check_invariants, soak_mix, soak_spec

pytestmark = pytest.mark.slow


def test_short_soak_holds_every_invariant(start_run):
    run = start_run("demo", soak_spec(faults=12, mtbf_s=5.0, seed=9, cluster="local"))
    actions = {f.action for f in run.spec.faults}
    assert actions == set(soak_mix("local")), actions  # the seed draws every kind the local backend injects
    run.wait(timeout=900)
    result = check_invariants(run)
    assert (result["faults"], result["faults_not_fired"]) == (12, 0)
    broken = {
        k: v
        for k, v in result.items()
        if k
        in (
            "state",
            "survivor_crashes",
            "duplicate_committed_steps",
            "steps_going_back",
            "final_weights_distinct",
            "restores_of_non_durable_checkpoints",
            "timeline_incomplete",
        )
    }
    assert result["invariants_hold"], broken


def test_a_soak_is_long_enough_for_its_last_fault_at_its_fastest_step():
    """The chaos schedule is in seconds and the run's length in steps: a run that stepped faster than
    the length was sized for ended with its last faults still due (10 of 12 fired, once)."""
    from workbench.spec.load import load_spec
    from workbench.spec.schedule import materialize

    for faults, mtbf_s, seed in ((12, 5.0, 9), (50, 6.0, 1)):
        spec = soak_spec(faults=faults, mtbf_s=mtbf_s, seed=seed, cluster="local")
        last_s = max(f.at_s for f in materialize(load_spec("demo", spec)).faults)
        assert spec["steps"] * spec["model"]["step_delay_s"] >= last_s + spec["chaos"]["hang_seconds"]


def test_a_crash_of_a_group_that_was_killed_earlier_still_counts(tmp_path):
    """Group 1's first attempt is killed (explained); its second attempt dies with no fault aimed
    at it: a crash, although group 1 was a fault's target once."""
    from workbench.events.reader import EventReader
    from workbench.events.writer import EventWriter
    from workbench.experiments.soak import unexplained_crashes

    ctl = EventWriter(tmp_path, "controller", run="r")
    control = EventWriter(tmp_path, "control-1", run="r")
    ctl.emit("submit", replica=1, attempt=0, job_id="1")
    control.emit("fault", action="kill", target=1, attempt=0, origin="schedule")
    ctl.emit("job", replica=1, attempt=0, job_id="1", state="ended", clean=False, reason="died")
    ctl.emit("submit", replica=1, attempt=1, job_id="2")
    ctl.emit("job", replica=1, attempt=1, job_id="2", state="ended", clean=False, reason="error")
    ctl.emit("submit", replica=2, attempt=0, job_id="3")
    ctl.emit("job", replica=2, attempt=0, job_id="3", state="ended", clean=False, reason="stopped")
    crashes = unexplained_crashes(EventReader(tmp_path).poll())
    assert [(e["replica"], e["attempt"]) for e in crashes] == [(1, 1)]


def _ended(replica, attempt, t, reason="died"):
    return {"kind": "job", "t": t, "replica": replica, "attempt": attempt, "clean": False, "reason": reason}


@pytest.mark.parametrize("survivable", ["hang", "straggler", "freeze", "partition", "slow_link"])
def test_a_crash_after_a_fault_the_group_should_live_through_still_counts(survivable):
    """A hang, straggler, freeze or link fault pauses or slows a group, which then carries on as the same
    process: a group that died of one is exactly the crash the soak is for, not one its fault explains.
    A kill of the same attempt (ends a process: ``ends_process`` in the fault kinds table) does explain it."""
    from workbench.experiments.soak import unexplained_crashes

    events = [
        {"kind": "submit", "t": 0.0, "replica": 0, "attempt": 0},
        {"kind": "submit", "t": 0.0, "replica": 1, "attempt": 0},
        {"kind": "fault", "t": 5.0, "action": survivable, "target": 1, "attempt": 0, "seconds": 2.0},
        {"kind": "fault", "t": 7.0, "action": "resume", "resumed": survivable, "target": 1},
        _ended(1, 0, 9.0),
        {"kind": "restart", "t": 9.5, "replica": 1, "attempt": 1},
        {"kind": "fault", "t": 12.0, "action": "kill", "target": 0, "attempt": 0},
        _ended(0, 0, 12.1),
    ]
    assert [(e["replica"], e["attempt"]) for e in unexplained_crashes(events)] == [(1, 0)]


def test_every_kind_that_ends_a_process_explains_the_crash_of_the_attempt_it_hit():
    from workbench.experiments.soak import unexplained_crashes
    from workbench.faults import kinds

    ending = [k.name for k in kinds.KINDS.values() if k.ends_process]
    assert {"kill", "abort", "preempt", "node_down"} <= set(ending)
    for action in ending:
        events = [
            {"kind": "submit", "t": 0.0, "replica": 0, "attempt": 0},
            {"kind": "fault", "t": 3.0, "action": action, "target": 0},  # no attempt recorded: by time
            _ended(0, 0, 3.2),
        ]
        assert unexplained_crashes(events) == [], action
