"""A real Slurm cluster on localhost, for demos and tests: development tooling, not a backend.

Debian's Slurm 22.05 is built with ``MULTIPLE_SLURMD``, so one host can run
several ``slurmd``, each pretending to be a node: ``NodeName=n[1-4]
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
``slurmctld``, ``slurmd -N n1..n4``
    the scheduler and the nodes.

A client needs only ``SLURM_CONF`` (see :func:`up` / :func:`client_env`). The
Slurm backend finds a running dev cluster, and the slurmd its ``slurmd_kill``
fault kills and has restarted (``workbench cluster restart-slurmd NODE``), through
the state directory's convention it owns (:mod:`workbench.cluster.slurm.statedir`),
without importing this package; :func:`find_slurm_conf`, :func:`slurmd_pid` and
:func:`restart_slurmd` are the same from here.
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
ports (22.05 has no bind address for them); ``mariadbd`` on no TCP port, only on
a Unix socket in a 0700 directory (see :mod:`.services` for its accounts);
munge on a Unix socket.

Modules: :mod:`.layout` (shape, paths, state file), :mod:`.daemons`
(processes), :mod:`.config` (ports, slurm.conf, slurmdbd.conf),
:mod:`.services` (munge, MariaDB, slurmdbd), :mod:`.lifecycle` (this
interface), :mod:`.cli` (``workbench cluster``).
"""

from workbench.cluster.slurm.statedir import DEFAULT_STATE_DIR, ENV_STATE_DIR, resolve_state_dir
from workbench.devcluster.cli import main
from workbench.devcluster.daemons import INSTALL_HINT, REQUIRED_PROGRAMS
from workbench.devcluster.layout import ACCOUNT, CLUSTER_NAME, DAEMONS, NODES, PARTITION, DevClusterError
from workbench.devcluster.lifecycle import (
    client_env,
    daemon_pids,
    down,
    find_slurm_conf,
    restart_slurmd,
    slurmd_pid,
    status,
    up,
)

__all__ = [
    "ACCOUNT",
    "CLUSTER_NAME",
    "DAEMONS",
    "DEFAULT_STATE_DIR",
    "ENV_STATE_DIR",
    "INSTALL_HINT",
    "NODES",
    "PARTITION",
    "REQUIRED_PROGRAMS",
    "DevClusterError",
    "client_env",
    "daemon_pids",
    "down",
    "find_slurm_conf",
    "main",
    "resolve_state_dir",
    "restart_slurmd",
    "slurmd_pid",
    "status",
    "up",
]
