"""The dev cluster's daemon processes: started in the foreground in their own session, known by PID.

Every daemon runs with ``-D`` (or its foreground flag) as a child of the
process that called ``up`` and in a session of its own, so it outlives that
process and a terminal's hang-up. It is then known only by the ``pid`` and
``started`` (``workbench.cluster.procs.start_time``: seconds since boot, which no clock
change moves) :func:`start` records in the state file;
:func:`workbench.cluster.slurm.statedir.alive` compares both, so a PID the kernel
has since reused is never signalled. Both are public, so a daemon also proves it
is the cluster's before a signal: it is the state directory owner's and carries
the state directory's marker, which :func:`daemon_env` gives every daemon
(``workbench.cluster.slurm.statedir.daemon_marker``); a recorded process that
does not is reported by :func:`stop_recorded`, never signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from workbench.cluster.procs import Proc, start_time
from workbench.cluster.slurm.statedir import alive, daemon_marker, daemon_proc
from workbench.devcluster.layout import NODES, DevClusterError, Layout, write_state

REQUIRED_PROGRAMS = (
    "munged",
    "mungekey",
    "mariadb-install-db",
    "mariadbd",
    "mariadb",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "sacctmgr",
    "scontrol",
    "sinfo",
    "squeue",
    "scancel",
)
INSTALL_HINT = "run scripts/install-slurm.sh (Debian: slurm-wlm slurmdbd munge mariadb-server)"

# Stop order: reverse start order, so a daemon's dependencies outlive its shutdown.
STOP_TIERS = ([f"slurmd-{n}" for n in NODES], ["slurmctld"], ["slurmdbd"], ["mariadbd"], ["munged"])


def check_programs() -> None:
    missing = [p for p in REQUIRED_PROGRAMS if not (shutil.which(p) or Path("/usr/sbin", p).exists())]
    if missing:
        raise DevClusterError(f"missing programs: {' '.join(missing)}; {INSTALL_HINT}")


def daemon_env(layout: Layout) -> dict[str, str]:
    """This process's environment without the Slurm job variables, with ``SLURM_CONF`` of this cluster and
    the state directory's marker (where it has one: ``up`` makes it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
    env["SLURM_CONF"] = str(layout.slurm_conf)
    marker = daemon_marker(layout.root)
    return {**env, **marker.env()} if marker else env


def as_host(address: str) -> list[str]:
    """The argv prefix that runs a command with ``address`` as its hostname, in a UTS namespace of its own.

    With ``NoCtldInAddrAny`` (slurmctld) or ``NoInAddrAny`` (slurmdbd) in
    ``CommunicationParameters`` a Slurm daemon listens on the address its
    ``gethostname()`` resolves to instead of every interface; here that is
    127.0.0.1, while the nodes dial the head's address. Only the hostname
    changes; the network stack is this host's.
    """
    return ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', address]


def as_node(hosts_file: os.PathLike | str) -> list[str]:
    """The argv prefix that runs a command seeing ``hosts_file`` as /etc/hosts, in a mount namespace of its own.

    For slurmd: with ``NoInAddrAny`` (slurmd.conf) it listens on the address its
    hostname resolves to, and ``hosts_file`` maps this host's name to the node's
    address. The hostname itself stays this host's, so job steps keep it (the
    workbench tells its processes by host name). Job steps inherit the mount
    namespace and so resolve the name to their node's address too. Propagation
    ``slave``: mounts made on this host later still show inside; the bind mount
    never shows outside, and goes with the last process of the namespace.
    """
    return [
        "unshare",
        "--mount",
        "--propagation",
        "slave",
        "--",
        "sh",
        "-c",
        'mount --bind "$0" /etc/hosts && exec "$@"',
        str(hosts_file),
    ]


def start(layout: Layout, state: dict, name: str, cmd: list[str], env: Mapping[str, str]) -> None:
    """Start one daemon in the foreground in its own session; record its PID, start time and argv.

    Its own log goes where its config says; stdout/stderr (early failures) to ``log/<name>.stdout``.
    """
    out = open(layout.log / f"{name}.stdout", "ab")
    try:
        proc = subprocess.Popen(
            cmd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=layout.root,
        )
    finally:
        out.close()
    state["daemons"][name] = {"pid": proc.pid, "started": start_time(proc.pid), "argv": cmd}
    write_state(layout, state)


def stop_recorded(layout: Layout, state: Optional[dict], timeout_s: float = 20.0) -> tuple[list[str], dict[str, str]]:
    """SIGTERM the recorded daemons still alive that prove they are the cluster's, SIGKILL after
    ``timeout_s``; return their names, and for each live recorded one that does not prove it, why
    (never signalled).

    In :data:`STOP_TIERS`; daemons of one tier stop together.
    """
    if not state:
        return [], {}
    marker = daemon_marker(layout.root)
    stopped: list[str] = []
    refused: dict[str, str] = {}
    for tier in STOP_TIERS:
        procs: dict[str, Proc] = {}
        for name in tier:
            entry = state["daemons"].get(name)
            why = daemon_proc(entry).why_not_ours(marker) if alive(entry) else "exited"
            if why is None:
                procs[name] = daemon_proc(entry)
            elif "exited" in why:
                reap(entry)
            else:
                refused[name] = f"{why}; not signalled"
        for proc in procs.values():
            proc.signal(signal.SIGTERM, marker)
        left = wait_exited(list(procs.values()), timeout_s)
        for proc in left:
            proc.signal(signal.SIGKILL, marker)
        wait_exited(left, 5)
        for name in procs:
            reap(state["daemons"][name])
        stopped.extend(procs)
    return stopped, refused


def wait_exited(procs: list[Proc], timeout_s: float) -> list[Proc]:
    """Wait until each process is gone or a zombie; return those still running.

    Not ``psutil.wait_procs``: daemons started by an earlier process are
    children of init, which may reap them only seconds later.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in procs if p.alive()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def reap(entry: Optional[Mapping[str, Any]]) -> None:
    """Collect a dead daemon that this process started, so it does not stay a zombie."""
    if entry:
        try:
            os.waitpid(entry["pid"], os.WNOHANG)
        except ChildProcessError:
            pass


def run_client(layout: Layout, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run one Slurm client command (sinfo, sacctmgr, ...) against this cluster."""
    result = subprocess.run(argv, env=daemon_env(layout), capture_output=True, text=True, timeout=30)
    if check and result.returncode:
        raise DevClusterError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def wait_until(condition, deadline: float, layout: Layout, daemon: str, poll_s: float = 0.2) -> None:
    """Poll ``condition`` until true; past ``deadline``, DevClusterError naming ``daemon``'s logs."""
    while not condition():
        if time.monotonic() > deadline:
            raise DevClusterError(
                f"{daemon} not ready in time; see {layout.log_of(daemon)} and {layout.log / (daemon + '.stdout')}"
            )
        time.sleep(poll_s)
