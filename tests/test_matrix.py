"""The fault matrix on the local backend, the single-point fault kinds, and the durable-checkpoint flag.

Runs are tiny (30-40 steps, 2 replicas) and the matrix runs two at a time: the
claims are about what each run recorded and how the matrix counts it, not speed.
"""

from __future__ import annotations

import pytest

import workbench as wb
from workbench.errors import SpecError
from workbench.experiments.matrix import OUTCOMES, attach_matrix, trial_outcome
from workbench.experiments.matrix_plan import Setup, label_of, parse_setup, plan, resolve, setups_from, setups_of
from workbench.experiments.sweep import point_name, point_spec
from workbench.faults import kinds as faultkinds
from workbench.faults.armed import Triggers
from workbench.state.fold import RunState

from .conftest import kill_pids

TINY = {"steps": 30, "replicas": 2, "checkpoint.every_steps": 5}  # min_replicas 2 (demo): the survivor waits


def test_plan_keeps_cells_that_cannot_run_and_draws_steps_inside_the_window():
    base = wb.load_spec("demo", TINY)
    rows = setups_from(base, ["torchft-lite", "ddp-restart"], ["local"])
    _, cells, points = plan("kill,node_down,kill_during_checkpoint", rows, trials=4, window=(6, 9), seed=3)
    why = {(c["fault"], c["trainer"]): c.get("why_not") for c in cells}
    assert why == {
        ("kill", "torchft-lite"): None,
        ("kill", "ddp-restart"): None,
        ("node_down", "torchft-lite"): "cannot inject on local",
        ("node_down", "ddp-restart"): "cannot inject on local",
        ("kill_during_checkpoint", "torchft-lite"): "no checkpoint_writer in torchft-lite",
        ("kill_during_checkpoint", "ddp-restart"): None,
    }
    assert len(points) == 3 * 4
    assert all(6 <= p["faults"][0]["at_step"] <= 9 and 0 <= p["faults"][0]["target"] < 2 for p in points)
    assert {p["faults"][0]["at_step"] for p in points} != {points[0]["faults"][0]["at_step"]}  # drawn, not fixed
    with pytest.raises(SpecError, match=r"faults: 'bogus' not known; allowed: kill"):
        plan("kill,bogus", rows)
    with pytest.raises(
        SpecError, match=r"window of torchft-lite / local: expected 1 <= first <= last < steps \(30\), got 20:40"
    ):
        plan("kill", rows, window=(20, 40))


def test_the_real_setups_give_every_cell_a_run_or_a_reason_and_each_trial_is_its_setups_spec():
    """``--setups real``: the local setups, then titan 2×1 and maxtext ×2 on Slurm, every fault kind.

    A cell runs where the backend injects the kind, the trainer has its process and the spec takes the
    fault; every other cell names why. A trial's spec is its setup's spec plus its one fault, whichever
    setup the sweep's base is, and the trials go round by round (every cell's first, then its second).
    """
    setups = setups_of("real")
    base, cells, points = plan("all", setups, trials=2, seed=0)
    labels = list(dict.fromkeys(c["setup"] for c in cells))
    assert labels == [
        "titan 1×2 local",
        "titan-restart ×2 local",
        "maxtext ×1 local",
        "titan 2×1 slurm",
        "maxtext ×2 slurm",
    ]
    assert len(cells) == len(faultkinds.KINDS) * len(setups)
    assert all(bool(c["points"]) != bool(c.get("why_not")) for c in cells), cells
    runs = {(c["fault"], c["setup"]) for c in cells if c["points"]}
    assert {("kill_rank0", "titan 1×2 local"), ("kill_store_host", "titan 1×2 local")} <= runs
    assert {("node_down", "titan 2×1 slurm"), ("partition", "maxtext ×2 slurm"), ("kill", "maxtext ×1 local")} <= runs
    why = {(c["fault"], c["setup"]): c.get("why_not") for c in cells}
    assert why[("kill_rank0", "titan 2×1 slurm")] == "cannot inject on slurm"
    assert why[("lighthouse_kill", "maxtext ×1 local")] == "no lighthouse in maxtext (checkpoint-restart)"
    assert why[("node_down", "maxtext ×1 local")] == "cannot inject on local"
    by_label = {label: spec for s in setups for label, spec, _ in [resolve(s)]}
    order = [
        next((c["points"].index(p), labels.index(c["setup"])) for c in cells if p in c["points"])
        for p in range(len(points))
    ]
    assert order == sorted(order)  # round by round, each round setup by setup
    for c in cells:
        for p in c["points"]:
            spec = point_spec(base.to_dict(), points[p], p)
            want = by_label[c["setup"]].to_dict()
            assert spec.name == point_name(want["name"], p)
            assert {**spec.to_dict(), "name": want["name"], "faults": []} == want, c["setup"]
            assert [f.action for f in spec.faults] == [c["fault"]]
    assert label_of(wb.load_spec("titan-cpu", {"cluster": "slurm", "slurm.nodes": 2})) == "titan 2×1 slurm"
    assert parse_setup("maxtext-cpu-tiny steps=50 'label=maxtext x1' window=5:9") == Setup(
        "maxtext-cpu-tiny", {"steps": 50}, "maxtext x1", (5, 9)
    )
    with pytest.raises(SpecError, match="setup 'steps=5': expected a config then key=value overrides"):
        parse_setup("steps=5")
    with pytest.raises(SpecError, match="setups: 'bogus' not known; allowed: real"):
        setups_of("bogus")
    missing = resolve(Setup("no-such-config", label="x"))
    assert missing[1] is None and missing[2].startswith("config: 'no-such-config' not found")


def test_a_kind_that_does_not_apply_to_the_trainer_is_refused_before_submit():
    with pytest.raises(
        SpecError,
        match="faults\\[0\\].action: kill_during_checkpoint does not apply to trainer "
        "torchft-lite; allowed: kill, abort",
    ):
        wb.load_spec("demo", {"faults": [{"action": "kill_during_checkpoint", "at_step": 5}]})
    assert not faultkinds.KINDS["kill_rank0"].supported_on("slurm")


@pytest.mark.slow
def test_a_2x2x3_matrix_counts_every_trial_and_gives_rates_with_wilson_intervals(run_root):
    mx = wb.matrix(
        "demo",
        TINY,
        faults="kill,preempt",
        trainers="torchft-lite,ddp-restart",
        trials=3,
        window=(5, 15),
        seed=1,
        max_parallel=2,
    )
    try:
        table = mx.wait(timeout=420)
    finally:
        mx.stop()
        kill_pids(mx.sweep.pids())
    assert list(zip(table["fault"], table["trainer"])) == [
        ("kill", "torchft-lite"),
        ("kill", "ddp-restart"),
        ("preempt", "torchft-lite"),
        ("preempt", "ddp-restart"),
    ]
    assert (table["status"] == "done").all() and (table["trials"] == 3).all()
    assert (table[list(OUTCOMES)].sum(axis=1) == 3).all()

    trials = mx.trials()
    for t in trials.itertuples():  # each trial is a normal run directory with its one fault in the window
        run = wb.attach(t.run_dir)
        faults = [e for e in run.event_records() if e["kind"] == "fault"]
        assert [(f["action"], f["origin"]) for f in faults] == [(t.fault, "schedule")]
        assert run.spec.trainer == t.trainer and 5 <= run.spec.faults[0].at_step <= 15
    # A kill and a preemption are what both trainers recover from: 3 of 3. Wilson 95% for k = n is
    # [n / (n + z²), 1], z = 1.959964: [0.438503, 1].
    assert (table["recovered"] == 3).all(), table[["fault", "trainer", *OUTCOMES]]
    assert table["ci_low"].tolist() == pytest.approx([3 / (3 + 1.959964**2)] * 4, abs=1e-6)
    assert (table["ci_high"] == 1.0).all() and (table["rate"] == 1.0).all()
    elastic = table[table["trainer"] == "torchft-lite"].iloc[0]
    assert 0 < elastic["detect_median_s"] <= elastic["quorum_without_median_s"] <= elastic["first_step_median_s"]
    for r in table.itertuples():
        assert r.healed_or_restored_median_s <= r.first_step_median_s <= r.first_step_p95_s
    again = attach_matrix(mx.matrix_dir).table()  # from the directory alone
    assert again[["recovered", "rate"]].equals(table[["recovered", "rate"]])


def _run_to_end(start_run, overrides, timeout=240):
    run = start_run("demo", {**TINY, "trainer": "ddp-restart", **overrides})
    status = run.wait(timeout=timeout)
    assert status["state"] == "completed" and status["step"] == run.spec.steps, status
    return run, status, run.event_records()


@pytest.mark.slow
def test_kill_rank0_and_kill_store_host_hit_rank_0_whatever_the_target(start_run):
    run, _, ev = _run_to_end(
        start_run,
        {
            "steps": 40,
            "faults": [
                {"action": "kill_rank0", "target": 1, "at_step": 8},
                {"action": "kill_store_host", "target": 1, "at_step": 25},
            ],
        },
    )
    starts = {(e["replica"], e["attempt"]): e["pid"] for e in ev if e["kind"] == "start" and e.get("role") == "replica"}
    faults = [e for e in ev if e["kind"] == "fault"]
    assert [(f["action"], f["target"], f["pid"]) for f in faults] == [
        ("kill_rank0", 0, starts[(0, 0)]),
        ("kill_store_host", 0, starts[(0, 1)]),
    ]
    assert [e["attempt"] for e in ev if e["kind"] == "restart"] == [1, 2]
    from workbench import analysis

    assert analysis.recovery_timeline(ev)["complete"].tolist() == [True, True]


@pytest.mark.slow
def test_a_kill_during_a_save_leaves_it_incomplete_and_the_restart_uses_the_last_durable_one(start_run):
    run, status, ev = _run_to_end(start_run, {"faults": [{"action": "kill_during_checkpoint", "at_step": 7}]})
    armed = [e for e in ev if e["kind"] == "armed"]
    fault = next(e for e in ev if e["kind"] == "fault")
    step = fault["checkpoint_step"]
    started = next(e for e in ev if e["kind"] == "checkpoint" and e.get("state") == "started" and e["step"] == step)
    assert [a["action"] for a in armed] == ["kill_during_checkpoint"] and armed[0]["t"] < started["t"] < fault["t"]
    # Only the save the kill landed in was held, and it was attempt 0's: one restart, no other attempt ended.
    held = [(e["attempt"], e["step"]) for e in ev if e["kind"] == "checkpoint" and e.get("held")]
    assert held == [(0, step)] and fault["attempt"] == 0
    assert [(e["attempt"], e["reason"]) for e in ev if e["kind"] == "job"] == [(0, "died"), (1, "completed")]
    assert not [
        e for e in ev if e["kind"] == "checkpoint" and e.get("durable") and e["attempt"] == 0 and e["step"] == step
    ]  # the save the kill landed in never committed
    durable_before = max(
        e["step"] for e in ev if e["kind"] == "checkpoint" and e.get("durable") and e["t"] < fault["t"]
    )
    restored = {e["from_step"] for e in ev if e["kind"] == "phase" and e.get("phase") == "restored"}
    assert restored == {durable_before} and durable_before < step

    # The run state right after the kill: the last durable checkpoint is the one before, and the save is flagged.
    state = RunState(run.spec.replicas, run.spec.steps)
    ended = next(e for e in ev if e["kind"] == "job" and e["attempt"] == 0)
    state.apply(sorted((e for e in ev if e["t"] <= ended["t"]), key=lambda e: e["t"]))
    mid = state.checkpoint_status()
    assert mid["last_durable"]["step"] == durable_before and mid["incomplete"] == [step]
    # At the end: the save is still flagged incomplete; the last durable one's commit marker is on disk.
    final = status["checkpoints"]
    assert final["incomplete"] == [step] and final["last_durable"]["marker_present"] is True
    assert final["last_durable"]["step"] == max(e["step"] for e in ev if e["kind"] == "checkpoint" and e.get("durable"))


@pytest.mark.parametrize("victim", ["outlived the fault", "never came back"])
def test_a_victim_that_outlived_a_fault_meant_to_end_it_is_unaffected_not_unrecovered(victim):
    """Seen on the dev cluster: a 5 s ``slurmd_kill`` leaves running steps alone and the run completes; no
    recovery happened because none was needed, which the rate must not count as a failure to recover."""
    events = [
        {"kind": "start", "t": 0, "role": "controller", "trainer": "titan", "replica": None, "attempt": 0},
        {"kind": "start", "t": 1, "role": "replica", "replica": 1, "attempt": 0, "node": "n3"},
        {
            "kind": "fault",
            "t": 2,
            "action": "slurmd_kill",
            "origin": "schedule",
            "target": 1,
            "attempt": 0,
            "node": "n3",
            "seconds": 5,
        },
        {"kind": "fault", "t": 7, "action": "resume", "origin": "schedule", "target": "n3", "resumed": "slurmd_kill"},
    ]
    if victim == "outlived the fault":
        events += [
            {"kind": "step", "t": 50, "replica": 1, "attempt": 0, "step": 300, "committed": True},
            {"kind": "exit", "t": 51, "replica": 1, "attempt": 0, "reason": "completed", "step": 300},
            {
                "kind": "job",
                "t": 52,
                "replica": 1,
                "attempt": 0,
                "state": "ended",
                "clean": True,
                "reason": "completed",
            },
        ]
    else:
        events += [
            {
                "kind": "job",
                "t": 40,
                "replica": 1,
                "attempt": 0,
                "state": "ended",
                "clean": False,
                "reason": "died",
                "slurm_state": "NODE_FAIL",
            }
        ]
    events.append({"kind": "run_end", "t": 60, "state": "completed", "reason": ""})
    outcome = trial_outcome(events, elastic=True)["outcome"]
    assert outcome == ("unaffected" if victim == "outlived the fault" else "unrecovered"), outcome


def test_an_armed_fault_fires_on_the_save_the_writer_held_in_whichever_order_the_two_events_are_read():
    armed_ev = {"kind": "armed", "t": 1.0, "action": "kill_during_checkpoint", "target": 0}
    unheld = {"kind": "checkpoint", "t": 0.9, "replica": 0, "attempt": 0, "step": 10, "state": "started"}
    committed = {"kind": "checkpoint", "t": 1.2, "replica": 0, "attempt": 0, "step": 10, "durable": True}
    held = {"kind": "checkpoint", "t": 1.5, "replica": 0, "attempt": 0, "step": 15, "state": "started", "held": True}

    tr = Triggers()  # armed read first; the save under way at the time (not held) does not fire it
    assert [tr.observe(e) for e in (armed_ev, unheld, committed)] == [None, None, None]
    assert tr.observe(held) == (armed_ev, held)

    tr = Triggers()  # the held save read before the controller reads its own armed event back
    assert tr.observe(held) is None and tr.observe(armed_ev) == (armed_ev, held)

    tr = Triggers()  # a held save that committed before the arm was read (disarmed, timed out) fires nothing
    done = {**committed, "step": 15, "t": 1.6}
    assert [tr.observe(e) for e in (held, done, armed_ev)] == [None, None, None]


def test_an_armed_kill_in_allreduce_fires_on_the_groups_held_event_only():
    arm = {"kind": "armed", "t": 1.0, "action": "kill_in_allreduce", "target": 2, "trigger": "allreduce"}
    save = {"kind": "checkpoint", "t": 1.1, "replica": 2, "step": 10, "state": "started", "held": True}
    held = {"kind": "held", "t": 1.2, "replica": 2, "trigger": "allreduce", "step": 4}
    other = {**held, "replica": 1}

    tr = Triggers()  # a held save of the same group is another trigger's; another group's hold is not its
    assert [tr.observe(e) for e in (arm, save, other)] == [None, None, None]
    assert tr.observe(held) == (arm, held)

    tr = Triggers()  # a hold that ended without the kill (disarmed, timed out) fires nothing later
    released = {**held, "t": 1.3, "released": True}
    assert [tr.observe(e) for e in (held, released, arm)] == [None, None, None]


def test_the_ledger_tells_writing_skipped_and_incomplete_saves_and_checks_the_commit_marker(tmp_path):
    committed = tmp_path / "step-00000005.pt"
    committed.write_bytes(b"x")
    ev = [
        {"kind": "start", "t": 1.0, "replica": 0, "attempt": 0, "role": "replica", "pid": 1, "host": "h"},
        {"kind": "checkpoint", "t": 2.0, "replica": 0, "attempt": 0, "step": 5, "state": "started", "durable": False},
        {
            "kind": "checkpoint",
            "t": 2.1,
            "replica": 0,
            "attempt": 0,
            "step": 5,
            "durable": True,
            "path": str(committed),
        },
        {"kind": "checkpoint", "t": 3.0, "replica": 0, "attempt": 0, "step": 10, "state": "started", "durable": False},
        {"kind": "step", "t": 3.5, "replica": 0, "attempt": 0, "step": 11, "committed": True},
        {"kind": "checkpoint", "t": 4.0, "replica": 0, "attempt": 0, "step": 15, "state": "started", "durable": False},
    ]
    state = RunState(1, 30)
    state.apply(ev)
    st = state.checkpoint_status()
    assert (st["last_durable"]["step"], st["last_durable"]["marker_present"]) == (5, True)
    assert (st["skipped"], st["writing"], st["incomplete"]) == ([10], [15], [])
    state.apply([{"kind": "fault", "t": 4.5, "action": "kill", "target": 0, "attempt": 0}])
    assert state.checkpoint_status()["incomplete"] == [15]
    committed.unlink()  # a durable event whose file is gone: the marker is not on disk
    assert state.checkpoint_status()["last_durable"]["marker_present"] is False


@pytest.mark.slow
@pytest.mark.titan
@pytest.mark.maxtext
def test_one_kill_on_titan_1x2_and_one_on_maxtext_recover_and_the_page_shows_both(run_root, tmp_path):
    """The real trainers' smallest matrix: titan (one node, two ranks a group) and MaxText (one process),
    one kill each, and ``node_down``, which neither can get locally. Each trial is its setup's own spec
    with its one fault; both recover; the markdown page shows the two counts and why node_down did not run."""
    pytest.importorskip("torchtitan")
    from workbench.trainers.maxtext.command import maxtext_python

    if not maxtext_python().exists():
        pytest.skip(f"MaxText's environment {maxtext_python()} is missing: run scripts/setup-maxtext.sh")
    titan = {"steps": 200, "faults": [], "nproc_per_replica": 2, "titan.overrides": {"training.seq_len": 64}}
    mx = wb.matrix(
        faults="kill,node_down",
        setups=[
            Setup("titan-cpu-light", titan, window=(20, 40)),
            Setup("maxtext-cpu-tiny", {"steps": 120, "faults": []}, window=(30, 60)),
        ],
        trials=1,
        seed=2,
    )
    try:
        table = mx.wait(timeout=600)
    finally:
        mx.stop()
        kill_pids(mx.sweep.pids())
    ran = table[table["why_not"].isna()].set_index("setup")
    assert list(ran.index) == ["titan 1×2 local", "maxtext ×1 local"]
    assert (ran["status"] == "done").all() and (ran["recovered"] == 1).all(), table[["setup", *OUTCOMES]]
    elastic, restart = ran.loc["titan 1×2 local"], ran.loc["maxtext ×1 local"]
    assert 0 < elastic["detect_median_s"] and elastic["healed_or_restored_median_s"] <= elastic["first_step_median_s"]
    assert (
        0 < restart["replacement_median_s"] <= restart["healed_or_restored_median_s"] <= restart["first_step_median_s"]
    )
    for t in mx.trials().itertuples():
        run = wb.attach(t.run_dir)
        assert (run.spec.trainer, run.spec.nproc_per_replica) == (
            ("titan", 2) if t.setup.startswith("titan") else ("maxtext", 1)
        )
        assert [(f.action, f.at_step) for f in run.spec.faults] == [("kill", t.at_step)]
    page = mx.markdown()
    assert "| `kill` | **1/1** | **1/1** |" in page
    assert "| titan 1×2 local | `node_down` | cannot inject on local |" in page
    assert "| `node_down` | n/a (backend) | n/a (backend) |" in page
