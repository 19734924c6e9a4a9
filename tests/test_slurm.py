"""torchft-lite replica groups as jobs on a real Slurm cluster (the local dev cluster).

One dev cluster for the module, in a temporary state directory; its finalizer
stops every daemon by the PIDs ``up()`` recorded. Every run is stopped by its
controller, and whatever it left (processes by PID, Slurm jobs by the ids in
its ``submit`` events) is removed in the finalizer, also when a test failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from workbench import analysis
from workbench.cluster.slurm import backend as slurm
from workbench.errors import SpecError

from .conftest import REPO, local_slurm, slurm_prerequisites, slurm_submitter

pytestmark = [pytest.mark.slurm, pytest.mark.slow, *slurm_prerequisites()]

# Slow enough that a kill lands mid-run; small enough for 2 shared cores.
BASE = ["cluster=slurm", "steps=100000", "faults=[]", "model.step_delay_s=0.05"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


@pytest.fixture
def submit(cluster, run_root):
    """``wb.submit`` for this module's cluster; stops each run and removes what it left, by PID and job id."""
    yield from slurm_submitter(cluster["slurm_conf"], "demo", stop_timeout=30)


def queued(conf: str) -> list[str]:
    return slurm.slurm_cmd(conf, "squeue", "-h", "-o", "%i").stdout.split()


def rejoined(replica: int, attempt: int, after_steps: int = 5):
    """Predicate: ``attempt`` of ``replica`` committed ``after_steps`` steps while participating."""

    def check(run) -> bool:
        steps = [
            e
            for e in run.events_read
            if e["kind"] == "step"
            and e.get("replica") == replica
            and e.get("attempt") == attempt
            and e.get("committed")
            and e.get("participating")
        ]
        return len(steps) >= after_steps

    return check


def first_participating(run, replica: int, attempt: int) -> float:
    return min(
        e["t"]
        for e in run.events_read
        if e["kind"] == "step"
        and e.get("replica") == replica
        and e.get("attempt") == attempt
        and e.get("committed")
        and e.get("participating")
    )


def starts(run, replica: int) -> dict[int, dict]:
    return {
        e["attempt"]: e
        for e in run.events_read
        if e["kind"] == "start" and e.get("replica") == replica and e.get("role") == "replica"
    }


def attached(run_dir, code: str) -> dict:
    """Run ``code`` in a fresh Python process with ``run = wb.attach(run_dir)``; it prints one JSON line."""
    script = f"import json, workbench as wb\nrun = wb.attach({str(run_dir)!r})\n{code}"
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_killed_replica_job_is_resubmitted_heals_and_survivors_lose_nothing(submit, cluster):
    run = submit(BASE)
    run.wait_for_step(20, timeout=240)
    assert run.record["spec"]["slurm"]["conf"] == cluster["slurm_conf"]
    for attempt in (1, 2, 3):
        if attempt == 3:
            # A fresh process that only has the run directory kills the current job too.
            fault = attached(run.run_dir, "print(json.dumps(run.kill(replica=1)))")
        else:
            fault = run.kill(replica=1)
        assert fault["action"] == "kill" and fault["target"] == 1
        assert fault["job_id"] == starts(run, 1)[attempt - 1]["job_id"] and fault["node"] in cluster["nodes"]
        run.wait_for(rejoined(1, attempt), timeout=240)

    run.refresh()
    jobs = [str(e["job_id"]) for e in run.events_read if e["kind"] == "submit" and e["replica"] == 1]
    assert len(jobs) == 4 and len(set(jobs)) == 4  # one Slurm job per attempt, never requeued
    ended = {e["job_id"]: e for e in run.events_read if e["kind"] == "job"}
    assert all(not ended[j]["clean"] for j in jobs[:3])
    # a kill is a SIGKILL mid-step, not Slurm's cancel (SIGTERM first), which the group would take as a preemption
    assert [(ended[j].get("signal"), ended[j].get("reason")) for j in jobs[:3]] == [("SIGKILL", "died")] * 3, ended
    exits = [e for e in run.events_read if e["kind"] == "exit" and e.get("replica") == 1 and e["attempt"] < 3]
    assert not [e for e in exits if e.get("reason") == "preempted"], exits
    heals = [e for e in run.events_read if e["kind"] == "heal" and e.get("replica") == 1 and e["attempt"] >= 1]
    assert sorted(e["attempt"] for e in heals) == [1, 2, 3]
    last_rejoin = first_participating(run, 1, 3)
    assert (
        max(
            e.get("participants") or 0
            for e in run.events_read
            if e["kind"] == "step" and e["t"] >= last_rejoin and e.get("committed")
        )
        == 3
    )

    assert run.summary()["survivor_steps_lost"] == 0, run.summary()
    # From each kill to the replacement's first participating commit. (scancel's SIGKILL arrives
    # asynchronously: the killed attempt may still commit a step after the fault event, so only the
    # next attempt counts as the rejoin.)
    kills = [e for e in run.events_read if e["kind"] == "fault" and e.get("action") == "kill"]
    rejoin = [first_participating(run, 1, k["attempt"] + 1) - k["t"] for k in kills]
    print(f"\nkill->rejoin on Slurm: {[round(x, 2) for x in rejoin]} s, median {sorted(rejoin)[1]:.2f} s")
    assert all(x > 1 for x in rejoin)

    status = run.stop()
    assert status["state"] == "stopped"
    run.wait_exited(30)
    assert not set(queued(cluster["slurm_conf"])) & set(jobs)

    # A fresh process sees the whole history: every event, every job id.
    seen = attached(
        run.run_dir,
        "ev = run.events()\nprint(json.dumps({'n': len(ev), 'state': run.state(), "
        "'jobs': sorted(ev[ev.kind == 'submit'].job_id.astype(str))}))",
    )
    assert seen == {
        "n": len(run.events()),
        "state": "stopped",
        "jobs": sorted(str(e["job_id"]) for e in run.events_read if e["kind"] == "submit"),
    }


def test_node_down_under_a_replica_group_it_comes_back_on_another_node(submit, cluster):
    # 3 of a node's 4 CPUs per group: each group has a node to itself and one node stays free.
    run = submit(BASE + ["replicas=2", "min_replicas=1", "slurm.cpus_per_task=3"])
    run.wait_for_step(20, timeout=240)
    before = starts(run, 1)[0]
    assert before["node"] != starts(run, 0)[0]["node"]
    # A hang (SIGSTOP through Slurm) of the other group, resumed by the detached helper.
    hang = run.kill(replica=0, how="hang", seconds=2)
    assert (hang["job_id"], hang["seconds"]) == (starts(run, 0)[0]["job_id"], 2.0)
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "hang" for e in r.events_read), 60)
    run.wait_for_step(analysis.max_committed_step(run.events_read, 0) + 5, replica=0, timeout=60)
    fault = run.fault("node_down", target=1, seconds=5)
    assert (fault["node"], fault["job_id"]) == (before["node"], before["job_id"])
    run.wait_for(rejoined(1, 1), timeout=240)
    after = starts(run, 1)[1]
    assert after["node"] not in (before["node"], starts(run, 0)[0]["node"])
    assert any(e["kind"] == "heal" and e.get("replica") == 1 and e["attempt"] == 1 for e in run.events_read)
    assert run.summary()["survivor_steps_lost"] == 0
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "node_down" for e in r.events_read), 60)
    assert run.stop()["state"] == "stopped"


def test_abort_on_slurm_signals_the_job_and_the_group_comes_back(submit, cluster):
    """The table's `abort` (SIGABRT) needs no Slurm code of its own: `scancel --signal=ABRT --full`."""
    run = submit(BASE + ["replicas=2", "min_replicas=1"])
    run.wait_for_step(10, timeout=240)
    fault = run.kill(replica=1, how="abort")
    assert (fault["action"], fault["job_id"]) == ("abort", starts(run, 1)[0]["job_id"])
    run.wait_for(rejoined(1, 1), timeout=240)
    ended = next(e for e in run.events_read if e["kind"] == "job" and e["replica"] == 1 and e["attempt"] == 0)
    assert ended["clean"] is False
    row = analysis.recovery_timeline(run.event_records()).iloc[0]
    assert row["action"] == "abort" and row["complete"], row
    assert run.stop()["state"] == "stopped"


def test_bad_partition_or_account_is_refused_before_anything_is_queued(cluster, run_root):
    import workbench as wb

    with pytest.raises(SpecError, match=r"slurm.partition: 'no-such-partition' does not exist; allowed: debug"):
        wb.submit("demo", ["cluster=slurm", "slurm.partition=no-such-partition"])
    with pytest.raises(SpecError, match=r"slurm.account: 'no-such-account' is not one of your accounts"):
        wb.submit("demo", ["cluster=slurm", "slurm.account=no-such-account"])
    with pytest.raises(SpecError, match=r"slurm.requeue: .*allowed: false"):
        wb.submit("demo", ["cluster=slurm", "slurm.requeue=true"])
    with pytest.raises(SpecError, match=r"lighthouse.bind_host: '0.0.0.0' is not an address jobs can dial"):
        wb.submit("demo", ["cluster=slurm", "lighthouse.bind_host=0.0.0.0"])
    assert queued(cluster["slurm_conf"]) == []
    assert not run_root.exists() or not any(run_root.iterdir())


def test_partition_of_a_groups_node_survivors_go_on_it_rejoins_and_no_fault_outlives_the_run(submit, cluster):
    from workbench.faults import host as hostfaults

    run = submit(BASE + ["replicas=2", "min_replicas=1", "slurm.cpus_per_task=3"])
    run.wait_for_step(20, timeout=240)
    node = starts(run, 1)[0]["node"]
    assert node != starts(run, 0)[0]["node"]
    fault = run.kill(replica=1, how="partition", seconds=6)
    assert fault["node"] == node and f"wbn-{node}" in hostfaults.links_down()
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "partition" for e in r.events_read), 60)
    back = next(e for e in run.events_read if e.get("resumed") == "partition")
    assert f"wbn-{node}" not in hostfaults.links_down()

    def steps(r, replica, lo, hi=float("inf")):
        return [
            e
            for e in r.events_read
            if e["kind"] == "step"
            and e.get("replica") == replica
            and e.get("committed")
            and e.get("participating", True)
            and lo < e["t"] < hi
        ]

    run.wait_for(lambda r: len(steps(r, 1, back["t"])) >= 5, timeout=240)
    # The survivor committed without it during the cut; the cut-off side committed nothing (bar a step in flight).
    assert any(e.get("participants") == 1 for e in steps(run, 0, fault["t"], back["t"]))
    assert len(steps(run, 1, fault["t"], back["t"])) <= 1  # its step in flight at most, however loaded the machine
    row = analysis.recovery_timeline(run.event_records()).set_index("action").loc["partition"]
    assert row["quorum_without_victim"] < row["replacement_started"] < row["participating"]
    # The controller samples each node's health; the node's link counted the partitioned group's traffic.
    health = run.nodes()
    mine = health[health["node"] == node]
    assert (
        len(mine) and mine["net_sent_bytes"].iloc[-1] > mine["net_sent_bytes"].iloc[0] and mine["rss_bytes"].max() > 0
    )
    assert run.status()["nodes"][node]["health"]["rss_bytes"] > 0  # status --json carries it too
    # Stopped mid-fault: the tbf and the cgroup go with the run.
    run.kill(replica=1, how="slow_link", seconds=600)
    run.kill(replica=0, how="straggler", seconds=600)
    assert f"wbn-{node}" in hostfaults.qdiscs() and len(hostfaults.cgroups(run.id)) == 1
    assert run.stop()["state"] == "stopped"
    assert f"wbn-{node}" not in hostfaults.qdiscs() and hostfaults.cgroups(run.id) == []
