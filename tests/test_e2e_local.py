"""End to end on the local executor: the real lighthouse, torchft and submitit.

3 replica groups of torchft-lite; replica 1 is SIGKILLed mid-run through the
public API. From the event log alone: survivors never exited and never went
back, the replacement healed at the survivors' step and committed afterwards,
the weights agree at the end, and every committed step is recorded once.
"""

import json

import pytest

from workbench import analysis
from workbench.cluster.procs import alive as _alive

from .conftest import workbench_cli

pytestmark = pytest.mark.slow


def _committed(df, replica, attempt=None):
    sel = (df["replica"] == replica) & df["committed"].astype(bool)
    if attempt is not None:
        sel &= df["attempt"] == attempt
    return df[sel]


def test_kill_one_replica_survivors_keep_training_and_victim_heals(start_run):
    run = start_run("demo", ["steps=500", "faults=[]"])
    run.wait_for_step(80, timeout=180)
    kill = run.kill(replica=1)
    killed_pid = kill["pid"]
    survivors_step_at_kill = max(
        analysis.max_committed_step(run.events_read, 0), analysis.max_committed_step(run.events_read, 2)
    )
    status = run.wait(timeout=300)
    assert status["state"] == "completed", status
    assert not _alive(killed_pid)

    events = run.events()
    df = run.metrics()
    # Survivors: one attempt each, a clean exit at the target, steps never went back, none lost.
    for r in (0, 2):
        exits = events[(events["kind"] == "exit") & (events["replica"] == r)]
        assert list(exits["attempt"]) == [0] and list(exits["reason"]) == ["completed"]
        steps = _committed(df, r)["step"].to_numpy()
        assert (steps[1:] > steps[:-1]).all()
        assert steps[-1] == 500
    # The victim was relaunched as attempt 1, healed from a live peer at (or after) the survivors' step.
    heals = events[(events["kind"] == "heal") & (events["replica"] == 1) & (events["attempt"] == 1)]
    assert len(heals) == 1, heals
    heal = heals.iloc[0]
    assert heal["step"] >= survivors_step_at_kill and heal["bytes"] > 0
    assert heal["transport"] == "pg"  # the default: torchft's PGTransport, received in place
    after = _committed(df, 1, attempt=1)
    # torchft's async quorum: the step it heals in is committed with the peers' gradients
    # (its own forward ran on the old weights and is zeroed), then it participates.
    assert after["step"].iloc[0] == heal["step"] + 1
    assert after["participating"].iloc[1:].all() and len(after) > 10
    # Three participants again after the rejoin.
    assert df[df["t"] > after["t"].min()]["participants"].max() == 3
    # Every committed step of every replica attempt exactly once.
    committed = df[df["committed"].astype(bool)]
    assert not committed.duplicated(["replica", "attempt", "step"]).any()
    # Same weights everywhere at the end, and at every step where all three reported a checksum.
    final = events[(events["kind"] == "exit") & (events["reason"] == "completed")]
    assert set(final["replica"]) == {0, 1, 2} and final["weights"].nunique() == 1
    sums = committed.dropna(subset=["weights"]).groupby("step")["weights"].nunique()
    assert (sums == 1).all()
    summary = run.summary()
    assert summary["survivor_steps_lost"] == 0 and summary["heals"] >= 1
    assert summary["kill_to_rejoin_s"] is not None and summary["kill_to_rejoin_s"] > 0
    # torchft.rust_log's default, warn: no per-quorum info lines from torchft's Rust side, in a group's
    # stderr or in the lighthouse's log (tests/test_forkserver.py sees them with rust_log=info).
    logs = [
        run.run_dir / "jobs" / str(p) / f"{p}_0_log.err"
        for p in events[(events["kind"] == "start") & events["replica"].notna()]["pid"].astype(int)
    ]
    logs.append(run.run_dir / "lighthouse" / "lighthouse.log")
    assert all(f.exists() for f in logs), logs
    assert not [f for f in logs if "[INFO] [torchft::" in f.read_text()]

    # The CLI sees the same run.
    out = workbench_cli("status", str(run.run_dir), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["state"] == "completed"
    csv = workbench_cli("metrics", str(run.run_dir), "--csv")
    assert csv.returncode == 0 and csv.stdout.count("\n") == len(df) + 1


def test_http_checkpoint_transport_heals_a_replacement_to_the_peers_weights(start_run):
    """``torchft.checkpoint_transport: http`` (torchft's HTTPTransport, the non-default path) still heals:
    the replacement fetches weights and AdamW state over HTTP and ends with its peers' weights."""
    run = start_run("demo", ["steps=150", "faults=[]", "torchft.checkpoint_transport=http"])
    run.wait_for_step(40, timeout=180)
    run.kill(replica=1)
    status = run.wait(timeout=300)
    assert status["state"] == "completed", status
    events = run.events()
    heals = events[(events["kind"] == "heal") & (events["replica"] == 1) & (events["attempt"] == 1)]
    assert len(heals) == 1 and heals.iloc[0]["transport"] == "http" and heals.iloc[0]["bytes"] > 0, heals
    final = events[(events["kind"] == "exit") & (events["reason"] == "completed")]
    assert set(final["replica"]) == {0, 1, 2} and final["weights"].nunique() == 1


def test_hang_is_recorded_and_resumed_and_stop_cleans_up(start_run):
    run = start_run("demo", ["steps=100000", "faults=[]", "replicas=2", "min_replicas=1"])
    run.wait_for_step(20, timeout=180)
    run.kill(replica=0, how="hang", seconds=1.5)
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("action") == "resume" for e in r.events_read), 30)
    step_after_resume = analysis.max_committed_step(run.events_read, 0)
    run.wait_for_step(step_after_resume + 10, replica=0, timeout=60)
    pids = run.pids()
    assert len(pids) >= 4  # controller, lighthouse, two trainers
    status = run.stop()
    assert status["state"] == "stopped"
    assert run.pids() == []
