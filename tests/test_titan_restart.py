"""TorchTitan's own checkpoint-restart (``trainer: titan-restart``): the baseline beside elastic TorchTitan.

The run test kills rank 0 while it holds a save (``kill_during_checkpoint``): the job ends, the
controller relaunches it, and every rank resumes from the newest *durable* checkpoint, not the torn
one; goodput counts each step once.
"""

from __future__ import annotations

import pytest

from workbench import analysis
from workbench.analysis.breakeven import throughput
from workbench.errors import SpecError
from workbench.spec.load import load_spec
from workbench.trainers.titan.restart import checkpoint_dir

pytest.importorskip("torch")
pytest.importorskip("torchtitan")
pytestmark = pytest.mark.titan


def test_torchft_settings_it_does_not_read_are_refused_naming_the_field():
    with pytest.raises(SpecError, match=r"torchft\.timeout_s: trainer titan-restart does not read it"):
        load_spec("titan-restart-cpu", {"torchft.timeout_s": 60})
    with pytest.raises(SpecError, match=r"titan\.overrides\.fault_tolerance\.enable: trainer titan-restart"):
        load_spec("titan-restart-cpu", {"titan.overrides": {"fault_tolerance.enable": True}})
    with pytest.raises(SpecError, match=r"titan\.checkpoint_interval: got 0"):
        load_spec("titan-restart-cpu", {"titan.checkpoint_interval": 0})
    with pytest.raises(SpecError, match=r"ft\.algorithm: diloco is not implemented by trainer titan-restart"):
        load_spec("titan-restart-cpu", {"ft.algorithm": "diloco", "ft.sync_every": 4})
    # a resolved spec (every field spelled out at its default) loads again: replay, sweeps, the matrix
    spec = load_spec("titan-restart-cpu")
    assert load_spec(spec.to_dict()).trainer == "titan-restart"


def test_a_save_killed_mid_way_is_never_loaded_the_relaunch_resumes_from_the_last_durable_one(start_run):
    every, steps = 4, 10
    run = start_run(
        "titan-restart-cpu",
        {
            "steps": steps,
            "max_restarts": 2,
            "titan.checkpoint_interval": every,
            "titan.overrides": {"training.seq_len": 128, "checkpoint.keep_latest_k": 0},
            "faults": [{"action": "kill_during_checkpoint", "target": 0, "at_step": 5}],
        },
    )
    status = run.wait(timeout=300)
    assert status["state"] == "completed" and status["step"] == steps, status
    ev = run.event_records()
    fault = next(e for e in ev if e["kind"] == "fault")
    starts = {(e["replica"], e["attempt"]): e for e in ev if e["kind"] == "start" and e.get("role") == "replica"}
    assert sorted(starts) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(starts)
    assert fault["pid"] == starts[(0, 0)]["pid"]  # the checkpoint writer: rank 0's own process

    saves = [e for e in ev if e["kind"] == "checkpoint" and e["attempt"] == 0]
    held = [e for e in saves if e.get("held")]
    assert [e["step"] for e in held] == [2 * every], saves  # armed after step 5: the save of step 8 is held
    durable = [e["step"] for e in saves if e.get("durable")]
    assert durable == [every], saves  # step 8's never committed
    torn = checkpoint_dir(run.run_dir) / "checkpoint" / f"step-{2 * every}"
    assert [e["attempt"] for e in ev if e["kind"] == "restart"] == [1]

    restored = [e for e in ev if e["kind"] == "phase" and e.get("phase") == "restored"]
    assert sorted((e["replica"], e["from_step"]) for e in restored) == [(0, every), (1, every)], restored
    for rank in (0, 1):
        resumed = [e["step"] for e in ev if e["kind"] == "step" and e["attempt"] == 1 and e["replica"] == rank]
        assert resumed == list(range(every + 1, steps + 1)), resumed
    # the relaunch saved step 8 again, over the torn folder, and that one is durable
    assert (torn / ".metadata").is_file()
    assert {e["reason"] for e in ev if e["kind"] == "exit" and e["attempt"] == 1} == {"completed"}

    # goodput: each step once per rank; the steps redone after the restore are not counted twice
    redone = sum(1 for e in ev if e["kind"] == "step" and e["attempt"] == 0 and e["step"] > every)
    assert redone >= 2 * every - 2  # both ranks reached the held save of step 8
    t = throughput(ev, run.spec)
    assert t["useful_samples"] == 2 * steps and t["rolled_back_steps"] == redone, t
    row = analysis.recovery_timeline(ev).iloc[0]
    assert row["action"] == "kill_during_checkpoint" and row["steps_lost"] == 2 * every - every, row
