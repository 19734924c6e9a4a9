"""Faults done to the machine (workbench.faults.host): injected, undone, and never outliving their fault."""

import subprocess
import uuid
from pathlib import Path

import pytest

from workbench import analysis
from workbench.cluster.procs import Proc
from workbench.faults import host as hostfaults
from workbench.faults import kinds as faultkinds

pytestmark = pytest.mark.slow


def _cgroup_of(pid: int, controller: str) -> str:
    return hostfaults._origin(pid, controller)


def _steps(run, replica, t0, t1=float("inf")):
    return [
        e
        for e in run.events_read
        if e["kind"] == "step" and e.get("replica") == replica and e.get("committed") and t0 <= e["t"] < t1
    ]


def test_straggler_and_freeze_on_a_local_run_are_undone_and_a_stop_mid_fault_leaves_nothing(start_run):
    run = start_run("demo", {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1, "hang.timeout_s": 2.0})
    run.wait_for_step(20, replica=1, timeout=180)
    pid = run.status()["replicas"]["1"]["pid"]
    before = {c: _cgroup_of(pid, c) for c in ("cpu", "freezer")}

    fault = run.kill(replica=1, how="straggler", seconds=4)
    group = Path(fault["cgroup"])
    assert group.name == f"wbn-{run.id}-r1-straggler" and pid in fault["pids"]
    assert (group / "cpu.cfs_quota_us").read_text().strip() == "25000"
    assert pid in {int(p) for p in (group / "cgroup.procs").read_text().split()}
    run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == "straggler" for e in r.events_read), timeout=30
    )
    assert not group.exists() and _cgroup_of(pid, "cpu") == before["cpu"]

    run.wait_for_step(analysis.max_committed_step(run.events_read, 1) + 5, replica=1, timeout=60)
    fault = run.kill(replica=1, how="freeze", seconds=3)
    group = Path(fault["cgroup"])
    assert (group / "freezer.state").read_text().strip() in ("FREEZING", "FROZEN")
    assert run.status()["replicas"]["1"]["state"] == "hung"
    resumed = run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == "freeze" for e in r.events_read), timeout=30
    )
    resume = next(e for e in resumed.events_read if e.get("resumed") == "freeze")
    assert not group.exists() and _cgroup_of(pid, "freezer") == before["freezer"]
    # Frozen means no step of its own in between; thawed, the same process steps on.
    assert _steps(run, 1, fault["t"] + 0.5, resume["t"] - 0.05) == []
    run.wait_for(lambda r: len(_steps(r, 1, resume["t"])) >= 3, timeout=60)
    assert run.status()["replicas"]["1"]["pid"] == pid

    timeline = analysis.recovery_timeline(run.event_records())
    rows = timeline.set_index("action")
    assert rows.loc["straggler", "replacement_started"] == pytest.approx(4, abs=1.5)
    assert rows.loc["freeze", "replacement_started"] == pytest.approx(3, abs=1.5)
    assert rows.loc["freeze", "participating"] >= rows.loc["freeze", "replacement_started"]

    # Stopped mid-fault: the controller undoes what the fault holds before it exits.
    held = [run.kill(replica=0, how="freeze", seconds=600), run.kill(replica=1, how="straggler", seconds=600)]
    assert len(hostfaults.cgroups(run.id)) == 2
    assert run.stop(timeout=30)["state"] == "stopped"
    assert hostfaults.cgroups(run.id) == []
    # ... and ends the undo helpers that were waiting to do it, and the frozen group's processes ended too.
    assert all(Proc(*f["undo_helper"]).why_not() is not None for f in held)
    assert run.pids() == []


def test_network_kinds_are_refused_in_one_line_where_the_backend_has_no_namespaces():
    with pytest.raises(ValueError, match=r"^'partition' needs nodes in network namespaces .*; cluster local has none"):
        faultkinds.require("partition", "local")
    assert "straggler" in faultkinds.names("local") and "slow_link" not in faultkinds.names("local")


@pytest.fixture
def node_netns():
    """A namespace with a veth named as the dev cluster names a node's (``wbn-<node>``/``wbn-<node>p``), removed after."""
    node = f"t{uuid.uuid4().hex[:6]}"
    ns, host, inside = f"wbn-{node}", f"wbn-{node}", f"wbn-{node}p"
    try:
        for argv in (
            ["netns", "add", ns],
            ["link", "add", host, "type", "veth", "peer", "name", inside],
            ["link", "set", inside, "netns", ns],
            ["link", "set", host, "up"],
            ["-n", ns, "link", "set", inside, "up"],
        ):
            subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=20)
        yield node
    finally:
        subprocess.run(["ip", "link", "delete", host], capture_output=True, timeout=20)
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True, timeout=20)


def _tbf(node, inside=False):
    argv = [
        "tc",
        *(["-n", f"wbn-{node}"] if inside else []),
        "qdisc",
        "show",
        "dev",
        f"wbn-{node}{'p' if inside else ''}",
    ]
    return "tbf" in subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout


def test_partition_and_slow_link_are_undone_and_sweep_finds_what_a_dead_controller_left(node_netns):
    node = node_netns
    made = hostfaults.cut_link("partition", node)
    assert f"wbn-{node}" in hostfaults.links_down()
    made.undo()
    assert f"wbn-{node}" not in hostfaults.links_down()

    made = hostfaults.cut_link("slow_link", node)
    assert _tbf(node) and _tbf(node, inside=True)
    made.undo()
    assert not _tbf(node) and not _tbf(node, inside=True)

    # Nobody left to undo them (the controller and the helper died): `cluster down`'s sweep finds them by name.
    hostfaults.cut_link("partition", node)
    hostfaults.cut_link("slow_link", node)
    hostfaults.confine("straggler", f"wbn-sweeptest-{node}-r0-straggler", [])
    assert set(hostfaults.leftovers()) >= {f"down:wbn-{node}", f"tbf:wbn-{node}"}
    hostfaults.sweep()
    assert [x for x in hostfaults.leftovers() if node in x] == []

    with pytest.raises(hostfaults.HostFaultError, match="has no network namespace"):
        hostfaults.cut_link("partition", "nosuchnode")
