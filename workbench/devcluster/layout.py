"""The dev cluster's shape, its state directory's paths, and its state file.

Where the state directory is, its ``etc/slurm.conf`` and its ``state.json`` are the Slurm
backend's convention (:mod:`workbench.cluster.slurm.statedir`), which the dev cluster follows so
that the backend finds it without importing it.

One state directory holds everything (configs, logs, keys, databases, spools)
and ``state.json``, the record of the daemons :func:`~workbench.devcluster.up`
started: name -> ``pid``, ``started`` (so a reused PID is never taken for
ours) and ``argv`` (so one daemon can be started again alone). Writers hold
:func:`locked`; readers may read without it, since :func:`write_state` replaces
the file atomically.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from workbench.cluster.slurm import statedir

CLUSTER_NAME = "workbench"
NODES = ("n1", "n2", "n3", "n4")  # 4: two 2-node replica groups side by side
PARTITION = "debug"
ACCOUNT = "workbench"
# Oversubscribed on purpose: tiny CPU jobs, several at once on a 2-core host.
# SlurmdParameters=config_overrides makes slurmd accept more than the host has.
CPUS_PER_NODE = 4
MEMORY_MB_PER_NODE = 4096

# Start order.
DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld") + tuple(f"slurmd-{n}" for n in NODES)

# Unix socket paths (sun_path) hold 107 bytes and a NUL.
MAX_SOCKET_PATH = 107


class DevClusterError(RuntimeError):
    """The dev cluster could not be brought up or queried, or a daemon asked for is not one it runs.

    The message is one line: which daemon or node, and where to look (its log).
    """


class Layout:
    """Every path under one state directory."""

    def __init__(self, root: Path):
        self.root = root
        self.etc = root / "etc"
        self.slurm_conf = root / statedir.SLURM_CONF
        # slurmd's own: slurm.conf plus NoInAddrAny, which no other Slurm program here may read (config.py).
        self.slurmd_conf = self.etc / "slurmd.conf"
        # slurmdbd ignores -f and reads slurmdbd.conf beside $SLURM_CONF.
        self.slurmdbd_conf = self.etc / "slurmdbd.conf"
        self.log = root / "log"
        # Private (0700): PID files and MariaDB's socket, which only the cluster's user may connect to.
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
        self.state_file = root / statedir.STATE_FILE
        self.lock_file = root / "lock"

    @classmethod
    def of_slurm_conf(cls, conf: os.PathLike | str) -> Optional["Layout"]:
        """The layout whose ``slurm.conf`` is ``conf``, or None when ``conf`` is not where a dev cluster keeps it."""
        root = statedir.state_dir_of(conf)
        return cls(root) if root else None

    def hosts_of(self, node: str) -> Path:
        """The hosts file bind-mounted over /etc/hosts for ``node``'s slurmd: this host's name -> the node's address."""
        return self.etc / f"hosts-{node}"

    def log_of(self, daemon: str) -> Path:
        return self.log / f"{daemon}.log"


def check_state_dir(layout: Layout) -> None:
    """slurm.conf cannot quote paths, AuthInfo splits on commas, Unix sockets have 107 bytes."""
    text = str(layout.root)
    if any(c.isspace() or c in ",=#\"'" for c in text):
        raise DevClusterError(
            f"state_dir {text!r}: must not contain whitespace, quotes, ',', '=' or '#' "
            f"(set ${statedir.ENV_STATE_DIR} or pass another directory)"
        )
    longest = max(len(os.fsencode(p)) for p in (layout.munge_socket, layout.mysql_socket))
    if longest > MAX_SOCKET_PATH:
        raise DevClusterError(
            f"state_dir {text!r}: too long for a Unix socket path inside it "
            f"({longest} > {MAX_SOCKET_PATH} bytes); use a shorter directory"
        )


@contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """One writer of the state file at a time per state directory (another process or thread waits)."""
    with open(layout.lock_file, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_state(layout: Layout) -> Optional[dict]:
    """``state.json``: ``ports``, ``user``, ``network``, ``daemons`` and ``restart_slurmd``; None when there is
    none (never brought up)."""
    return statedir.read_state(layout.root)


def write_state(layout: Layout, state: Mapping[str, Any]) -> None:
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(layout.state_file)
