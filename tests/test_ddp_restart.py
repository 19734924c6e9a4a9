"""The checkpoint-restart baseline, run for real: a killed rank takes the job down, the run
controller relaunches it, and it resumes from its last durable checkpoint."""

import pytest

from workbench.trainers.ddp_restart import checkpoint_dir

pytestmark = pytest.mark.slow


def test_a_killed_rank_fails_the_job_fast_and_the_relaunch_resumes_from_the_checkpoint(start_run):
    run = start_run(
        "demo",
        {
            "trainer": "ddp-restart",
            "steps": 200,
            "checkpoint.every_steps": 40,
            "faults": [{"action": "kill", "target": 1, "at_step": 100}],
        },
    )
    status = run.wait(timeout=240)
    assert status["state"] == "completed" and status["step"] == 200, status
    ev = run.event_records()
    fault = next(e for e in ev if e["kind"] == "fault")
    starts = {(e["replica"], e["attempt"]): e for e in ev if e["kind"] == "start" and e.get("role") == "replica"}
    assert sorted(starts) == [(r, a) for r in range(3) for a in range(2)]
    assert fault["pid"] == starts[(1, 0)]["pid"]  # the fault menu found the rank's own process

    # Fail fast: the job ended (every rank gone) soon after the kill, not after a collective timeout: within a
    # quarter of it (30 s), which a loaded machine keeps. How soon (about a second) is ``make bench``'s
    # ``restart_recoveries`` (``replacement_started_s`` of the ddp-restart runs: kill → the next attempt's start).
    ended = next(e for e in ev if e["kind"] == "job" and e["attempt"] == 0)
    assert ended["clean"] is False and ended["t"] - fault["t"] < run.spec.torchft.timeout_s / 4
    assert [e["attempt"] for e in ev if e["kind"] == "restart"] == [1]

    ckpts = [e for e in ev if e["kind"] == "checkpoint" and e["attempt"] == 0 and e.get("state") != "started"]
    assert ckpts and all(e["durable"] and e["bytes"] > 0 and e["replica"] == 0 for e in ckpts)
    latest = max(e["step"] for e in ckpts if e["t"] < fault["t"])
    restored = [e for e in ev if e["kind"] == "phase" and e.get("phase") == "restored"]
    assert sorted(e["replica"] for e in restored) == [0, 1, 2]
    assert {e["from_step"] for e in restored} == {latest} and latest >= 40
    first = min((e for e in ev if e["kind"] == "step" and e["attempt"] == 1), key=lambda e: e["t"])
    assert first["step"] == latest + 1 and first["batch_seed"][1] == latest

    exits = [e for e in ev if e["kind"] == "exit" and e["attempt"] == 1]
    assert {e["reason"] for e in exits} == {"completed"} and len({e["weights"] for e in exits}) == 1
    files = sorted(p.name for p in checkpoint_dir(run.run_dir).iterdir())
    assert files and all(name.startswith("step-") and name.endswith(".pt") for name in files), files
    assert len(files) <= run.spec.checkpoint.keep


def test_stopping_a_run_leaves_no_rank_behind(start_run):
    run = start_run("demo", {"trainer": "ddp-restart", "steps": 1_000_000, "faults": []})
    run.wait_for_step(20, timeout=180)
    ranks = [e["pid"] for e in run.event_records() if e["kind"] == "start" and e.get("role") == "replica"]
    assert len(ranks) == 3
    assert run.stop()["state"] == "stopped"
    run.wait_exited(timeout=30)
    assert run.pids() == []
