"""Timeouts: each inconsistent pair is one preflight warning naming both settings; recommendations
from a measured run rest on the measurement they print (a hand-written log, checked by hand)."""

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from workbench.analysis.timeouts import measure, recommend
from workbench.spec.load import load_spec
from workbench.spec.preflight import preflight
from workbench.spec.timeouts import Measured, timeout_warnings

from .conftest import local_slurm, slurm_prerequisites, workbench_cli

HB = "lighthouse.heartbeat_timeout_ms"
M = Measured(
    steps=400,
    step_p50_s=0.5,
    step_p99_s=2.0,
    step_max_s=3.0,
    interval_max_s=4.0,
    heal_max_s=40.0,
    save_max_s=5.0,
    quorum_max_s=70.0,
    source="run-x",
)
TITAN_TRAIN = "titan.overrides.comm.train_timeout_seconds"


def _warned(config, overrides, measured=None, kill_wait_s=None):
    return timeout_warnings(load_spec(config, overrides), measured, kill_wait_s)


# (config, overrides, measured, KillWait, the pieces the one warning must hold: both settings and their values)
RULES = {
    "heartbeat interval vs heartbeat timeout": (
        "demo",
        {"lighthouse.heartbeat_timeout_ms": 150, "torchft.heartbeat_interval_ms": 100},
        None,
        None,
        ["lighthouse.heartbeat_timeout_ms (150)", "torchft.heartbeat_interval_ms (100)"],
    ),
    "manager timeout vs pg timeout": (
        "demo",
        {"torchft.timeout_s": 2, "torchft.pg_timeout_ms": 5000},
        None,
        None,
        ["torchft.timeout_s (2.0)", "torchft.pg_timeout_ms (5000)"],
    ),
    "pg timeout vs slowest step": (
        "demo",
        {"torchft.pg_timeout_ms": 2500},
        M,
        None,
        ["torchft.pg_timeout_ms (2500)", "slowest step of run-x (3 s)"],
    ),
    "heal vs manager timeout": ("demo", {}, M, None, ["torchft.timeout_s (30.0)", "slowest heal of run-x (40 s)"]),
    "quorum timeout vs slowest quorum": (
        "demo",
        {},
        M,
        None,
        ["torchft.quorum_timeout_s (60.0)", "slowest quorum of run-x (70 s)"],
    ),
    "titan training timeout vs pg timeout": (
        "titan-cpu",
        {"titan.overrides": {"comm.train_timeout_seconds": 1}},
        None,
        None,
        [f"{TITAN_TRAIN} (1)", "torchft.pg_timeout_ms (2000, unset: max(2000, lighthouse"],
    ),
    "titan init timeout vs training timeout": (
        "titan-cpu",
        {"titan.overrides": {"comm.init_timeout_seconds": 50}},
        None,
        None,
        ["titan.overrides.comm.init_timeout_seconds (50)", "titan config comm.train_timeout_seconds (60)"],
    ),
    "titan init timeout vs torchft timeout": (
        "titan-cpu",
        {"titan.overrides": {"comm.init_timeout_seconds": 100}, "torchft.timeout_s": 120},
        None,
        None,
        ["titan.overrides.comm.init_timeout_seconds (100)", "torchft.timeout_s (120.0)"],
    ),
    "titan training timeout vs slowest step": (
        "titan-cpu",
        {"titan.overrides": {"comm.train_timeout_seconds": 3}},
        M,
        None,
        [f"{TITAN_TRAIN} (3)", "slowest step of run-x (3 s)"],
    ),
    "maxtext checkpoint period vs mtbf": (
        "maxtext-cpu-tiny",
        {"chaos": {"mtbf_s": 4.0}},
        M,
        None,
        ["maxtext.checkpoint_period (10)", "median step of run-x (0.5 s)", "chaos.mtbf_s (4.0)"],
    ),
    "maxtext save vs checkpoint period": (
        "maxtext-cpu-tiny",
        {"maxtext.checkpoint_period": 8},
        M,
        None,
        ["slowest save of run-x (5 s)", "maxtext.checkpoint_period (8)"],
    ),
    "jax init timeout vs the time limit": (
        "maxtext-cpu-tiny",
        {"cluster": "slurm", "slurm.nodes": 2, "slurm.time_min": 4},
        None,
        None,
        ["MaxText's maxtext.jax_distributed_initialization_timeout (300, unset)", "slurm.time_min (4 min)"],
    ),
    "slurm time limit vs signal lead": (
        "demo-slurm",
        {"slurm.time_min": 1},
        None,
        None,
        ["slurm.time_min (1)", "--signal=USR2@90"],
    ),
    "slurm time limit vs planned steps": (
        "demo-slurm",
        {"slurm.time_min": 5},
        M,
        None,
        ["slurm.time_min (5)", "steps (600)", "median step of run-x (0.5 s)"],
    ),
    "slurm time limit vs step delay": (
        "demo-slurm",
        {"slurm.time_min": 2, "model.step_delay_s": 1.0},
        None,
        None,
        ["slurm.time_min (2)", "steps (600)", "model.step_delay_s (1 s)"],
    ),
    "KillWait vs step and save": (
        "maxtext-cpu-tiny",
        {"cluster": "slurm"},
        M,
        2.0,
        ["Slurm's KillWait (2 s)", "slowest step + save of run-x (3 s + 5 s)"],
    ),
    "hang window vs slowest step interval": (
        "demo",
        {"hang.timeout_s": 4.0},
        M,
        None,
        ["hang.timeout_s (4.0)", "slowest step interval of run-x (4 s)"],
    ),
}


@pytest.mark.parametrize("rule", list(RULES))
def test_each_timeout_rule_is_one_line_naming_both_settings_and_what_is_required(rule):
    config, overrides, measured, kill_wait, pieces = RULES[rule]
    hits = [w for w in _warned(config, overrides, measured, kill_wait) if all(p in w for p in pieces)]
    assert len(hits) == 1, _warned(config, overrides, measured, kill_wait)
    assert "\n" not in hits[0] and "required" in hits[0]


@pytest.mark.parametrize("rule", list(RULES))
def test_each_timeout_rule_needs_its_broken_pair(rule):
    """The shipped config, without the rule's overrides and measurement, gives no such warning."""
    config, _, measured, kill_wait, pieces = RULES[rule]
    assert not [w for w in _warned(config, {}, None, kill_wait) if all(p in w for p in pieces)]


def test_preflight_surfaces_the_timeout_warnings_and_asks_for_killwait_only_with_a_measurement():
    spec = load_spec("titan-cpu", {"titan.overrides": {"comm.train_timeout_seconds": 1}})
    assert [w for w in preflight(spec) if w.startswith(f"{TITAN_TRAIN} (1) <=")]
    # local runs have no SIGKILL after a stop: no KillWait rule whatever the measurement
    assert not [w for w in preflight(load_spec("maxtext-cpu-tiny"), M) if "KillWait" in w]


# -- recommendations, from a hand-written log ------------------------------------------------------


def _log():
    """Replica 0 (attempt 0) steps; replica 1 is relaunched (attempt 1), heals and steps."""
    ev = [{"t": 100.0, "kind": "phase", "replica": 0, "attempt": 0, "phase": "manager_ready"}]
    ev.append({"t": 100.5, "kind": "quorum", "replica": 0, "attempt": 0, "quorum_id": 1})
    # t, step_time_s, quorum_id, committed
    rows = [(101.0, 9.0, 1, True)]  # an attempt's first step: left out
    for i, dt in enumerate([0.5, 0.1, 0.4, 0.2, 0.3, 1.0, 0.6, 0.9, 0.7, 0.8]):
        rows.append((102.0 + i, dt, 1, True))
    rows.append((112.0, 50.0, 1, False))  # voted down: left out
    rows.append((118.0, 20.0, 2, True))  # in a new quorum: left out; its gap (6 s) is the slowest interval
    for i, (t, dt, q, c) in enumerate(rows):
        ev.append(
            {"t": t, "kind": "step", "replica": 0, "attempt": 0, "step": i + 1, "step_time_s": dt}
            | {"quorum_id": q, "committed": c}
        )
    ev += [
        {"t": 120.0, "kind": "restart", "replica": 1, "attempt": 1, "reason": "died", "from_step": 12},
        {"t": 121.0, "kind": "phase", "replica": 1, "attempt": 1, "phase": "manager_ready"},
        {"t": 122.5, "kind": "quorum", "replica": 1, "attempt": 1, "quorum_id": 2},
        {"t": 123.0, "kind": "heal", "replica": 1, "attempt": 1, "seconds": 2.0, "bytes": 10},
        {"t": 123.5, "kind": "heal", "replica": 1, "attempt": 1, "seconds": 99.0, "error": "refused"},
        {"t": 124.0, "kind": "step", "replica": 1, "attempt": 1, "step": 13, "step_time_s": 3.0, "quorum_id": 2},
    ]
    return ev


def test_measure_reads_the_figures_off_a_hand_written_log():
    m = measure(_log(), "hand")
    # ten step times 0.1 .. 1.0: p50 the 5th smallest, p99 the ceil(9.9) = 10th
    assert (m.steps, m.step_p50_s, m.step_p99_s, m.step_max_s) == (10, 0.5, 1.0, 1.0)
    assert m.interval_max_s == 118.0 - 111.0  # 112.0 voted down: the committed steps 111 -> 118
    assert m.heal_max_s == 2.0  # the failed heal is no transfer
    assert m.quorum_max_s == 122.5 - 121.0  # replica 1's quorum after its manager started
    assert m.restart_max_s == 124.0 - 120.0
    assert m.save_max_s is None
    # a fault's target's gap across the fault is what the hang detector is for: not a slow step
    frozen = _log() + [{"t": 115.0, "kind": "fault", "replica": None, "action": "hang", "target": 0}]
    assert measure(frozen).interval_max_s == 1.0


def test_a_recommendation_is_hand_arithmetic_on_its_measurement():
    spec = load_spec("demo")
    recs = {r.key: r for r in recommend(spec, measure(_log(), "hand"), margin=3)}
    # pg: step p99 1.0 s × 3 = 3000 ms beats the slowest step × 1.25 (1250) and the heartbeat timeout (300)
    assert recs["torchft.pg_timeout_ms"].value == 3000
    assert recs["torchft.pg_timeout_ms"].basis == "step time p99 1 s over 10 steps × 3"
    # the slowest heal 2 s × 3 = 6 s beats the pg timeout 3 s × 1.25 = 3.75 s
    assert recs["torchft.timeout_s"].line() == "torchft.timeout_s: 6 s (slowest heal 2 s × 3; now 30 s)"
    assert recs["torchft.quorum_timeout_s"].value == 4.5  # slowest quorum 1.5 s × 3
    assert recs["hang.timeout_s"].value == 21.0  # slowest interval 7 s × 3
    # each recommendation passes the rules preflight checks against the same measurement
    fixed = {k: r.value for k, r in recs.items()}
    assert timeout_warnings(load_spec("demo", fixed), measure(_log(), "hand")) == []


def test_titan_and_slurm_recommendations_hold_their_orderings():
    m = measure(_log(), "hand")
    recs = {r.key: r.value for r in recommend(load_spec("titan-cpu"), m)}
    pg_s = recs["titan.overrides.fault_tolerance.process_group_timeout_ms"] / 1000
    train, init = recs[TITAN_TRAIN], recs["titan.overrides.comm.init_timeout_seconds"]
    assert pg_s < train < init and recs["torchft.timeout_s"] < init
    slurm = {r.key: r for r in recommend(load_spec("demo-slurm"), m)}
    # 600 steps × p50 0.5 s × 1.25 + 90 s = 465 s -> 7.75 min, up to 8
    assert slurm["slurm.time_min"].value == 8


def test_checkpoint_period_is_youngs_interval_over_the_median_step():
    events = _log() + [{"t": 111.5, "kind": "checkpoint", "replica": 0, "attempt": 0, "step": 10, "durable": True}]
    events[-1]["seconds"] = 0.5
    m = measure(events, "hand")
    spec = load_spec("maxtext-cpu-tiny", {"chaos": {"mtbf_s": 100.0}})
    (period,) = [r for r in recommend(spec, m) if r.key == "maxtext.checkpoint_period"]
    # sqrt(2 × 0.5 s × 100 s) = 10 s between saves, over the median step 0.5 s: 20 steps
    assert (period.value, period.unit, period.current) == (20, "steps", 10)


# -- the CLI on a real run --------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_recommends_from_a_measured_run(start_run):
    # the heartbeat timeout pinned at 1 s (the demo's default is shorter): the stall the arithmetic below needs
    kill = {"steps": 60, "faults": [{"action": "kill", "target": 1, "at_step": 30}], HB: 1000}
    run = start_run("demo", kill)
    run.wait(timeout=300)
    assert run.state() == "completed"
    out = workbench_cli("timeouts", str(run.run_dir), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # by hand from the events: the longest gap between two committed steps of one attempt
    steps: dict = {}
    for e in sorted(run.event_records(), key=lambda e: e["t"]):
        if e["kind"] == "step" and e.get("committed", True):
            steps.setdefault((e["replica"], e["attempt"]), []).append(e["t"])
    gap = max(b - a for ts in steps.values() for a, b in zip(ts, ts[1:]))
    (hang,) = [r for r in result["recommended"] if r["key"] == "hang.timeout_s"]
    # the kill stalls the survivors about a heartbeat timeout (1 s): the gap wins over pg × 1.25
    assert gap > 1.0
    assert hang["value"] == math.ceil(round(gap * 3 * 10, 6)) / 10
    assert hang["basis"] == f"slowest step interval {gap:.3g} s × 3"
    text = workbench_cli("timeouts", str(run.run_dir), "--check", "demo", "torchft.pg_timeout_ms=100")
    assert text.returncode == 0, text.stderr
    hb = load_spec("demo").lighthouse.heartbeat_timeout_ms
    assert f"torchft.pg_timeout_ms (100) < lighthouse.heartbeat_timeout_ms ({hb})" in text.stdout


def test_killwait_is_read_from_the_real_slurm_and_judged_against_a_measured_save(tmp_path):
    """The dev cluster's ``KillWait`` as its ``slurm.conf`` says, through ``scontrol show config``."""
    from workbench.cluster.slurm.backend import SlurmCluster

    with local_slurm(tmp_path / "slurm") as info:
        conf = info["env"]["SLURM_CONF"]
        written = float(re.search(r"^KillWait=(\d+)", Path(conf).read_text(), re.MULTILINE).group(1))
        spec = load_spec("maxtext-cpu-tiny", {"cluster": "slurm", "slurm.conf": conf})
        assert SlurmCluster.kill_wait_s(spec) == written
        measured = Measured(step_max_s=1.0, save_max_s=written, source="run-x")
        warned = [w for w in preflight(spec, measured) if w.startswith(f"Slurm's KillWait ({written:g} s) <=")]
        assert warned == [
            f"Slurm's KillWait ({written:g} s) <= the slowest step + save of run-x (1 s + {written:g} s): "
            "required KillWait > it, or a preempted job is SIGKILLed before its save is durable and restarts "
            "from the save before"
        ]
        assert not [w for w in preflight(spec, dataclasses.replace(measured, save_max_s=0.5)) if "KillWait" in w]


for _mark in (pytest.mark.slurm, pytest.mark.slow, *slurm_prerequisites()):
    test_killwait_is_read_from_the_real_slurm_and_judged_against_a_measured_save = _mark(
        test_killwait_is_read_from_the_real_slurm_and_judged_against_a_measured_save
    )
