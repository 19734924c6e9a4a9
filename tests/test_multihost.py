"""A multi-host cluster on one machine: the dev Slurm's nodes in their own network namespaces.

The fold's node tests run on events a real ``EventWriter`` wrote. The cluster
tests bring the namespaced dev cluster up in a temporary state directory (and
down, by PID, also on failure); the live test runs titan with two replica
groups of two nodes each and checks every listener of its processes, then
kills one group and follows its heal across the bridge on the veth counters.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from workbench import devcluster
from workbench.devcluster import netns
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.state.fold import RunState

from .conftest import REPO, assert_slurmds_listen_on_their_nodes, local_slurm, slurmd_pids, tcp_listeners, workbench_cli

TEST_NET = ipaddress.ip_network("198.18.0.0/15")
NEEDS_CLUSTER = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        any(shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}") for p in devcluster.REQUIRED_PROGRAMS),
        reason=f"Slurm is not installed; {devcluster.INSTALL_HINT}",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces, veth and the bridge need root"),
]


def needs_cluster(test):
    for mark in NEEDS_CLUSTER:
        test = mark(test)
    return test


# -- the fold: nodes first-class ------------------------------------------------
def _fold(tmp_path, writes) -> RunState:
    for name, replica, attempt, kind, fields in writes:
        w = EventWriter(tmp_path, name, run="r", replica=replica, attempt=attempt)
        w.emit(kind, **fields)
        w.close()
    state = RunState(3)
    state.apply(EventReader(tmp_path).poll())
    return state


def test_node_down_takes_every_group_with_a_part_on_that_node(tmp_path):
    """Group 0 spans n1+n2, group 1 is on n2, group 2 on n3: n2 DOWN (aimed at group 1) ends 0 and 1."""
    starts = [
        ("replica-0.attempt-0", 0, 0, "start", {"role": "replica", "task": 0, "node": "n1", "address": "198.18.0.11"}),
        (
            "replica-0.attempt-0.task-1",
            0,
            0,
            "start",
            {"role": "task", "task": 1, "node": "n2", "address": "198.18.0.12"},
        ),
        ("replica-1.attempt-0", 1, 0, "start", {"role": "replica", "node": "n2", "address": "198.18.0.12"}),
        ("replica-2.attempt-0", 2, 0, "start", {"role": "replica", "node": "n3", "address": "198.18.0.13"}),
    ]
    state = _fold(tmp_path, starts)
    assert [(p.node, p.address) for p in state.nodes.placement(0, 0)] == [("n1", "198.18.0.11"), ("n2", "198.18.0.12")]
    w = EventWriter(tmp_path, "control-1", run="r")
    w.emit("fault", action="node_down", target=1, node="n2", replica_hit=1)
    w.close()
    state = _fold(tmp_path, [])
    assert {r: v.state for r, v in state.replicas.items()} == {0: "dead", 1: "dead", 2: "starting"}
    rows = {row["node"]: row for row in state.nodes.table(state.attempts())}
    assert rows["n2"]["state"] == "down" and rows["n2"]["fault"] == "node_down"
    assert [(p["replica"], p["task"]) for p in rows["n2"]["parts"]] == [(0, 1), (1, 0)]
    assert rows["n1"]["state"] == "up" and rows["n3"]["address"] == "198.18.0.13"

    # Its undo brings n2 back; group 0's next attempt on n1+n4 is no longer on n2.
    w = EventWriter(tmp_path, "undo-1", run="r")
    w.emit("fault", action="resume", resumed="node_down", target="n2", node="n2")
    w.close()
    _fold(
        tmp_path,
        [
            ("replica-0.attempt-1", 0, 1, "start", {"role": "replica", "task": 0, "node": "n1"}),
            ("replica-0.attempt-1.task-1", 0, 1, "start", {"role": "task", "task": 1, "node": "n4"}),
        ],
    )
    state = _fold(tmp_path, [])
    assert state.replicas[0].state == "starting" and state.replicas[0].attempt == 1
    assert state.nodes.groups_on("n2", state.attempts()) == [1]
    assert state.nodes.nodes["n2"].state == "up"
    # a task>0 start is placement only: the group's process is still task 0's
    assert state.replicas[0].node == "n1"


def test_dashboard_node_view_shows_a_two_node_group_on_both_nodes(tmp_path):
    from workbench.widgets.state import DashboardState

    state = DashboardState(2, 10)
    w0 = EventWriter(tmp_path, "replica-0.attempt-0", run="r", replica=0, attempt=0)
    w0.emit("start", role="replica", task=0, node="n1", address="198.18.0.11", pid=11)
    w1 = EventWriter(tmp_path, "replica-0.attempt-0.task-1", run="r", replica=0, attempt=0)
    w1.emit("start", role="task", task=1, node="n2", address="198.18.0.12", pid=12)
    for w in (w0, w1):
        w.close()
    state.apply(EventReader(tmp_path).poll())
    rows = state.node_rows()
    assert [(r["node"], r["address"], [p["pid"] for p in r["parts"]]) for r in rows] == [
        ("n1", "198.18.0.11", [11]),
        ("n2", "198.18.0.12", [12]),
    ]


def test_a_heal_records_the_route_it_took():
    """The ``heal`` fields: source address, this side's address and interface, bytes/s (torchft issue 329)."""
    from workbench.trainers.loopback import heal_fields

    got = heal_fields("http://127.0.0.1:4321/checkpoint/", 2.0, 5_000_000)
    assert got == {
        "served_from": "127.0.0.1",
        "local_address": "127.0.0.1",
        "interface": "lo",
        "bytes_per_s": 2_500_000.0,
    }


_TWO_RANKS = """
import os, sys, threading, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from workbench.trainers.titan import cpu_patches as titan_cpu
if titan_cpu.needed():
    titan_cpu.apply()
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.models.common.linear import Linear
from workbench.trainers.titan.rank_state import load_local_model_state, local_model_state

def within(fn, seconds):
    done = []
    t = threading.Thread(target=lambda: done.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    return bool(done)

rank, port = int(sys.argv[1]), int(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=__import__("datetime").timedelta(seconds=60))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
torch.manual_seed(0)
qkv = FusedQKVLinear.Config(head_dim=4, n_heads=2, n_kv_heads=1,
                            wqkv=Linear.Config(in_features=8, out_features=16)).build()
fully_shard(qkv, mesh=init_device_mesh("cpu", (2,)))
mine = local_model_state([qkv])
shapes = {k: tuple(v.shape) for k, v in mine.items()}
if rank == 1:  # rank 1 heals alone, as at step 0; rank 0 does not take part
    ok = within(lambda: load_local_model_state([qkv], {k: torch.full_like(v, 7.0) for k, v in mine.items()}), 20)
    store.set("healed", "1")
    print({"shapes": shapes, "healed_alone": ok,
           "all_seven": all(bool((t == 7.0).all()) for t in local_model_state([qkv]).values())})
    sys.stdout.flush()
    store.wait(["checked"])  # alive, but in no collective, while rank 0 tries
    store.set("bye", "1")
else:
    store.wait(["healed"])
    # torchtitan's own state_dict, on one rank, serialized as torchft's HTTP transport does
    hook_alone = within(lambda: torch.save(qkv.state_dict(), __import__("io").BytesIO()), 5)
    print({"shapes": shapes, "state_dict_alone_returned": hook_alone,
           "rank0_untouched": not any(bool((t == 7.0).all()) for t in local_model_state([qkv]).values())})
    store.set("checked", "1")
    store.wait(["bye"])  # rank 0 hosts the store: rank 1 must have read "checked" before it goes
sys.stdout.flush()
os._exit(0)
"""


def test_a_rank_heals_alone_without_its_group():
    """Why the two-node groups never committed, and the fix (``titan_rank`` problem 4).

    Two ranks of one group shard torchtitan's fused QKV projection (FSDP2 over
    gloo). Rank 1 loads a peer's state into its own shards while rank 0 does
    nothing, as torchft's step-0 heal has it: that returns, rank 1's shards
    change and rank 0's do not. torchtitan's own ``state_dict()`` on rank 0
    alone cannot be serialized (its hook all-gathers ``wqkv``; the gather is
    waited for when the transport reads the tensor): the reason it is not used.
    """
    pytest.importorskip("torchtitan")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _TWO_RANKS, str(r), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for r in (0, 1)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    r0, r1 = (eval(o[0].strip().splitlines()[-1]) for o in outs)
    assert r1["shapes"] == r0["shapes"] and r1["shapes"]["wqkv.weight"] == (8, 8), r1  # each rank holds half
    assert r1["healed_alone"] and r1["all_seven"], r1
    assert r0["rank0_untouched"], r0
    assert not r0["state_dict_alone_returned"], "torchtitan's state_dict() no longer all-gathers: see titan_rank 4."


# -- the namespaced cluster -----------------------------------------------------
def test_a_nodes_hosts_file_names_this_host_at_the_node_and_keeps_every_other_name(tmp_path):
    """slurmd's /etc/hosts on node n2: this host's name at n2's address only; localhost and the rest as they were."""
    from workbench.devcluster.config import write_hosts
    from workbench.devcluster.layout import Layout

    etc_hosts = tmp_path / "hosts"
    etc_hosts.write_text("127.0.0.1 localhost\n127.0.0.1 runsc box # here\n::1 localhost ip6-localhost\n10.0.0.5 box\n")
    layout = Layout(tmp_path / "state")
    layout.etc.mkdir(parents=True)
    paths = write_hosts(layout, {"n1": "198.18.0.11", "n2": "198.18.0.12"}, hostname="box", etc_hosts=etc_hosts)
    names: dict[str, list[str]] = {}
    for line in paths["n2"].read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            names.setdefault(name, []).append(fields[0])
    assert names == {
        "localhost": ["127.0.0.1", "::1"],
        "runsc": ["127.0.0.1"],
        "ip6-localhost": ["::1"],
        "box": ["198.18.0.12"],
    }, paths["n2"].read_text()


@needs_cluster
def test_down_removes_the_hosts_files_a_crashed_up_left(tmp_path):
    from workbench.devcluster.config import write_hosts
    from workbench.devcluster.layout import Layout, write_state

    layout = Layout(tmp_path)
    layout.etc.mkdir(parents=True)
    write_state(layout, {"ports": {}, "user": "root", "daemons": {}, "network": None})
    paths = write_hosts(layout, netns.addresses(devcluster.NODES))
    assert all(p.is_file() for p in paths.values())
    result = workbench_cli("cluster", "down", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert not [p for p in paths.values() if p.exists()]


def _ours() -> dict:
    return netns.ours()


@needs_cluster
def test_down_removes_what_a_crashed_up_left(tmp_path):
    """What a crashed ``up`` leaves (a namespace, the bridge, a veth, a qdisc) goes with ``cluster down``."""
    subprocess.run(["ip", "netns", "add", netns.namespace("n2")], check=True)
    subprocess.run(["ip", "link", "add", netns.BRIDGE, "type", "bridge"], check=True)
    subprocess.run(
        ["ip", "link", "add", netns.host_link("n9"), "type", "veth", "peer", "name", netns.node_link("n9")], check=True
    )
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            netns.host_link("n9"),
            "root",
            "tbf",
            "rate",
            "1mbit",
            "burst",
            "32kbit",
            "latency",
            "400ms",
        ],
        check=True,
    )
    try:
        assert netns.namespace("n2") in _ours()["netns"]
        result = workbench_cli("cluster", "down", "--dir", str(tmp_path / "never-up"))
        assert result.returncode == 0, result.stderr
        assert _ours() == {"netns": [], "links": []}
    finally:
        netns.remove_all()


def test_where_namespaces_cannot_be_made_up_says_so_in_one_line_and_nodes_are_logical():
    """An unprivileged process cannot make a namespace: the probe says why, ``up`` would fall back."""
    if os.geteuid() != 0:
        pytest.skip("setpriv to another user needs root")
    code = (
        "from workbench.devcluster.lifecycle import _network\n"
        "import json; lines = []\n"
        "net = _network(True, lines.append)\n"
        "print(json.dumps({'net': net, 'lines': lines}))"
    )
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["net"]["mode"] == "logical" and set(got["net"]["nodes"].values()) == {"127.0.0.1"}
    assert len(got["lines"]) == 1 and "no network namespaces" in got["lines"][0] and "\n" not in got["lines"][0]


@needs_cluster
def test_logical_nodes_run_jobs_and_the_head_daemons_listen_on_loopback_only(tmp_path):
    """``up(namespaces=False)``, the fallback: every node on 127.0.0.1, a job runs on n2, and slurmctld and
    slurmdbd listen on 127.0.0.1 only, and each slurmd on 127.0.0.1 at its own port (never a wildcard, which
    would be every interface of the machine)."""
    with local_slurm(tmp_path / "slurm", namespaces=False) as info:
        assert info["network"]["mode"] == "logical" and set(info["network"]["nodes"].values()) == {"127.0.0.1"}
        out = subprocess.run(
            ["srun", "-w", "n2", "-A", info["account"], "hostname"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SLURM_CONF": info["slurm_conf"]},
        )
        assert out.returncode == 0, out.stderr
        daemons = {d: info["pids"][d] for d in HEAD_DAEMONS}
        listeners = tcp_listeners([*daemons.values(), *slurmd_pids(info).values()], {})
        assert {(lst[1], lst[2]) for lst in listeners} == {("127.0.0.1", port) for port in info["ports"].values()}, (
            listeners
        )
        assert_slurmds_listen_on_their_nodes(listeners, info)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


@needs_cluster
def test_up_puts_each_node_in_its_own_namespace(cluster):
    if cluster["network"]["mode"] != "netns":
        pytest.fail(f"namespaces not made: {cluster['network']}")
    result = workbench_cli("cluster", "status", "--json", "--dir", cluster["state_dir"])
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    nodes = status["network"]["nodes"]
    assert sorted(nodes) == sorted(devcluster.NODES)
    addresses = [n["address"] for n in nodes.values()]
    assert len(set(addresses)) == len(addresses)
    head = status["network"]["head"]
    for name, node in nodes.items():
        assert ipaddress.ip_address(node["address"]) in TEST_NET and node["state"] == "idle", node
        ns = node["netns"]
        # slurmd runs in the node's network namespace, so every job step there does too
        slurmd = psutil.Process(status["daemons"][f"slurmd-{name}"]["pid"])
        assert os.stat(f"/proc/{slurmd.pid}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
        routes = subprocess.run(["ip", "-n", ns, "route", "show"], capture_output=True, text=True).stdout
        assert "default" not in routes and routes.strip(), routes  # no route off the machine
        for host, port, proc in netns.listeners(name):  # slurmd's among them
            assert host in (node["address"], "127.0.0.1"), (name, host, port, proc)
    assert ipaddress.ip_address(head) in TEST_NET
    # a job step on n2 is in n2's namespace: it has n2's address and reaches the head
    conf = cluster["slurm_conf"]
    out = subprocess.run(
        [
            "srun",
            "-w",
            "n2",
            "-A",
            cluster["account"],
            sys.executable,
            "-c",
            "import psutil, socket; s = socket.create_connection(('%s', %d), 5); "
            "print(s.getsockname()[0])" % (head, cluster["ports"]["slurmctld"]),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SLURM_CONF": conf},
    )
    assert out.stdout.strip() == nodes["n2"]["address"], out.stderr


@needs_cluster
def test_node_address_is_slurms_nodeaddr(cluster, monkeypatch):
    from workbench.trainers.placement import node_address

    monkeypatch.setenv("SLURM_CONF", cluster["slurm_conf"])
    assert node_address("n3") == cluster["network"]["nodes"]["n3"]
    with pytest.raises(LookupError, match="nx"):
        node_address("nx")


# -- titan over two nodes per group ----------------------------------------------
def _participating(run, replica: int, attempt: int, n: int = 1):
    def check(r) -> bool:
        return (
            sum(
                1
                for e in r.events_read
                if e["kind"] == "step"
                and e.get("replica") == replica
                and e.get("attempt") == attempt
                and e.get("committed")
                and e.get("participating")
            )
            >= n
        )

    return check


HEAD_DAEMONS = ("slurmctld", "slurmdbd", "mariadbd", "munged")


def _ready(run, replica: int) -> bool:
    return any(
        e["kind"] == "phase" and e.get("phase") == "manager_ready" and e.get("replica") == replica
        for e in run.events_read
    )


def _two_node_titan(start_run, **overrides):
    return start_run(
        "titan-cpu",
        {
            "cluster": "slurm",
            "steps": 100000,
            "faults": [],
            "slurm.nodes": 2,
            "slurm.cpus_per_task": 4,
            "titan.overrides": {"training.seq_len": 64},
            **overrides,
        },
    )


@needs_cluster
@pytest.mark.titan
def test_titan_groups_over_two_nodes_bind_node_addresses_and_node_down_ends_every_part(cluster, start_run):
    """Two titan groups of one rank on each of two nodes (4 nodes in all; 4 CPUs a task keeps them apart).

    Once both groups' torchft Managers are up: each group runs on two nodes at
    their addresses, every listener of the run's processes, of the head's
    daemons and of every slurmd (and so of its job steps) is on its node's (or
    the head's) address or loopback, never a wildcard; the lighthouse, slurmctld
    and slurmdbd on the head's, each slurmd on its node's, MariaDB on none (its
    Unix socket only). Then ``node_down``
    under group 1 ends both of its tasks (the one on the other node too).
    """
    pytest.importorskip("torchtitan")
    nodes = cluster["network"]["nodes"]
    run = _two_node_titan(start_run)
    run.wait_for(lambda r: _ready(r, 0) and _ready(r, 1), timeout=240)
    state = run.run_state
    placement = {r: [(p.node, p.address) for p in state.nodes.placement(r, 0)] for r in (0, 1)}
    assert all(len(p) == 2 and len({n for n, _ in p}) == 2 for p in placement.values()), placement
    assert not {n for n, _ in placement[0]} & {n for n, _ in placement[1]}, placement
    assert all(addr == nodes[n] for p in placement.values() for n, addr in p), placement

    head = cluster["network"]["head"]
    daemons = {d: cluster["pids"][d] for d in HEAD_DAEMONS}
    slurmds = slurmd_pids(cluster)
    listeners = tcp_listeners([*run.pids(), *daemons.values(), *slurmds.values()], nodes)
    # the head and every node have listeners of the run: the rendezvous reached every node
    of_run = tcp_listeners(run.pids(), nodes)
    assert {n for n, *_ in of_run} == {"head", *nodes}, of_run
    own = {"head": head, **nodes}
    bad = [lst for lst in listeners if lst[1] not in (own[lst[0]], "127.0.0.1")]
    assert not bad, f"listeners on a wildcard or another address: {bad}"
    for pid in (run.run_state.lighthouse.pid, daemons["slurmctld"], daemons["slurmdbd"]):
        found = [lst for lst in listeners if f"pid={pid}," in lst[3]]
        assert found and all(lst[:2] == ("head", head) for lst in found), (pid, found)
    assert not [lst for lst in listeners if f"pid={daemons['mariadbd']}," in lst[3]]  # its Unix socket only
    assert_slurmds_listen_on_their_nodes(listeners, cluster)

    procs = [psutil.Process(p.pid) for p in run.run_state.nodes.placement(1, 0)]
    run.kill(1, how="node_down", seconds=5)
    run.refresh()
    assert run.run_state.replicas[1].state == "dead"
    assert run.run_state.nodes.nodes[placement[1][0][0]].state == "down"
    _, alive = psutil.wait_procs(procs, timeout=60)
    assert not alive, f"node_down left parts of group 1 running: {alive}"


@needs_cluster
@pytest.mark.titan
@pytest.mark.slow
def test_titan_group_over_two_nodes_killed_heals_across_the_bridge(cluster, start_run):
    """Group 0 (two nodes) is killed on both, comes back on two nodes and heals from group 1 over the bridge:
    its ``heal`` names a peer node's address and the namespace's interface, and that node's link counted at
    least the heal's bytes going out."""
    pytest.importorskip("torchtitan")
    nodes = cluster["network"]["nodes"]
    run = _two_node_titan(start_run)
    for r in (0, 1):
        run.wait_for(_participating(run, r, 0, 2), timeout=300)
    placement1 = {p.node for p in run.run_state.nodes.placement(1, 0)}
    before = {n: netns.link_bytes(n) for n in nodes}
    fault = run.kill(0)
    run.wait_for(_participating(run, 0, 1, 1), timeout=300)
    after = {n: netns.link_bytes(n) for n in nodes}
    heal = next(e for e in run.events_read if e["kind"] == "heal" and e.get("replica") == 0 and e.get("attempt") == 1)
    source = next(n for n, a in nodes.items() if a == heal["served_from"])
    assert source in placement1, (heal, placement1)
    assert heal["interface"] == netns.node_link(run.run_state.nodes.placement(0, 1)[0].node), heal
    sent = after[source]["sent"] - before[source]["sent"]
    assert heal["bytes"] > 1_000_000 and sent >= heal["bytes"], (heal["bytes"], sent)
    rejoin = (
        min(
            e["t"]
            for e in run.events_read
            if e["kind"] == "step"
            and e.get("replica") == 0
            and e.get("attempt") == 1
            and e.get("committed")
            and e.get("participating")
        )
        - fault["t"]
    )
    print(
        f"\n2-node titan group: kill -> participating {rejoin:.1f} s; heal {heal['bytes'] / 1e6:.1f} MB "
        f"from {heal['served_from']} via {heal['interface']}; {source}'s link sent {sent / 1e6:.1f} MB meanwhile"
    )


@needs_cluster
@pytest.mark.titan
@pytest.mark.slow
def test_a_titan_spare_on_slurm_waits_warm_and_forks_the_ranks_of_the_two_node_group_it_takes_over(cluster, start_run):
    """A Slurm job is a fresh interpreter, so a relaunched group execs its ranks, which import torchtitan after
    the kill. A spare imports it while it waits (``titan/spare.py``): it says so in ``spare_ready``, and the
    group it takes over (2 nodes x 1 rank) gets ranks forked warm on both nodes, which heal and take part.
    2 CPUs a task: the two groups and the spare (6 tasks) fit the 4 nodes."""
    pytest.importorskip("torchtitan")
    run = _two_node_titan(start_run, **{"spares": 1, "slurm.cpus_per_task": 2})

    def spare_ready(r):
        return [e for e in r.events_read if e["kind"] == "phase" and e.get("phase") == "spare_ready"]

    run.wait_for(lambda r: len(spare_ready(r)) >= 2, timeout=300)  # one per task: both nodes of the spare
    assert all(e.get("warm") is True and e.get("spare") == 0 for e in spare_ready(run)), spare_ready(run)
    for r in (0, 1):
        run.wait_for(_participating(run, r, 0, 2), timeout=300)
    fault = run.kill(0)
    run.wait_for(_participating(run, 0, 1, 1), timeout=300)
    events = run.event_records()
    starts = [e for e in events if e["kind"] == "start" and e.get("replica") == 0 and e.get("attempt") == 1]
    assert {e.get("from_spare") for e in starts} == {0} and len(starts) == 2, starts  # task 0 and task 1
    imports = [
        e
        for e in events
        if e["kind"] == "phase" and e["phase"] == "imports_done" and e.get("replica") == 0 and e.get("attempt") == 1
    ]
    assert imports and all(e.get("warm") is True for e in imports), imports  # rank 0 writes the group's phases
    rejoin = min(
        e["t"]
        for e in events
        if e["kind"] == "step" and e.get("replica") == 0 and e.get("attempt") == 1 and e.get("participating")
    )
    print(f"\n2-node titan group, Slurm hot spare: kill -> participating {rejoin - fault['t']:.1f} s")
