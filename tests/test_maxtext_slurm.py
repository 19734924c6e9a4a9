"""MaxText as one JAX program over two Slurm nodes (the real local Slurm, ``.venv-maxtext``).

One job of ``slurm.nodes: 2``: one wrapper and one MaxText process per node, MaxText's own
``jax.distributed`` start (hardware ``cpu``: XPK's environment), the coordinator on the first
node at its Slurm ``NodeAddr``, gloo between the processes. A node is lost mid-run, two ways:
set DOWN (Slurm fails the job and signals its processes first), or every process of the second
node's task SIGKILLed at once (nothing is told). Each time the controller resubmits the job and
the new one resumes from the last checkpoint Orbax had committed. With a hot spare, a second job
already waiting on two other nodes takes over instead.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from pathlib import Path

import psutil
import pytest

from workbench.cluster.slurm import backend as slurm
from workbench.devcluster import netns
from workbench.errors import SpecError
from workbench.trainers.maxtext import command as maxtext_command
from workbench.trainers.maxtext.output import marker_fact
from workbench.trainers.placement import node_address

from .conftest import committed_before, local_slurm, slurm_prerequisites, slurm_submitter

pytestmark = [
    pytest.mark.maxtext,
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not maxtext_command.maxtext_python().exists(),
        reason=f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh",
    ),
    *slurm_prerequisites(),
]

TWO_NODES = ["cluster=slurm", "slurm.nodes=2", "steps=100000", "max_restarts=2"]
START_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


@pytest.fixture
def submit(cluster, run_root):
    """``wb.submit`` for this module's cluster; stops each run and removes what it left, by PID and job id."""
    yield from slurm_submitter(cluster["slurm_conf"], "maxtext-cpu-tiny", stop_timeout=60)


def of_attempt(run, kind: str, attempt: int) -> list[dict]:
    return [e for e in run.events_read if e["kind"] == kind and e.get("replica") == 0 and e.get("attempt") == attempt]


def phase(run, name: str, attempt: int) -> dict | None:
    return next((e for e in of_attempt(run, "phase", attempt) if e["phase"] == name), None)


def task_processes(job_id: str, rank: int) -> list[psutil.Process]:
    """Every process of one task of a Slurm job (its wrapper and MaxText), by the task's Slurm environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_PROCID") == str(rank) and "SLURM_STEP_ID" in env:
            found.append(proc)
    return found


def _ip(text: str) -> str:
    """An IPv4-mapped IPv6 address (gRPC's dual-stack socket bound to an IPv4 address) as the IPv4 one."""
    addr = ipaddress.ip_address(text)
    return str(getattr(addr, "ipv4_mapped", None) or addr)


def job_listeners(procs: list[psutil.Process], nodes: list[str]) -> set[tuple[str, int]]:
    """(address, port) of every TCP listener of ``procs``. On namespaced nodes read inside each node's
    namespace (``ss`` there): psutil matches sockets only against this process's own namespace's tables."""
    pids = {p.pid for p in procs}
    if all(os.path.exists(f"/run/netns/{netns.namespace(n)}") for n in nodes):
        return {
            (_ip(host), port)
            for n in nodes
            for host, port, proc in netns.listeners(n)
            if any(f"pid={pid}," in proc for pid in pids)
        }
    return {
        (_ip(c.laddr.ip), c.laddr.port)
        for p in procs
        for c in p.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    }


def test_two_node_job_loses_a_node_and_resumes_from_its_last_checkpoint(submit, cluster):
    run = submit(TWO_NODES)
    run.wait_for(lambda r: any(e["step"] >= 25 for e in of_attempt(r, "step", 0)), timeout=START_TIMEOUT_S)
    start0 = of_attempt(run, "start", 0)[0]
    assert start0["world_size"] == 2
    assert len(set(start0["nodes"])) == 2 and set(start0["nodes"]) <= set(cluster["nodes"])
    port = maxtext_command.coordinator_port(str(start0["job_id"]))
    coordinator = f"{node_address(start0['nodes'][0])}:{port}"
    assert start0["coordinator"] == coordinator and port != maxtext_command.MAXTEXT_CPU_PORT
    logs = Path(run.run_dir) / "maxtext"
    rank0, rank1 = (logs / "attempt-0.log").read_text(), (logs / "attempt-0.rank-1.log").read_text()
    # JAX's and MaxText's own lines: one program of two processes, one CPU device each.
    assert f"Starting JAX distributed service on {coordinator}" in rank0
    assert "Jax process id is 1" in rank1 and "Num_devices: 2" in rank1
    assert "Rank 1 is connected to 1 peer ranks" in rank1  # gloo
    rank1_steps = [
        json.loads(line)["step"] for line in (logs / "metrics.attempt-0.rank-1.jsonl").read_text().splitlines()
    ]
    assert max(rank1_steps) >= 20
    # Every listener of the job's processes (JAX's coordinator, gloo) on its node's address, none on a wildcard.
    allowed = {node_address(n) for n in start0["nodes"]}
    procs = [p for rank in (0, 1) for p in task_processes(str(start0["job_id"]), rank)]
    listeners = job_listeners(procs, start0["nodes"])
    assert (coordinator.rsplit(":", 1)[0], port) in listeners
    assert len(listeners) >= 3 and {ip for ip, _ in listeners} <= allowed, listeners  # coordinator + gloo per rank

    fault = run.fault("node_down", target=0, seconds=20)
    assert (fault["node"], fault["job_id"]) == (start0["nodes"][0], start0["job_id"])
    restored = run.wait_for(lambda r: phase(r, "restored", 1), timeout=START_TIMEOUT_S) and phase(run, "restored", 1)
    start1 = of_attempt(run, "start", 1)[0]
    assert start1["job_id"] != start0["job_id"] and start1["world_size"] == 2
    assert fault["node"] not in start1["nodes"]
    ckpt_dir = maxtext_command.checkpoint_dir(run.run_dir, run.run_dir.name)
    last_durable = max(committed_before(ckpt_dir, start1["t"]))
    assert restored["from_step"] == last_durable + 1 >= 11  # event steps count completed steps
    run.wait_for(
        lambda r: any(e["step"] >= restored["from_step"] + 5 for e in of_attempt(r, "step", 1)), timeout=START_TIMEOUT_S
    )
    assert min(e["step"] for e in of_attempt(run, "step", 1)) == restored["from_step"] + 1
    # Process 1 compiled from the persistent cache too: its own entries, written by attempt 0 (launcher.py).
    rank1 = (logs / "attempt-1.rank-1.log").read_text().splitlines()
    compiled = [f for f in map(marker_fact, rank1) if f and f.get("phase") == "compiled"]
    assert compiled and compiled[0]["compile_cache_hits"] > 0, compiled
    first = phase(run, "first_step", 1)
    print(f"\nMaxText 2 processes: node_down -> first step {first['t'] - fault['t']:.1f} s")
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "node_down" for e in r.events_read), 60)
    assert run.stop(timeout=60)["state"] == "stopped"


def test_lost_task_ends_the_job_at_once_and_it_resumes_from_its_last_checkpoint(submit, cluster):
    run = submit(TWO_NODES)
    run.wait_for(lambda r: any(e["step"] >= 25 for e in of_attempt(r, "step", 0)), timeout=START_TIMEOUT_S)
    start0 = of_attempt(run, "start", 0)[0]
    lost = task_processes(str(start0["job_id"]), 1)
    assert len(lost) >= 2, lost  # the wrapper and its MaxText
    for proc in lost:
        proc.kill()
    killed_at = time.time()
    restored = run.wait_for(lambda r: phase(r, "restored", 1), timeout=START_TIMEOUT_S) and phase(run, "restored", 1)
    start1 = of_attempt(run, "start", 1)[0]
    assert start1["job_id"] != start0["job_id"] and start1["world_size"] == 2
    ended = next(e for e in run.events_read if e["kind"] == "job" and e.get("attempt") == 0)
    assert ended["clean"] is False
    # srun --kill-on-bad-exit ended the job; JAX's own heartbeat timeout (100 s) never had to.
    rank0 = (Path(run.run_dir) / "maxtext" / "attempt-0.log").read_text()
    assert "stopped sending heartbeats" not in rank0
    ckpt_dir = maxtext_command.checkpoint_dir(run.run_dir, run.run_dir.name)
    last_durable = max(committed_before(ckpt_dir, start1["t"]))
    assert restored["from_step"] == last_durable + 1 >= 11
    run.wait_for(
        lambda r: any(e["step"] >= restored["from_step"] + 5 for e in of_attempt(r, "step", 1)), timeout=START_TIMEOUT_S
    )
    assert min(e["step"] for e in of_attempt(run, "step", 1)) == restored["from_step"] + 1
    first = phase(run, "first_step", 1)
    print(f"\nMaxText 2 processes: task killed -> first step {first['t'] - killed_at:.1f} s")
    assert run.stop(timeout=60)["state"] == "stopped"


def test_a_hot_spare_job_takes_over_a_lost_node_with_its_imports_done(submit, cluster):
    """``spares: 1``: a second job of two whole nodes waits with jax and MaxText imported on each
    (``trainers/maxtext/spare.py``). When the job's node goes DOWN the spare becomes attempt 1 at once,
    its processes forked from their standbys, and restores the last durable checkpoint."""
    run = submit([*TWO_NODES, "spares=1"])
    run.wait_for(lambda r: any(e["step"] >= 25 for e in of_attempt(r, "step", 0)), timeout=START_TIMEOUT_S)
    run.wait_for(lambda r: any(e.get("phase") == "spare_ready" for e in r.events_read), timeout=START_TIMEOUT_S)
    spare = [e for e in run.events_read if e.get("spare") == 0 and e.get("replica") is None]
    spare_start = next(e for e in spare if e["kind"] == "start")
    assert next(e for e in spare if e.get("phase") == "spare_ready")["warm"] is True
    start0 = of_attempt(run, "start", 0)[0]
    # Whole nodes: a node's fault must not end the spare with the job it replaces.
    assert len(set(spare_start["nodes"])) == 2 and not set(spare_start["nodes"]) & set(start0["nodes"])

    fault = run.fault("node_down", target=0, seconds=20)
    restored = run.wait_for(lambda r: phase(r, "restored", 1), timeout=START_TIMEOUT_S) and phase(run, "restored", 1)
    restart = next(e for e in run.events_read if e["kind"] == "restart" and e.get("attempt") == 1)
    start1 = of_attempt(run, "start", 1)[0]
    assert restart["spare"] == 0 and start1["from_spare"] == 0
    assert start1["job_id"] == spare_start["job_id"] == restart["job_id"] != start0["job_id"]
    assert start1["nodes"] == spare_start["nodes"] and fault["node"] not in start1["nodes"]
    submits = [e for e in run.events_read if e["kind"] == "submit" and e.get("replica") == 0]
    assert [e["attempt"] for e in submits] == [0]  # no job was submitted for attempt 1
    assert phase(run, "launched", 1)["warm"] is True and phase(run, "imports_done", 1)["warm"] is True
    rank1 = (Path(run.run_dir) / "maxtext" / "attempt-1.rank-1.log").read_text().splitlines()
    imported = [f for f in map(marker_fact, rank1) if f and f.get("phase") == "imports_done"]
    assert imported and imported[0]["warm"] is True, imported
    ckpt_dir = maxtext_command.checkpoint_dir(run.run_dir, run.run_dir.name)
    assert restored["from_step"] == max(committed_before(ckpt_dir, start1["t"])) + 1 >= 11
    run.wait_for(
        lambda r: any(e["step"] >= restored["from_step"] + 5 for e in of_attempt(r, "step", 1)), timeout=START_TIMEOUT_S
    )
    assert min(e["step"] for e in of_attempt(run, "step", 1)) == restored["from_step"] + 1
    first = phase(run, "first_step", 1)
    print(f"\nMaxText 2 processes with a hot spare: node_down -> first step {first['t'] - fault['t']:.1f} s")
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "node_down" for e in r.events_read), 60)
    assert run.stop(timeout=60)["state"] == "stopped"


def test_multi_process_spec_errors_before_anything_is_queued(cluster, run_root):
    import workbench as wb

    with pytest.raises(SpecError, match=r"^maxtext.skip_jax_distributed_system: true .* 2 processes.*allowed: false$"):
        wb.submit("maxtext-cpu-tiny", [*TWO_NODES, "maxtext.skip_jax_distributed_system=true"])
    with pytest.raises(SpecError, match=r"^maxtext.hardware: 'tpu' cannot run as 4 processes.*allowed: cpu, gpu"):
        wb.submit("maxtext-cpu-tiny", [*TWO_NODES, "slurm.tasks_per_node=2", "maxtext.hardware=tpu"])
    assert slurm.slurm_cmd(cluster["slurm_conf"], "squeue", "-h", "-o", "%i").stdout.split() == []
    assert not run_root.exists() or not any(run_root.iterdir())
