"""Bringing the dev cluster up and down, asking how it is, and the one daemon a fault may kill and restart.

Every function here takes a state directory (None: ``$WORKBENCH_SLURM_DIR``,
else ``~/.cache/workbench/slurm``) or the ``slurm.conf`` in one. Those that
start or stop daemons hold the state directory's lock; the rest only read.
"""

from __future__ import annotations

import getpass
import sys
import time
from pathlib import Path
from typing import Any, Optional

from workbench.cluster.procs import Marker
from workbench.cluster.slurm import statedir
from workbench.cluster.slurm.statedir import StateDir, alive, resolve_state_dir
from workbench.devcluster import netns
from workbench.devcluster.config import choose_ports, write_configs, write_hosts
from workbench.devcluster.daemons import (
    as_host,
    as_node,
    check_programs,
    daemon_env,
    run_client,
    start,
    stop_recorded,
    wait_until,
)
from workbench.devcluster.layout import (
    ACCOUNT,
    CLUSTER_NAME,
    DAEMONS,
    NODES,
    PARTITION,
    DevClusterError,
    Layout,
    check_state_dir,
    locked,
    read_state,
    write_state,
)
from workbench.devcluster.services import ensure_associations, start_mariadb, start_munged, start_slurmdbd


def client_env(state_dir: StateDir = None) -> dict[str, str]:
    """Environment variables a Slurm client (sbatch, sacct, submitit) needs to reach this cluster."""
    return {"SLURM_CONF": str(Layout(resolve_state_dir(state_dir)).slurm_conf)}


def up(state_dir: StateDir = None, timeout_s: float = 90.0, namespaces: bool = True, say=print) -> dict[str, Any]:
    """Start the cluster unless it is already up; wait until its nodes are idle.

    With ``namespaces`` each node's slurmd runs in its own network namespace
    (:mod:`.netns`); where none can be made, ``say`` gets one line why and the
    nodes are logical (every one on 127.0.0.1), as with ``namespaces=False``.

    Returns ``state_dir``, ``slurm_conf``, ``env`` (for clients), ``cluster``,
    ``partition``, ``account``, ``nodes``, ``pids``, ``ports``, ``log_dir``,
    ``mysql_socket``, ``started`` (False when everything was already running)
    and ``seconds``.
    """
    t0 = time.monotonic()
    layout = Layout(resolve_state_dir(state_dir))
    check_programs()
    check_state_dir(layout)
    layout.root.mkdir(parents=True, exist_ok=True)
    with locked(layout):
        state = read_state(layout)
        started = not (state and all(alive(state["daemons"].get(d)) for d in DAEMONS))
        if started:
            _, refused = stop_recorded(layout, state)
            if refused:
                raise DevClusterError(f"cannot start afresh: {_not_stopped(refused)}")
            state = _start_all(layout, state, deadline=time.monotonic() + timeout_s, network=_network(namespaces, say))
        elif statedir.RESTART_SLURMD not in state:  # brought up by a workbench that did not record it
            state[statedir.RESTART_SLURMD] = _restart_slurmd_command(layout)
            write_state(layout, state)
    return _describe(layout, state, started=started, seconds=time.monotonic() - t0)


def down(state_dir: StateDir = None, timeout_s: float = 30.0) -> list[str]:
    """Cancel every job, then stop every daemon recorded by :func:`up`, by PID. Returns the daemons stopped.

    A recorded daemon that does not prove it is the cluster's (``daemons.stop_recorded``) is not signalled
    and stays recorded; ``down`` finishes the rest, then raises DevClusterError naming each, and why.
    State (accounting database, munge key, slurmctld state) stays, so a later
    :func:`up` continues job ids; delete the state directory to start afresh.
    """
    layout = Layout(resolve_state_dir(state_dir))
    if not layout.root.is_dir():
        remove_network()
        return []
    with locked(layout):
        state = read_state(layout)
        if not state:
            remove_network()
            return []
        if alive(state["daemons"].get("slurmctld")):
            _cancel_all_jobs(layout, deadline=time.monotonic() + timeout_s)
        stopped, refused = stop_recorded(layout, state, timeout_s=timeout_s)
        state["daemons"] = {name: e for name, e in state["daemons"].items() if name in refused}
        write_state(layout, state)
        _remove_hosts(layout)
        remove_network()
    if refused:
        raise DevClusterError(f"stopped: {' '.join(stopped) or 'nothing'}; {_not_stopped(refused)}")
    return stopped


def _not_stopped(refused: dict[str, str]) -> str:
    return "not stopped: " + "; ".join(f"{name}: {why}" for name, why in refused.items())


def remove_network() -> list[str]:
    """Delete every namespace and link named with :data:`.netns.PREFIX` whose namespace no process is in.

    ``down`` calls it, so a namespace an earlier ``up`` left behind (it crashed,
    or was killed) goes too. A namespace with processes in it is another dev
    cluster's, still running: left alone.
    """
    from workbench.faults import host as hostfaults

    left = hostfaults.sweep(run_ended)  # what a fault of an ended run left (its controller died); not a live run's
    busy = [ns for ns in netns.ours()["netns"] if netns.pids(ns)]
    if busy:
        return left
    found = netns.remove_all()
    return left + found["netns"] + found["links"]


def run_ended(run_dir: str) -> bool:
    """Whether the run whose host fault ``down`` finds has ended (``workbench.faults.host``: its owner
    record names ``run_dir``): no run directory there, or the run is over or its controller gone. A run
    directory that cannot be read is taken as live: its faults stay, for its own stop to undo."""
    from workbench.run import handle, rundir  # late: the run's fold imports pandas; asked only of a record

    if not rundir.is_run_dir(run_dir):
        return True
    try:
        return handle.attach(run_dir).state() in handle.ENDED
    except (OSError, ValueError, KeyError):
        return False


def status(state_dir: StateDir = None) -> dict[str, Any]:
    """Which daemons are alive, and the nodes as ``sinfo`` reports them.

    ``up`` is True when every daemon is alive; ``nodes`` maps node name to its
    Slurm state (``idle``, ``mixed``, ``allocated``, ``down``, ...) and is empty
    while slurmctld is not running. Never starts anything.
    """
    layout = Layout(resolve_state_dir(state_dir))
    state = read_state(layout) or {"daemons": {}}
    daemons = {
        d: {"pid": (state["daemons"].get(d) or {}).get("pid"), "alive": alive(state["daemons"].get(d))} for d in DAEMONS
    }
    nodes: dict[str, str] = {}
    if daemons["slurmctld"]["alive"]:
        nodes = _node_states(layout)
    return {
        "state_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf),
        "up": all(d["alive"] for d in daemons.values()),
        "daemons": daemons,
        "nodes": nodes,
        "network": _network_view(state.get("network"), nodes),
    }


def _network(namespaces: bool, say) -> dict[str, Any]:
    """The network ``up`` is about to build: per-node namespaces where possible, else logical nodes."""
    if namespaces:
        busy = [ns for ns in netns.ours()["netns"] if netns.pids(ns)]
        why = f"namespaces {' '.join(busy)} are in use by another dev cluster" if busy else netns.available()
        if why is None:
            return {"mode": "netns", "head": netns.HEAD_ADDRESS, "nodes": netns.addresses(NODES)}
        say(f"workbench cluster up: no network namespaces ({why}); nodes are logical, all on 127.0.0.1")
        return {"mode": "logical", "head": "127.0.0.1", "nodes": {n: "127.0.0.1" for n in NODES}, "why": why}
    return {"mode": "logical", "head": "127.0.0.1", "nodes": {n: "127.0.0.1" for n in NODES}}


def _network_view(network: Optional[dict], node_states: dict[str, str]) -> dict[str, Any]:
    """``mode``, ``head`` and per node its ``address``, Slurm ``state``, ``netns`` and ``link`` (netns mode)."""
    if not network:
        return {"mode": None, "head": None, "nodes": {}}
    nodes = {}
    for node, addr in network["nodes"].items():
        entry = {"address": addr, "state": node_states.get(node)}
        if network["mode"] == "netns":
            entry.update(netns=netns.namespace(node), link=netns.host_link(node))
        nodes[node] = entry
    return {"mode": network["mode"], "head": network["head"], "nodes": nodes}


def find_slurm_conf(state_dir: StateDir = None) -> Optional[Path]:
    """The running dev cluster's ``slurm.conf``, or None when its slurmctld is not running (as the Slurm
    backend finds it: :func:`workbench.cluster.slurm.statedir.running_slurm_conf`)."""
    return statedir.running_slurm_conf(state_dir)


def daemon_pids(state_dir: StateDir = None) -> dict[str, int]:
    """Daemon name -> PID of each daemon :func:`up` started that is still that same process and running.

    For a last-resort cleanup by PID when :func:`down` failed: take
    ``psutil.Process`` objects of these before calling it, so a PID reused
    afterwards is not mistaken for a daemon.
    """
    state = read_state(Layout(resolve_state_dir(state_dir))) or {"daemons": {}}
    return {name: entry["pid"] for name, entry in state["daemons"].items() if alive(entry)}


def slurmd_pid(conf: Optional[str], node: str) -> int:
    """PID of the running ``slurmd -N node`` of the dev cluster whose ``slurm.conf`` is ``conf``.

    Raises DevClusterError when that slurmd is not one a dev cluster started
    (``conf`` is another cluster's, or None) or is not running.
    """
    _, _, entry = _slurmd_record(conf, node)
    if not alive(entry):
        raise DevClusterError(f"node {node}'s slurmd (pid {entry['pid']}) is not running")
    return entry["pid"]


def restart_slurmd(conf: Optional[str], node: str) -> None:
    """Start ``slurmd -N node`` again, as :func:`up` did, unless it is alive; under the state lock.

    Raises DevClusterError as :func:`slurmd_pid` does when it is not the dev cluster's.
    """
    layout, _, _ = _slurmd_record(conf, node)
    with locked(layout):
        _, state, entry = _slurmd_record(conf, node)
        if not alive(entry):
            start(layout, state, f"slurmd-{node}", entry["argv"], daemon_env(layout))


def _slurmd_record(conf: Optional[str], node: str) -> tuple[Layout, dict, dict]:
    """The layout, state and state entry of ``slurmd -N node`` of the dev cluster of ``conf``."""
    layout = Layout.of_slurm_conf(conf) if conf else None
    state = read_state(layout) if layout else None
    entry = (state or {}).get("daemons", {}).get(f"slurmd-{node}")
    if not entry:
        raise DevClusterError(
            f"node {node}'s slurmd is not one the dev cluster started "
            f"(slurm.conf {conf}); on a real cluster ask its admins"
        )
    return layout, state, entry


def _start_all(layout: Layout, old_state: Optional[dict], deadline: float, network: dict[str, Any]) -> dict[str, Any]:
    for d in (layout.etc, layout.log, layout.run, layout.munge, layout.ctld_state, layout.slurmd_spool):
        d.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    ports = choose_ports((old_state or {}).get("ports"))
    fresh_ctld = not any(layout.ctld_state.iterdir())
    Marker.ensure(layout.root, statedir.DAEMON_MARKER)  # every daemon started below carries it (daemon_env)
    state: dict[str, Any] = {
        "ports": ports,
        "user": user,
        "daemons": {},
        "network": network,
        statedir.RESTART_SLURMD: _restart_slurmd_command(layout),
    }
    write_state(layout, state)

    namespaced = network["mode"] == "netns"
    write_configs(layout, ports, user, network["nodes"] if namespaced else None, head=network["head"])
    hosts = write_hosts(layout, network["nodes"])
    env = daemon_env(layout)

    try:
        if namespaced:
            netns.create(NODES)
        start_munged(layout, state)
        start_mariadb(layout, state, user, deadline)
        start_slurmdbd(layout, state, network["head"], deadline)
        ensure_associations(layout, user)
        start(
            layout,
            state,
            "slurmctld",
            [*as_host(network["head"]), "slurmctld", "-D", "-f", str(layout.slurm_conf)],
            env,
        )
        wait_until(
            lambda: "is UP" in run_client(layout, ["scontrol", "ping"], check=False).stdout,
            deadline,
            layout,
            "slurmctld",
        )
        for node in NODES:
            prefix = netns.exec_prefix(node) if namespaced else []
            start(
                layout,
                state,
                f"slurmd-{node}",
                [*as_node(hosts[node]), *prefix, "slurmd", "-D", "-N", node, "-f", str(layout.slurmd_conf)],
                env,
            )
        wait_until(lambda: _nodes_registered(layout), deadline, layout, "slurmd-n1")
        if not fresh_ctld:
            _resume_unusable_nodes(layout)
        wait_until(lambda: set(_node_states(layout).values()) == {"idle"}, deadline, layout, "slurmd-n1")
    except BaseException:
        stop_recorded(layout, state)
        state["daemons"] = {}
        write_state(layout, state)
        _remove_hosts(layout)
        if namespaced:
            remove_network()
        raise
    return state


def _restart_slurmd_command(layout: Layout) -> list[str]:
    """What the state file records for a node's slurmd to be started again (the node's name appended):
    :func:`restart_slurmd` through the CLI, run by the ``slurmd_kill`` fault's detached undo helper."""
    return [sys.executable, "-m", "workbench.devcluster", "--dir", str(layout.root), "restart-slurmd"]


def _remove_hosts(layout: Layout) -> None:
    """The nodes' hosts files (:func:`.config.write_hosts`): each ``up`` writes them anew."""
    for node in NODES:
        layout.hosts_of(node).unlink(missing_ok=True)


def _node_states(layout: Layout) -> dict[str, str]:
    result = run_client(layout, ["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
    if result.returncode:
        return {}
    return dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())


def _nodes_registered(layout: Layout) -> bool:
    states = _node_states(layout)
    return set(states) == set(NODES) and not any(
        s.startswith(("unknown", "not_responding")) or s.endswith("*") for s in states.values()
    )


def _resume_unusable_nodes(layout: Layout) -> None:
    """A restart keeps a node's DOWN/DRAIN from before; a cold up() means every node should serve."""
    bad = [n for n, s in _node_states(layout).items() if s.startswith(("down", "drain"))]
    if bad:
        run_client(layout, ["scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME"], check=False)


def _cancel_all_jobs(layout: Layout, deadline: float) -> None:
    """Cancel every job and wait until none is left; slurmstepd and job processes outlive slurmd otherwise."""

    def job_ids() -> list[str]:
        return run_client(layout, ["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    ids = job_ids()
    if not ids:
        return
    run_client(layout, ["scancel", *ids], check=False)
    try:
        wait_until(lambda: not job_ids(), deadline, layout, "slurmctld")
    except DevClusterError:
        pass


def _describe(layout: Layout, state: dict, started: bool, seconds: float) -> dict[str, Any]:
    return {
        "state_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf),
        "slurmdbd_conf": str(layout.slurmdbd_conf),
        "log_dir": str(layout.log),
        "munge_socket": str(layout.munge_socket),
        "mysql_socket": str(layout.mysql_socket),
        "env": client_env(layout.root),
        "cluster": CLUSTER_NAME,
        "partition": PARTITION,
        "account": ACCOUNT,
        "nodes": list(NODES),
        "network": state.get("network"),
        "ports": dict(state["ports"]),
        "pids": {name: entry["pid"] for name, entry in state["daemons"].items()},
        "started": started,
        "seconds": round(seconds, 2),
    }
