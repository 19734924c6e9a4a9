"""A real Slurm cluster on localhost, for demos and tests.

Debian's Slurm 22.05 is built with ``MULTIPLE_SLURMD``, so one host can run
several ``slurmd``, each pretending to be a node: ``NodeName=n[1-3]
NodeHostname=localhost Port=<a>-<c>`` and one ``slurmd -N nI`` per node. Beside
them run the daemons a real site has, each with its state in one directory
(``~/.cache/workbench/slurm``, or ``$WORKBENCH_SLURM_DIR``) and none through
systemd:

``munged``
    its own key and socket; every Slurm daemon and client finds it through
    ``AuthInfo=socket=...`` in ``slurm.conf``, so the host's munge is never used.
``mariadbd`` + ``slurmdbd``
    accounting. submitit reads job states with ``sacct``, which fails without
    it (and then ``result()`` of a cancelled job waits forever). Accounting also
    gives ``--account`` validation (``AccountingStorageEnforce=associations``).
``slurmctld``, ``slurmd -N n1..n3``
    the scheduler and the nodes.

A client needs only ``SLURM_CONF`` (see :func:`up` / :func:`client_env`).
Daemons run in the foreground (``-D``) in their own session; their PIDs and
start times are recorded in ``state.json``, and :func:`down` stops exactly
those. :func:`up` is idempotent: with every daemon alive it returns at once;
otherwise it stops the survivors and starts all of them again on the same
state (job ids continue; a removed state directory starts them from 1, so a
submitit folder must never be reused across clusters).

Timings are tuned for fault experiments: ``cred_expire=10`` lets a requeued
job start again within seconds (the 120 s default held one back ~148 s),
``sched_interval=1``, ``KillWait=2``, ``ReturnToService=1``.

``slurmctld``, ``slurmd`` and ``slurmdbd`` listen on every interface on their
ports (22.05 has no bind address for them); ``mariadbd`` listens on 127.0.0.1
only, munge on a Unix socket.
"""

from __future__ import annotations

import argparse
import fcntl
import getpass
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import psutil

ENV_STATE_DIR = "WORKBENCH_SLURM_DIR"
DEFAULT_STATE_DIR = Path("~/.cache/workbench/slurm")
CLUSTER_NAME = "workbench"
NODES = ("n1", "n2", "n3")
PARTITION = "debug"
ACCOUNT = "workbench"
# Oversubscribed on purpose: tiny CPU jobs, several at once on a 2-core host.
# SlurmdParameters=config_overrides makes slurmd accept more than the host has.
CPUS_PER_NODE = 4
MEMORY_MB_PER_NODE = 4096
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
# Small and fast rather than durable across host crashes: this is a throw-away accounting DB.
# (slurmdbd logs that these are "not recommended values"; harmless here.)
MARIADB_TUNING = (
    "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=16M", "--skip-log-bin",
    "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
    # slurmdbd's schema set-up holds locks for long on a busy host
    "--innodb-lock-wait-timeout=900",
)

REQUIRED_PROGRAMS = (
    "munged", "mungekey", "mariadb-install-db", "mariadbd", "mariadb",
    "slurmdbd", "slurmctld", "slurmd", "sacctmgr", "scontrol", "sinfo", "squeue", "scancel",
)
INSTALL_HINT = "run scripts/install-slurm.sh (Debian: slurm-wlm slurmdbd munge mariadb-server)"

# Start order.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld") + tuple(f"slurmd-{n}" for n in NODES)


class DevClusterError(RuntimeError):
    """The dev cluster could not be brought up or queried; the message says which daemon and where its log is."""


class Layout:
    """Every path under one state directory."""

    def __init__(self, root: Path):
        self.root = root
        self.etc = root / "etc"
        self.slurm_conf = self.etc / "slurm.conf"
        # slurmdbd ignores -f and reads slurmdbd.conf beside $SLURM_CONF.
        self.slurmdbd_conf = self.etc / "slurmdbd.conf"
        self.log = root / "log"
        self.run = root / "run"
        self.munge = root / "munge"
        self.munge_key = self.munge / "munge.key"
        self.munge_socket_dir = root / "munge-socket"
        self.munge_socket = self.munge_socket_dir / "munge.socket.2"
        self.mysql_data = root / "mysql"
        self.mysql_socket = self.run / "mysqld.sock"
        self.db_password = root / "db-password"
        self.ctld_state = root / "spool" / "slurmctld"
        self.slurmd_spool = root / "spool"
        self.state_file = root / "state.json"
        self.lock_file = root / "lock"

    def log_of(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"


def resolve_state_dir(state_dir: Optional[os.PathLike | str] = None) -> Path:
    """The argument, else ``$WORKBENCH_SLURM_DIR``, else ``~/.cache/workbench/slurm``; absolute."""
    chosen = state_dir or os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR
    return Path(chosen).expanduser().resolve()


def client_env(state_dir: Optional[os.PathLike | str] = None) -> dict[str, str]:
    """Environment variables a Slurm client (sbatch, sacct, submitit) needs to reach this cluster."""
    return {"SLURM_CONF": str(Layout(resolve_state_dir(state_dir)).slurm_conf)}


def up(state_dir: Optional[os.PathLike | str] = None, timeout_s: float = 90.0) -> dict[str, Any]:
    """Start the cluster unless it is already up; wait until its 3 nodes are idle.

    Returns ``state_dir``, ``slurm_conf``, ``env`` (for clients), ``cluster``,
    ``partition``, ``account``, ``nodes``, ``pids``, ``log_dir``, ``started``
    (False when everything was already running) and ``seconds``.
    """
    t0 = time.monotonic()
    layout = Layout(resolve_state_dir(state_dir))
    _check_programs()
    _check_state_dir(layout)
    layout.root.mkdir(parents=True, exist_ok=True)
    with _locked(layout):
        state = _read_state(layout)
        started = not (state and all(_alive(state["daemons"].get(d)) for d in DAEMONS))
        if started:
            _stop_recorded(state)
            state = _start_all(layout, state, deadline=time.monotonic() + timeout_s)
    return _describe(layout, state, started=started, seconds=time.monotonic() - t0)


def down(state_dir: Optional[os.PathLike | str] = None, timeout_s: float = 30.0) -> list[str]:
    """Cancel every job, then stop every daemon recorded by :func:`up`, by PID. Returns the daemons stopped.

    State (accounting database, munge key, slurmctld state) stays, so a later
    :func:`up` continues job ids; delete the state directory to start afresh.
    """
    layout = Layout(resolve_state_dir(state_dir))
    if not layout.root.is_dir():
        return []
    with _locked(layout):
        state = _read_state(layout)
        if not state:
            return []
        if _alive(state["daemons"].get("slurmctld")):
            _cancel_all_jobs(layout, deadline=time.monotonic() + timeout_s)
        stopped = _stop_recorded(state, timeout_s=timeout_s)
        state["daemons"] = {}
        _write_state(layout, state)
    return stopped


def status(state_dir: Optional[os.PathLike | str] = None) -> dict[str, Any]:
    """Which daemons are alive, and the nodes as ``sinfo`` reports them.

    ``up`` is True when every daemon is alive; ``nodes`` maps node name to its
    Slurm state (``idle``, ``mixed``, ``allocated``, ``down``, ...) and is empty
    while slurmctld is not running. Never starts anything.
    """
    layout = Layout(resolve_state_dir(state_dir))
    state = _read_state(layout) or {"daemons": {}}
    daemons = {
        d: {"pid": (state["daemons"].get(d) or {}).get("pid"), "alive": _alive(state["daemons"].get(d))}
        for d in DAEMONS
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
    }


def find_slurm_conf(state_dir: Optional[os.PathLike | str] = None) -> Optional[Path]:
    """The running dev cluster's ``slurm.conf``, or None when its slurmctld is not running."""
    layout = Layout(resolve_state_dir(state_dir))
    state = _read_state(layout)
    if state and _alive(state["daemons"].get("slurmctld")) and layout.slurm_conf.is_file():
        return layout.slurm_conf
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``workbench cluster up|down|status [--dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="workbench cluster", description="A local Slurm cluster (3 nodes on this host) for demos and tests."
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--dir", dest="state_dir", default=None,
                        help=f"state directory (default ${ENV_STATE_DIR} or {DEFAULT_STATE_DIR})")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            info = up(args.state_dir)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                verb = "started" if info["started"] else "already up"
                print(f"dev Slurm cluster {verb} in {info['seconds']:.1f}s: {info['state_dir']}")
                print(f"partition={info['partition']} account={info['account']} nodes={','.join(info['nodes'])}")
                for key, value in info["env"].items():
                    print(f"export {key}={value}")
            return 0
        if args.action == "down":
            stopped = down(args.state_dir)
            print(json.dumps(stopped) if args.json else f"stopped: {' '.join(stopped) or 'nothing was running'}")
            return 0
        info = status(args.state_dir)
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"{info['state_dir']}: {'up' if info['up'] else 'not up'}")
            for name, d in info["daemons"].items():
                print(f"  {name:<12} {'alive' if d['alive'] else 'dead':<6} pid={d['pid']}")
            for node, node_state in info["nodes"].items():
                print(f"  node {node}: {node_state}")
        return 0 if info["up"] else 1
    except DevClusterError as e:
        print(f"workbench cluster {args.action}: {e}", file=sys.stderr)
        return 1


# --- starting --------------------------------------------------------------


def _start_all(layout: Layout, old_state: Optional[dict], deadline: float) -> dict[str, Any]:
    for d in (layout.etc, layout.log, layout.run, layout.munge, layout.ctld_state, layout.slurmd_spool):
        d.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    ports = _choose_ports((old_state or {}).get("ports"))
    fresh_ctld = not any(layout.ctld_state.iterdir())
    state: dict[str, Any] = {"ports": ports, "user": user, "daemons": {}}
    _write_state(layout, state)

    _write_configs(layout, ports, user)
    env = _daemon_env(layout)

    try:
        _start_munged(layout, state)
        _start_mariadb(layout, state, user, deadline)
        _record(layout, state, "slurmdbd", ["slurmdbd", "-D"], env)
        _wait(lambda: _run(layout, ["sacctmgr", "-n", "-P", "list", "cluster"], check=False).returncode == 0,
              deadline, layout, "slurmdbd")
        _ensure_associations(layout, user)
        _record(layout, state, "slurmctld", ["slurmctld", "-D", "-f", str(layout.slurm_conf)], env)
        _wait(lambda: "is UP" in _run(layout, ["scontrol", "ping"], check=False).stdout,
              deadline, layout, "slurmctld")
        for node in NODES:
            _record(layout, state, f"slurmd-{node}",
                    ["slurmd", "-D", "-N", node, "-f", str(layout.slurm_conf)], env)
        _wait(lambda: _nodes_registered(layout), deadline, layout, "slurmd-n1")
        if not fresh_ctld:
            _resume_unusable_nodes(layout)
        _wait(lambda: set(_node_states(layout).values()) == {"idle"}, deadline, layout, "slurmd-n1")
    except BaseException:
        _stop_recorded(state)
        state["daemons"] = {}
        _write_state(layout, state)
        raise
    return state


def _start_munged(layout: Layout, state: dict) -> None:
    if not layout.munge_key.exists():
        subprocess.run(["mungekey", "-c", "-k", str(layout.munge_key)], check=True, capture_output=True)
    layout.munge_key.chmod(0o600)
    os.chmod(layout.munge, 0o700)
    # munged refuses a socket directory that others may write to; clients need to traverse it.
    layout.munge_socket_dir.mkdir(exist_ok=True)
    os.chmod(layout.munge_socket_dir, 0o755)
    layout.munge_socket.unlink(missing_ok=True)
    _record(layout, state, "munged", [
        "munged", "--foreground", "--force",
        f"--socket={layout.munge_socket}", f"--key-file={layout.munge_key}",
        f"--pid-file={layout.run / 'munged.pid'}", f"--seed-file={layout.munge / 'munged.seed'}",
    ], _daemon_env(layout))
    _wait(lambda: layout.munge_socket.exists(), time.monotonic() + 15, layout, "munged")


def _start_mariadb(layout: Layout, state: dict, user: str, deadline: float) -> None:
    if not (layout.mysql_data / "mysql").is_dir():
        shutil.rmtree(layout.mysql_data, ignore_errors=True)
        subprocess.run([
            "mariadb-install-db", "--no-defaults", f"--datadir={layout.mysql_data}", f"--user={user}",
            "--auth-root-authentication-method=normal", "--skip-test-db", *MARIADB_TUNING,
        ], check=True, capture_output=True, text=True)
    layout.mysql_socket.unlink(missing_ok=True)
    _record(layout, state, "mariadbd", [
        "mariadbd", "--no-defaults", f"--datadir={layout.mysql_data}", f"--user={user}",
        f"--socket={layout.mysql_socket}", f"--port={state['ports']['mariadb']}", "--bind-address=127.0.0.1",
        f"--pid-file={layout.run / 'mariadbd.pid'}", f"--log-error={layout.log_of('mariadbd')}",
        "--skip-name-resolve", *MARIADB_TUNING,
    ], _daemon_env(layout))
    password = _db_password(layout)
    grant = (
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';"
        f"ALTER USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';"
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
    )
    client = ["mariadb", "--no-defaults", f"--socket={layout.mysql_socket}", "-uroot", "-e", grant]
    _wait(lambda: subprocess.run(client, capture_output=True).returncode == 0, deadline, layout, "mariadbd")


def _ensure_associations(layout: Layout, user: str) -> None:
    """Cluster, account and the user's association; sacctmgr refuses duplicates, so ask first."""
    def listed(entity: str, *fmt: str) -> set[str]:
        out = _run(layout, ["sacctmgr", "-n", "-P", "list", entity, f"format={','.join(fmt)}"]).stdout
        return {line.strip() for line in out.splitlines() if line.strip()}

    if CLUSTER_NAME not in listed("cluster", "Cluster"):
        _run(layout, ["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME])
    if ACCOUNT not in listed("account", "Account"):
        _run(layout, ["sacctmgr", "-i", "add", "account", ACCOUNT, f"Cluster={CLUSTER_NAME}",
                      "Description=workbench dev cluster", "Organization=workbench"])
    if f"{user}|{ACCOUNT}" not in listed("association", "User", "Account"):
        _run(layout, ["sacctmgr", "-i", "add", "user", user, f"Account={ACCOUNT}",
                      f"DefaultAccount={ACCOUNT}", f"Cluster={CLUSTER_NAME}"])


def _resume_unusable_nodes(layout: Layout) -> None:
    """A restart keeps a node's DOWN/DRAIN from before; a cold up() means every node should serve."""
    bad = [n for n, s in _node_states(layout).items() if s.startswith(("down", "drain"))]
    if bad:
        _run(layout, ["scontrol", "update", f"NodeName={','.join(bad)}", "State=RESUME"], check=False)


def _record(layout: Layout, state: dict, name: str, cmd: list[str], env: Mapping[str, str]) -> None:
    """Start one daemon in the foreground in its own session; record its PID and start time.

    Its own log goes where its config says; stdout/stderr (early failures) to ``log/<name>.stdout``.
    """
    out = open(layout.log / f"{name}.stdout", "ab")
    try:
        proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=layout.root)
    finally:
        out.close()
    state["daemons"][name] = {"pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
                              "argv": cmd}
    _write_state(layout, state)


def _daemon_env(layout: Layout) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(layout.slurm_conf)
    return env


def _check_state_dir(layout: Layout) -> None:
    """slurm.conf cannot quote paths, AuthInfo splits on commas, Unix sockets have 107 bytes."""
    text = str(layout.root)
    if any(c.isspace() or c in ",=#\"'" for c in text):
        raise DevClusterError(f"state_dir {text!r}: must not contain whitespace, quotes, ',', '=' or '#' "
                              f"(set ${ENV_STATE_DIR} or pass another directory)")
    longest = max(len(os.fsencode(p)) for p in (layout.munge_socket, layout.mysql_socket))
    if longest > 107:
        raise DevClusterError(f"state_dir {text!r}: too long for a Unix socket path inside it "
                              f"({longest} > 107 bytes); use a shorter directory")


def _check_programs() -> None:
    missing = [p for p in REQUIRED_PROGRAMS if not (shutil.which(p) or Path("/usr/sbin", p).exists())]
    if missing:
        raise DevClusterError(f"missing programs: {' '.join(missing)}; {INSTALL_HINT}")


# --- configuration ---------------------------------------------------------


def _choose_ports(previous: Optional[Mapping[str, int]]) -> dict[str, int]:
    """Reuse the previous ports when all are free, else a free block at a random base.

    slurmd ports must be consecutive (``Port=<a>-<c>`` in the node line), so all
    ports come as one block of len(NODES)+3.
    """
    names = ["slurmctld", "slurmdbd", "mariadb"] + [f"slurmd-{n}" for n in NODES]
    if previous and set(previous) == set(names) and all(_port_free(p) for p in previous.values()):
        return dict(previous)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000)
        block = list(range(base, base + len(names)))
        if all(_port_free(p) for p in block):
            return dict(zip(names, block))
    raise DevClusterError("found no block of free TCP ports in 20000-30000")


def _db_password(layout: Layout) -> str:
    """slurmdbd's MariaDB password, made once per state directory."""
    if not layout.db_password.exists():
        layout.db_password.touch(mode=0o600)
        layout.db_password.write_text(secrets.token_hex(16))
    return layout.db_password.read_text().strip()


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _write_configs(layout: Layout, ports: Mapping[str, int], user: str) -> None:
    munge_auth = f"AuthInfo=socket={layout.munge_socket},cred_expire=10"
    first_slurmd = ports[f"slurmd-{NODES[0]}"]
    last_slurmd = ports[f"slurmd-{NODES[-1]}"]
    node_range = f"{NODES[0][0]}[{NODES[0][1:]}-{NODES[-1][1:]}]"
    spool = layout.slurmd_spool
    slurm_conf = f"""\
# Written by workbench.cluster.devcluster; rewritten by every cold `up`.
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ports['slurmctld']}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
{munge_auth}
StateSaveLocation={layout.ctld_state}
SlurmdSpoolDir={spool}/slurmd-%n
SlurmctldPidFile={layout.run}/slurmctld.pid
SlurmdPidFile={layout.run}/slurmd-%n.pid
SlurmctldLogFile={layout.log_of('slurmctld')}
SlurmdLogFile={layout.log}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=1
KillWait=2
MinJobAge=600
SlurmdTimeout=20
SlurmctldTimeout=20
InactiveLimit=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports['slurmdbd']}
# slurmctld authenticates to slurmdbd through this munge socket; without it: "no TRES from database".
AccountingStoragePass={layout.munge_socket}
AccountingStorageEnforce=associations
JobCompType=jobcomp/none
NodeName={node_range} NodeHostname=localhost NodeAddr=127.0.0.1 Port={first_slurmd}-{last_slurmd} \
CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB_PER_NODE} State=UNKNOWN
PartitionName={PARTITION} Nodes={node_range} Default=YES MaxTime=INFINITE State=UP
"""
    slurmdbd_conf = f"""\
# Written by workbench.cluster.devcluster; rewritten by every cold `up`.
AuthType=auth/munge
{munge_auth}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports['slurmdbd']}
SlurmUser={user}
PidFile={layout.run}/slurmdbd.pid
LogFile={layout.log_of('slurmdbd')}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mariadb']}
StorageUser={DB_USER}
StoragePass={_db_password(layout)}
StorageLoc={DB_NAME}
"""
    layout.slurm_conf.write_text(slurm_conf)
    layout.slurmdbd_conf.write_text(slurmdbd_conf)
    # slurmdbd refuses a slurmdbd.conf that others can read (it holds the DB password).
    layout.slurmdbd_conf.chmod(0o600)


# --- querying and stopping -------------------------------------------------


def _node_states(layout: Layout) -> dict[str, str]:
    result = _run(layout, ["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
    if result.returncode:
        return {}
    return dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())


def _nodes_registered(layout: Layout) -> bool:
    states = _node_states(layout)
    return set(states) == set(NODES) and not any(s.startswith(("unknown", "not_responding")) or s.endswith("*")
                                                 for s in states.values())


def _cancel_all_jobs(layout: Layout, deadline: float) -> None:
    """Cancel every job and wait until none is left; slurmstepd and job processes outlive slurmd otherwise."""
    def job_ids() -> list[str]:
        return _run(layout, ["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    ids = job_ids()
    if not ids:
        return
    _run(layout, ["scancel", *ids], check=False)
    try:
        _wait(lambda: not job_ids(), deadline, layout, "slurmctld")
    except DevClusterError:
        pass


def _alive(entry: Optional[Mapping[str, Any]]) -> bool:
    """The recorded process still runs (same PID and start time, so not a reused PID) and is not a zombie."""
    if not entry:
        return False
    try:
        proc = psutil.Process(entry["pid"])
        return (abs(proc.create_time() - entry["create_time"]) < 0.5
                and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _stop_recorded(state: Optional[dict], timeout_s: float = 20.0) -> list[str]:
    """SIGTERM the recorded daemons still alive, SIGKILL after ``timeout_s``.

    In tiers, reverse start order (nodes, controller, slurmdbd, MariaDB, munge),
    so a daemon's dependencies outlive its shutdown; daemons of one tier stop together.
    """
    if not state:
        return []
    tiers = [[f"slurmd-{n}" for n in NODES], ["slurmctld"], ["slurmdbd"], ["mariadbd"], ["munged"]]
    stopped = []
    for tier in tiers:
        procs = {}
        for name in tier:
            entry = state["daemons"].get(name)
            if _alive(entry):
                procs[name] = psutil.Process(entry["pid"])
            else:
                _reap(entry)
        for proc in procs.values():
            with suppress(psutil.NoSuchProcess):
                proc.terminate()
        left = _wait_exited(list(procs.values()), timeout_s)
        for proc in left:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        _wait_exited(left, 5)
        for name in procs:
            _reap(state["daemons"][name])
        stopped.extend(procs)
    return stopped


def _wait_exited(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process is gone or a zombie; return those still running.

    Not ``psutil.wait_procs``: daemons started by an earlier process are
    children of init, which may reap them only seconds later.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if _running(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _reap(entry: Optional[Mapping[str, Any]]) -> None:
    """Collect a dead daemon that this process started, so it does not stay a zombie."""
    if entry:
        try:
            os.waitpid(entry["pid"], os.WNOHANG)
        except ChildProcessError:
            pass


def _run(layout: Layout, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, env=_daemon_env(layout), capture_output=True, text=True, timeout=30)
    if check and result.returncode:
        raise DevClusterError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _wait(condition, deadline: float, layout: Layout, daemon: str, poll_s: float = 0.2) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise DevClusterError(f"{daemon} not ready in time; see {layout.log_of(daemon)} "
                                  f"and {layout.log / (daemon + '.stdout')}")
        time.sleep(poll_s)


# --- state file ------------------------------------------------------------


@contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """One up/down at a time per state directory (another process or thread waits)."""
    with open(layout.lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_state(layout: Layout) -> Optional[dict]:
    try:
        return json.loads(layout.state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_state(layout: Layout, state: Mapping[str, Any]) -> None:
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(layout.state_file)


def _describe(layout: Layout, state: dict, started: bool, seconds: float) -> dict[str, Any]:
    return {
        "state_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf),
        "slurmdbd_conf": str(layout.slurmdbd_conf),
        "log_dir": str(layout.log),
        "munge_socket": str(layout.munge_socket),
        "env": client_env(layout.root),
        "cluster": CLUSTER_NAME,
        "partition": PARTITION,
        "account": ACCOUNT,
        "nodes": list(NODES),
        "ports": dict(state["ports"]),
        "pids": {name: entry["pid"] for name, entry in state["daemons"].items()},
        "started": started,
        "seconds": round(seconds, 2),
    }


if __name__ == "__main__":
    sys.exit(main())
