"""Fault schedules are reproducible and honest; each preflight rule fires when broken."""

import numpy as np
import pytest

import workbench as wb
from workbench.paths import CONFIG_DIR
from workbench.spec import schedule
from workbench.spec.load import load_spec
from workbench.spec.preflight import preflight
from workbench.spec.sections import ChaosSpec


def test_same_seed_same_fault_times_different_seed_different():
    spec = load_spec("demo", {"chaos": {"mtbf_s": 30, "seed": 7, "actions": ["kill", "hang"], "max_faults": 20}})
    a = schedule.materialize(spec).faults
    b = schedule.materialize(spec).faults
    assert [(f.at_s, f.action, f.target) for f in a] == [(f.at_s, f.action, f.target) for f in b]
    other = schedule.materialize(load_spec(spec, {"chaos.seed": 8})).faults
    assert [f.at_s for f in other] != [f.at_s for f in a]


def test_inter_arrival_times_follow_the_exponential_distribution():
    chaos = ChaosSpec(mtbf_s=10.0, seed=3, start_s=0.0, max_faults=20000)
    times = np.array([f.at_s for f in schedule.draw(chaos, replicas=3)])
    gaps = np.diff(np.concatenate([[0.0], times]))
    # Exponential: mean = std = MTBF and P(gap > MTBF) = e^-1, unlike "random wait + fixed sleep".
    assert abs(gaps.mean() - 10.0) < 0.3
    assert abs(gaps.std() - 10.0) < 0.4
    assert abs((gaps > 10.0).mean() - np.exp(-1)) < 0.015
    assert (gaps < 1.0).mean() > 0.08  # short gaps happen: no fixed minimum sleep


def test_chaos_is_drawn_into_the_faults_once(run_root):
    """The resolved spec (what ``run.json`` records and a replay reruns) carries the drawn faults
    after the explicit ones and no chaos section, so resolving it again draws nothing more."""
    explicit = {"action": "kill", "target": 1, "at_step": 50}
    spec = load_spec(
        "demo",
        {"faults": [explicit], "chaos": {"mtbf_s": 5, "seed": 2, "actions": ["hang"], "max_faults": 4, "start_s": 3.0}},
    )
    resolved = schedule.materialize(spec)
    assert resolved.chaos is None and len(resolved.faults) == 5
    assert (resolved.faults[0].action, resolved.faults[0].target, resolved.faults[0].at_step) == ("kill", 1, 50)
    drawn = resolved.faults[1:]
    assert all(f.action == "hang" and 0 <= f.target < 3 and f.at_s >= 3.0 for f in drawn)
    assert [f.at_s for f in drawn] == sorted(f.at_s for f in drawn)
    assert schedule.materialize(resolved) == resolved


def test_a_bad_chaos_spec_is_refused_before_anything_is_drawn_or_written(run_root):
    with pytest.raises(wb.SpecError):
        wb.submit("demo", {"chaos": {"mtbf_s": 5, "targets": [9]}})
    assert not run_root.exists()


def test_a_scheduled_fault_the_run_ends_before_is_reported_not_dropped(start_run):
    run = start_run("demo", {"steps": 30, "faults": [{"action": "kill", "target": 1, "at_s": 600.0}]})
    run.wait(timeout=300)
    assert run.state() == "completed"
    warnings = [e["message"] for e in run.event_records() if e["kind"] == "warning"]
    assert [m for m in warnings if m.startswith("scheduled fault 0 (kill at 600.0 s) never fired")], warnings
    assert not [e for e in run.event_records() if e["kind"] == "fault"]


SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("config", SHIPPED)
def test_preflight_is_quiet_on_shipped_configs(config):
    assert preflight(load_spec(config)) == []


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"torchft.pg_timeout_ms": 500, "lighthouse.heartbeat_timeout_ms": 1000}, "pg_timeout_ms (500)"),
        (
            {
                "torchft.quorum_timeout_s": 0.5,
                "lighthouse.join_timeout_ms": 100,
                "lighthouse.heartbeat_timeout_ms": 1000,
            },
            "quorum_timeout_s (0.5)",
        ),
        ({"lighthouse.join_timeout_ms": 100, "lighthouse.quorum_tick_ms": 100}, "join_timeout_ms (100)"),
        ({"faults": [{"action": "kill", "target": 1, "at_step": 10_000}]}, "never fires"),
        (
            {
                "trainer": "maxtext",
                "replicas": 1,
                "min_replicas": 1,
                "maxtext": {"checkpoint_period": 500},
                "steps": 100,
                "faults": [],
            },
            "no checkpoint is ever written",
        ),
        ({"replicas": 1, "min_replicas": 1, "faults": []}, "no live peer"),
    ],
)
def test_each_preflight_warning_fires_with_its_values(overrides, needle):
    warnings = preflight(load_spec("demo", overrides))
    assert any(needle in w for w in warnings), warnings


def test_preflight_refuses_join_timeout_beyond_quorum_timeout():
    with pytest.raises(wb.SpecError, match="join_timeout_ms"):
        preflight(load_spec("demo", {"lighthouse.join_timeout_ms": 70_000}))


def test_preflight_refuses_a_busy_lighthouse_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(wb.SpecError, match=f"lighthouse.port: 127.0.0.1:{port} is already in use"):
            preflight(load_spec("demo", {"lighthouse.port": port}))


def test_one_group_warns_only_where_a_relaunch_has_nothing_to_resume_from():
    """torchft-lite keeps its state only in live peers; titan restores its own checkpoint."""

    def warned(config):
        spec = load_spec(config, {"replicas": 1, "min_replicas": 1, "faults": []})
        return any("replicas is 1" in w for w in preflight(spec))

    assert warned("demo") and not warned("titan-cpu")
