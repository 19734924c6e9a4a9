"""Runs on one machine stay apart (issue #42, item 2).

- A run's lighthouse is the lighthouse the controller started: the listening socket at the address it
  hands the groups is one of its child's own descriptors; another process listening there is refused,
  said in a ``warning``, and its address is handed to no group (workbench/controller/lighthouse.py).
- The fork server speaks to its controller over the two pipes the controller made; it listens on nothing.
- A host fault undo touches only what the run being cleaned up holds, or what an ended run left
  (workbench/faults/host.py owner records; ``cluster down``'s sweep asks the run's directory).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from workbench.controller.lighthouse import Lighthouse, LighthouseSupervisor, free_port, socket_inodes, tcp_listeners
from workbench.devcluster import lifecycle
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.faults import host as hostfaults
from workbench.run import rundir
from workbench.spec.load import load_spec

from .conftest import kill_pids


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


# -- the lighthouse ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stranger_on_the_lighthouse_port_is_refused_and_no_group_is_handed_its_address(start_run):
    """The port is free at submit (preflight checks that), then a stranger takes it before the
    controller's lighthouse binds it (the controller and the lighthouse each import for seconds)."""
    port = free_port()
    run = start_run("demo", {"faults": [], "replicas": 2, "min_replicas": 1, "lighthouse.port": port})
    stranger = socket.socket()
    try:
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stranger.bind(("127.0.0.1", port))  # an OSError here: the lighthouse took it first (it never has)
        stranger.listen(8)
        status = run.wait(timeout=120)
        events = run.event_records()
    finally:
        stranger.close()
    assert status["state"] == "failed", status
    assert [e for e in events if e["kind"] == "lighthouse" and e["state"] == "up"] == []
    assert [e for e in events if e["kind"] in ("submit", "step")] == []
    refusal = [e["message"] for e in events if e["kind"] == "warning" and "lighthouse" in e["message"]]
    assert refusal and f"127.0.0.1:{port} is held by pid {os.getpid()} " in refusal[0], refusal
    assert "not this run's lighthouse" in refusal[0] and "handed to no replica group" in refusal[0]
    end = next(e for e in events if e["kind"] == "run_end")
    assert "not this run's lighthouse" in end["reason"]


@pytest.mark.slow
def test_the_lighthouse_address_is_its_own_socket_and_a_restart_refuses_a_stranger_on_it(tmp_path):
    """The first start binds port 0 and reads back the kernel's answer from the child's own socket;
    a restart that finds another process listening on that address is refused (``warning``, no ``up``),
    and once the address is free again the restart goes through on the same address."""
    run_dir = rundir.create(tmp_path / "runs", "lh-isolation", load_spec("demo").to_dict())
    spec = load_spec("demo", {"lighthouse.restart_delay_s": 0.0})
    writer = EventWriter(run_dir, "controller", run="lh-isolation")
    sup = LighthouseSupervisor(Lighthouse(spec, run_dir / "lighthouse"), run_dir, writer)
    reader = EventReader(run_dir)
    events: list[dict] = []

    def new_events(kind, **match):
        events.extend(reader.poll())
        return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]

    stranger = None
    try:
        sup.start()
        lh = sup.lighthouse
        assert lh.port != 0 and sup.address == f"http://127.0.0.1:{lh.port}"
        at_address = [x for x in tcp_listeners(lh.port) if x.ip == "127.0.0.1"]
        assert at_address and {x.inode for x in at_address} <= socket_inodes(lh.pid)

        first_pid = lh.pid
        lh.proc.kill()
        lh.proc.wait()
        stranger = socket.socket()
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stranger.bind(("127.0.0.1", lh.port))
        stranger.listen(8)

        def refused():
            sup.supervise()
            return [e for e in new_events("warning") if "not this run's lighthouse" in e["message"]]

        warning = _wait(refused, 60, "a restart refused because a stranger listens on the address")[0]
        assert f"held by pid {os.getpid()} " in warning["message"]
        assert new_events("lighthouse", state="up", restarted=True) == []
        stranger.close()
        stranger = None

        def up_again():
            sup.supervise()
            return new_events("lighthouse", state="up", restarted=True)

        up = _wait(up_again, 90, "the restart once the address is free")[0]
        assert up["address"] == sup.address and up["pid"] not in (first_pid, os.getpid())
        assert {x.inode for x in tcp_listeners(lh.port) if x.ip == "127.0.0.1"} <= socket_inodes(lh.pid)
    finally:
        if stranger is not None:
            stranger.close()
        sup.lighthouse.stop()
        writer.close()


@pytest.mark.slow
def test_the_fork_server_speaks_over_its_controllers_pipes_and_listens_on_nothing(tmp_path):
    from workbench.cluster.local.forkexecutor import ForkServer

    spec = load_spec("demo")
    server = ForkServer(spec.trainer, spec.model.model_dump(mode="json"), log=tmp_path / "forkserver.log")
    server.start()
    try:
        assert server.wait_ready(timeout=120)["ready"]
        pid = server.proc.pid
        theirs = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        for ours in (server.proc.stdin, server.proc.stdout):  # requests in, answers out: the pipes we made
            pipe = os.readlink(f"/proc/self/fd/{ours.fileno()}")
            assert pipe.startswith("pipe:[") and pipe in theirs
        unix_listening = {
            int(f[6])
            for f in (line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:])
            if len(f) >= 7 and f[5] == "01" and f[3] == "00010000"  # SS_UNCONNECTED, __SO_ACCEPTCON
        }
        listening = {x.inode for x in tcp_listeners()} | unix_listening
        assert socket_inodes(pid) & listening == set()
    finally:
        server.close()
        if server.proc is not None and server.proc.poll() is None:
            kill_pids([server.proc.pid])


# -- host faults -------------------------------------------------------------------------------------


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=20)


@pytest.fixture
def two_nodes():
    """Two namespaced nodes named as the dev cluster names them (``wbn-<node>`` / ``wbn-<node>p``), with
    no address and no route (nothing leaves the machine); removed after, also on failure."""
    nodes = [f"i{uuid.uuid4().hex[:6]}" for _ in range(2)]
    try:
        for node in nodes:
            ns, host, inside = f"wbn-{node}", f"wbn-{node}", f"wbn-{node}p"
            _ip("netns", "add", ns)
            _ip("link", "add", host, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", host, "up")
            _ip("-n", ns, "link", "set", inside, "up")
        yield nodes
    finally:
        for node in nodes:
            subprocess.run(["ip", "link", "delete", f"wbn-{node}"], capture_output=True, timeout=20)
            subprocess.run(["ip", "netns", "delete", f"wbn-{node}"], capture_output=True, timeout=20)


def _tbf(node: str, inside: bool = False) -> bool:
    ns = ["-n", f"wbn-{node}"] if inside else []
    dev = f"wbn-{node}p" if inside else f"wbn-{node}"
    out = subprocess.run(["tc", *ns, "qdisc", "show", "dev", dev], capture_output=True, text=True, timeout=20)
    return "tbf" in out.stdout


def _down(node: str) -> bool:
    return f"wbn-{node}" in hostfaults.links_down()


def _cgroup_of(pid: int, controller: str) -> str:
    return hostfaults._origin(pid, controller)


@pytest.fixture
def two_runs(tmp_path, two_nodes):
    """Two runs' host faults, made with the real primitives: run A a straggler cgroup (a process of its
    own in it), a partition of node 1 and a slow link on node 2; run B a freeze (a process of its own
    frozen), a slow link on node 1 and a partition of node 2. B's id starts with A's, as two runs' ids
    can (the spec's name is free text). Everything is undone and every process killed by PID after."""
    spec = load_spec("demo").to_dict()
    a_id = rundir.new_run_id("iso")
    a = rundir.create(tmp_path / "runs", a_id, spec)
    b = rundir.create(tmp_path / "runs", f"{a_id}-r1-b", spec)
    n1, n2 = two_nodes
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    made = []
    try:
        before = {p.pid: {c: _cgroup_of(p.pid, c) for c in ("cpu", "freezer")} for p in sleepers}
        made.append(
            hostfaults.confine("straggler", hostfaults.cgroup_name(a.name, 0, "straggler"), [sleepers[0].pid], owner=a)
        )
        made.append(
            hostfaults.confine("freeze", hostfaults.cgroup_name(b.name, 1, "freeze"), [sleepers[1].pid], owner=b)
        )
        made.append(hostfaults.cut_link("partition", n1, owner=a))
        made.append(hostfaults.cut_link("slow_link", n2, owner=a))
        made.append(hostfaults.cut_link("slow_link", n1, owner=b))
        made.append(hostfaults.cut_link("partition", n2, owner=b))
        yield {"a": a, "b": b, "n1": n1, "n2": n2, "sleepers": sleepers, "before": before, "made": made}
    finally:
        for m in made:
            m.undo()
        kill_pids([p.pid for p in sleepers])
        for p in sleepers:
            p.wait(timeout=20)


def _assert_a_undone_and_b_held(w) -> None:
    a, b, n1, n2 = w["a"], w["b"], w["n1"], w["n2"]
    sleep_a, sleep_b = (p.pid for p in w["sleepers"])
    # A's: gone, its process back where it came from.
    assert hostfaults.cgroups(a.name) == []
    assert _cgroup_of(sleep_a, "cpu") == w["before"][sleep_a]["cpu"]
    assert not _down(n1) and not _tbf(n2) and not _tbf(n2, inside=True)
    # B's: all still there.
    (frozen,) = hostfaults.cgroups(b.name)
    assert Path(frozen, "freezer.state").read_text().strip() in ("FREEZING", "FROZEN")
    assert _cgroup_of(sleep_b, "freezer") == f"/{Path(frozen).name}"
    assert _tbf(n1) and _tbf(n1, inside=True) and _down(n2)
    assert {r["run_id"] for r in hostfaults.records().values()} >= {b.name}
    assert a.name not in {r["run_id"] for r in hostfaults.records().values()}


def test_a_run_released_at_its_stop_undoes_only_its_own_host_faults(two_runs):
    w = two_runs
    assert len(hostfaults.cgroups(w["a"].name)) == 1  # B's id starts with A's: not A's cgroup
    # A's stop, told of each link fault its events still show open, one of them now B's (its own
    # partition of node 2 ended, and B partitioned node 2 before A's resume was read).
    undone = hostfaults.release_run(
        w["a"].name, [("partition", w["n1"]), ("slow_link", w["n2"]), ("partition", w["n2"])]
    )
    assert f"partition:{w['n2']}" not in undone
    _assert_a_undone_and_b_held(w)


def test_cluster_down_undoes_only_what_ended_runs_left(two_runs):
    """``cluster down``'s sweep with its own answer to "has this run ended": A has (its ``run_end``
    is in its log), B has not (submitted, its controller not started yet)."""
    w = two_runs
    EventWriter(w["a"], "controller", run=w["a"].name).emit("run_end", state="stopped", reason="test", steps=0)
    assert lifecycle.run_ended(str(w["a"])) and not lifecycle.run_ended(str(w["b"]))
    undone = hostfaults.sweep(lifecycle.run_ended)
    assert not any(w["b"].name in x for x in undone)
    _assert_a_undone_and_b_held(w)


def test_a_run_cannot_cut_a_link_another_run_holds_the_same_fault_on(two_runs):
    w = two_runs
    with pytest.raises(hostfaults.HostFaultError, match=rf"^partition: node {w['n2']}'s link already has a "):
        hostfaults.cut_link("partition", w["n2"], owner=w["a"])
    assert (
        _down(w["n2"]) and hostfaults.records()[hostfaults.link_object(w["n2"], "partition")]["run_id"] == w["b"].name
    )


def test_an_undone_fault_takes_its_owner_record_with_it(two_nodes, tmp_path):
    run = rundir.create(tmp_path / "runs", rundir.new_run_id("iso"), load_spec("demo").to_dict())
    made = hostfaults.cut_link("slow_link", two_nodes[0], owner=run)
    try:
        name = hostfaults.link_object(two_nodes[0], "slow_link")
        assert hostfaults.records()[name] == {
            "run_id": run.name,
            "run_dir": str(run),
            "kind": "slow_link",
            "node": two_nodes[0],
        }
        assert subprocess.run(made.undo_argv(), timeout=30).returncode == 0
        assert name not in hostfaults.records() and not _tbf(two_nodes[0])
    finally:
        made.undo()
