"""Faults done to the machine (workbench.faults.host): injected, undone, and never outliving their fault."""

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from workbench import analysis
from workbench.cluster.procs import Proc
from workbench.faults import host as hostfaults
from workbench.faults import kinds as faultkinds

from .conftest import workbench_cli

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
    frozen_from, frozen_until = _frozen_span(group)
    resumed = run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == "freeze" for e in r.events_read), timeout=30
    )
    resume = next(e for e in resumed.events_read if e.get("resumed") == "freeze")
    assert not group.exists() and _cgroup_of(pid, "freezer") == before["freezer"]
    # Frozen means no step of its own while the freezer said FROZEN (read here, not guessed from the fault's
    # time: on a loaded machine freezing takes a while); thawed, the same process steps on.
    assert frozen_until - frozen_from > 1.0, (frozen_from, frozen_until)
    assert _steps(run, 1, frozen_from, frozen_until) == []
    run.wait_for(lambda r: len(_steps(r, 1, resume["t"])) >= 3, timeout=60)
    assert run.status()["replicas"]["1"]["pid"] == pid

    # Each held its seconds (the undo's timer starts just before the fault is recorded). How late the detached
    # helper undoes one on a loaded machine is a speed figure: ``thawed_s`` of ``python -m bench.netfaults``.
    timeline = analysis.recovery_timeline(run.event_records())
    rows = timeline.set_index("action")
    assert rows.loc["straggler", "replacement_started"] >= 4 - 0.5
    assert rows.loc["freeze", "replacement_started"] >= 3 - 0.5
    assert rows.loc["freeze", "participating"] >= rows.loc["freeze", "replacement_started"]

    # Stopped mid-fault: the controller undoes what the fault holds before it exits.
    held = [run.kill(replica=0, how="freeze", seconds=600), run.kill(replica=1, how="straggler", seconds=600)]
    assert len(hostfaults.cgroups(run.id)) == 2
    assert run.stop(timeout=30)["state"] == "stopped"
    assert hostfaults.cgroups(run.id) == []
    # ... and ends the undo helpers that were waiting to do it, and the frozen group's processes ended too.
    assert all(Proc(*f["undo_helper"]).why_not() is not None for f in held)
    assert run.pids() == []


def test_a_controller_killed_mid_fault_leaves_no_host_fault_behind(start_run):
    """The controller is SIGKILLed (the OOM killer, say) while group 1 is frozen for 3 s and group 0 throttled
    for 10 min. Nothing of the controller runs its shutdown. The freeze is thawed on time by its detached undo
    helper, which needs no controller, and the frozen process steps on; the throttle is still there, and
    the next command that ends the run (``workbench stop``, which finds the controller gone) undoes it."""
    run = start_run("demo", {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1})
    run.wait_for_step(20, replica=1, timeout=180)
    pids = {r: run.status()["replicas"][str(r)]["pid"] for r in (0, 1)}
    freezer_before = _cgroup_of(pids[1], "freezer")
    frozen = run.kill(replica=1, how="freeze", seconds=3)
    throttled = run.kill(replica=0, how="straggler", seconds=600)
    assert sorted(hostfaults.cgroups(run.id)) == sorted([frozen["cgroup"], throttled["cgroup"]])

    controller = run._controller
    os.kill(controller.pid, signal.SIGKILL)
    assert controller.wait(timeout=30) == -signal.SIGKILL
    run.wait_for(lambda r: r.state() == "lost", timeout=30)

    resumed = run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == "freeze" for e in r.events_read), timeout=60
    )
    resume = next(e for e in resumed.events_read if e.get("resumed") == "freeze")
    assert resume["t"] - frozen["t"] >= 3 - 0.5
    assert not Path(frozen["cgroup"]).exists() and _cgroup_of(pids[1], "freezer") == freezer_before
    run.wait_for(lambda r: len(_steps(r, 1, resume["t"])) >= 3, timeout=120)  # thawed: the same process steps on
    assert run.status()["replicas"]["1"]["pid"] == pids[1]

    assert Path(throttled["cgroup"]).exists()
    assert pids[0] in {int(p) for p in Path(throttled["cgroup"], "cgroup.procs").read_text().split()}
    stopped = workbench_cli("stop", str(run.run_dir))
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert hostfaults.cgroups(run.id) == []
    assert Proc(*throttled["undo_helper"][:3]).why_not() is not None  # its helper, with nothing left to undo, ended
    assert run.pids() == []


def _frozen_span(group: Path, timeout: float = 60.0) -> tuple[float, float]:
    """Poll ``group``'s freezer until the cgroup is gone: the wall-clock span over which it read FROZEN,
    each end on the safe side (the first stamped after a read said FROZEN, the last before one did)."""
    first = last = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t_before = time.time()
        try:
            state = (group / "freezer.state").read_text().strip()
        except OSError:
            break  # removed: the undo ran
        if state == "FROZEN":
            if first is None:
                first = time.time()
            else:
                last = t_before
        elif first is not None:
            break  # thawing
        time.sleep(0.02)
    assert first is not None and last is not None, f"{group} never read FROZEN twice"
    return first, last


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


def test_partition_and_slow_link_are_undone_and_sweep_finds_those_nothing_is_left_to_undo(node_netns):
    node = node_netns
    made = hostfaults.cut_link("partition", node)
    assert f"wbn-{node}" in hostfaults.links_down()
    made.undo()
    assert f"wbn-{node}" not in hostfaults.links_down()

    made = hostfaults.cut_link("slow_link", node)
    assert _tbf(node) and _tbf(node, inside=True)
    made.undo()
    assert not _tbf(node) and not _tbf(node, inside=True)

    # Made with no undo helper (as if theirs had died: a real dead controller with a cgroup kind is the test
    # above; a link kind needs the dev cluster's namespaces): `cluster down`'s sweep finds them by name.
    hostfaults.cut_link("partition", node)
    hostfaults.cut_link("slow_link", node)
    hostfaults.confine("straggler", f"wbn-sweeptest-{node}-r0-straggler", [])
    assert set(hostfaults.leftovers()) >= {f"down:wbn-{node}", f"tbf:wbn-{node}"}
    hostfaults.sweep()
    assert [x for x in hostfaults.leftovers() if node in x] == []

    with pytest.raises(hostfaults.HostFaultError, match="has no network namespace"):
        hostfaults.cut_link("partition", "nosuchnode")
