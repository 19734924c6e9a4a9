"""The dev cluster's configuration: its TCP ports, slurmdbd's database password, slurm.conf and slurmdbd.conf.

Both files are rewritten by every cold ``up`` (so a changed state directory
or port block takes effect); the password is made once per state directory.
"""

from __future__ import annotations

import random
import secrets
import socket
from pathlib import Path
from typing import Mapping, Optional

from workbench.devcluster.layout import (
    CLUSTER_NAME,
    CPUS_PER_NODE,
    MEMORY_MB_PER_NODE,
    NODES,
    PARTITION,
    DevClusterError,
    Layout,
)

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
# slurm.conf's CommunicationParameters, and slurmd.conf's: NoInAddrAny makes a Slurm program bind every listener
# to the address its hostname resolves to (slurm_setup_addr), so slurmd alone reads it: an srun or sbatch on
# the head reading it would listen on 127.0.0.1 (what this host's name resolves to), out of the nodes' reach.
CTLD_PARAMS = "NoCtldInAddrAny"
SLURMD_PARAMS = "NoCtldInAddrAny,NoInAddrAny"
PORT_NAMES = ("slurmctld", "slurmdbd") + tuple(f"slurmd-{n}" for n in NODES)


def choose_ports(previous: Optional[Mapping[str, int]]) -> dict[str, int]:
    """Reuse the previous ports when all are free, else a free block at a random base.

    slurmd ports must be consecutive (``Port=<a>-<c>`` in the node line), so all
    ports come as one block. MariaDB has none: it listens on its Unix socket only.
    """
    if previous and set(previous) == set(PORT_NAMES) and all(_port_free(p) for p in previous.values()):
        return dict(previous)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000)
        block = list(range(base, base + len(PORT_NAMES)))
        if all(_port_free(p) for p in block):
            return dict(zip(PORT_NAMES, block))
    raise DevClusterError("found no block of free TCP ports in 20000-30000")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def db_password(layout: Layout) -> str:
    """slurmdbd's MariaDB password (its account reaches only the accounting DB), made once, mode 600."""
    if not layout.db_password.exists():
        layout.db_password.touch(mode=0o600)
        layout.db_password.write_text(secrets.token_hex(16))
    return layout.db_password.read_text().strip()


def write_configs(
    layout: Layout,
    ports: Mapping[str, int],
    user: str,
    node_addresses: Optional[Mapping[str, str]] = None,
    head: str = "127.0.0.1",
) -> None:
    """``node_addresses`` (node -> its namespace's address) gives each node its own line and ``NodeAddr``,
    and slurmctld the ``head`` address the nodes reach it at; None: every node on 127.0.0.1."""
    munge_auth = f"AuthInfo=socket={layout.munge_socket},cred_expire=10"
    first_slurmd = ports[f"slurmd-{NODES[0]}"]
    last_slurmd = ports[f"slurmd-{NODES[-1]}"]
    node_range = f"{NODES[0][0]}[{NODES[0][1:]}-{NODES[-1][1:]}]"
    spool = layout.slurmd_spool
    if node_addresses:
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr={node_addresses[n]} Port={ports[f'slurmd-{n}']} "
            f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB_PER_NODE} State=UNKNOWN"
            for n in NODES
        )
    else:
        node_lines = (
            f"NodeName={node_range} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"Port={first_slurmd}-{last_slurmd} CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB_PER_NODE} "
            f"State=UNKNOWN"
        )
    slurm_conf = f"""\
# Written by workbench.devcluster; rewritten by every cold `up`.
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost({head})
SlurmctldPort={ports["slurmctld"]}
# slurmctld binds the address its hostname resolves to, not every interface (lifecycle: its hostname is the head's).
CommunicationParameters={CTLD_PARAMS}
# slurmd reads slurmd.conf (this file plus NoInAddrAny): without this, slurmctld logs a hash mismatch per node.
DebugFlags=NO_CONF_HASH
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
{munge_auth}
StateSaveLocation={layout.ctld_state}
SlurmdSpoolDir={spool}/slurmd-%n
SlurmctldPidFile={layout.run}/slurmctld.pid
SlurmdPidFile={layout.run}/slurmd-%n.pid
SlurmctldLogFile={layout.log_of("slurmctld")}
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
AccountingStorageHost={head}
AccountingStoragePort={ports["slurmdbd"]}
# slurmctld authenticates to slurmdbd through this munge socket; without it: "no TRES from database".
AccountingStoragePass={layout.munge_socket}
AccountingStorageEnforce=associations
JobCompType=jobcomp/none
{node_lines}
PartitionName={PARTITION} Nodes={node_range} Default=YES MaxTime=INFINITE State=UP
"""
    slurmdbd_conf = f"""\
# Written by workbench.devcluster; rewritten by every cold `up`.
AuthType=auth/munge
{munge_auth}
DbdHost=localhost
DbdAddr={head}
# slurmdbd binds the address its hostname resolves to, not every interface (lifecycle: its hostname is the head's).
CommunicationParameters=NoInAddrAny
DbdPort={ports["slurmdbd"]}
SlurmUser={user}
PidFile={layout.run}/slurmdbd.pid
LogFile={layout.log_of("slurmdbd")}
DebugLevel=info
StorageType=accounting_storage/mysql
# localhost: MariaDB's Unix socket, found through $MYSQL_UNIX_PORT (slurmdbd.conf has no socket key).
StorageHost=localhost
StorageUser={DB_USER}
StoragePass={db_password(layout)}
StorageLoc={DB_NAME}
"""
    layout.slurm_conf.write_text(slurm_conf)
    layout.slurmd_conf.write_text(
        slurm_conf.replace(f"CommunicationParameters={CTLD_PARAMS}\n", f"CommunicationParameters={SLURMD_PARAMS}\n")
    )
    layout.slurmdbd_conf.write_text(slurmdbd_conf)
    # slurmdbd refuses a slurmdbd.conf that others can read (it holds the DB password).
    layout.slurmdbd_conf.chmod(0o600)


def write_hosts(
    layout: Layout,
    node_addresses: Mapping[str, str],
    hostname: Optional[str] = None,
    etc_hosts: Path = Path("/etc/hosts"),
) -> dict[str, Path]:
    """Per node, ``etc_hosts`` with ``hostname`` (this host's) resolving to the node's address; node -> path.

    Each node's slurmd sees its file as /etc/hosts (:func:`.daemons.as_node`), so with ``NoInAddrAny`` it
    binds the node's address while its hostname, and so every job step's, stays this host's.
    Every other name of ``etc_hosts`` (localhost among them) keeps its address.
    """
    hostname = hostname or socket.gethostname()
    kept = []
    for line in etc_hosts.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and hostname in fields[1:]:
            names = [f for f in fields[1:] if f != hostname]
            if names:
                kept.append(" ".join([fields[0], *names]))
        else:
            kept.append(line)
    paths = {}
    for node, addr in node_addresses.items():
        paths[node] = layout.hosts_of(node)
        paths[node].write_text(
            "\n".join(["# Written by workbench.devcluster for node " + node, *kept, f"{addr} {hostname}"]) + "\n"
        )
    return paths
