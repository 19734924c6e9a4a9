"""The dev cluster's network: each compute node in its own network namespace on one bridge.

``up`` gives every node what a real compute node has: a network stack of its
own with one address, reached from the head (slurmctld, slurmdbd, the
lighthouse, the run controller) and from the other nodes over a link. So a
replica group spread over two nodes talks to itself and to the lighthouse over
real addresses, and a listener bound to the wrong address shows.

Shape (``ip`` and the kernel's bridge, nothing else)::

    head (this host's stack)            node n1's namespace ``wbn-n1``
    bridge wbn-br 198.18.0.1/24 ─┬── veth wbn-n1 ══ wbn-n1p 198.18.0.11/24  (+ lo)
                                 ├── veth wbn-n2 ══ wbn-n2p 198.18.0.12/24
                                 └── ...

Addresses are from 198.18.0.0/15 (RFC 2544, benchmark networks): nothing
else on a machine uses them, and the namespaces get no default route, so no
byte of theirs can leave the machine. The host side of each veth is named
after its node, so its ``/sys/class/net/wbn-<node>/statistics`` counts every
byte that node sent (``rx_bytes``) and received (``tx_bytes``).

Every name starts with :data:`PREFIX`, which the workbench owns: :func:`remove_all`
finds namespaces and links by it, so it also cleans up after an ``up`` that
crashed half-way (qdiscs go with their links; the workbench makes no cgroups).
"""

from __future__ import annotations

import ipaddress
import subprocess
from typing import Iterable, Mapping, Optional, Sequence

PREFIX = "wbn-"
BRIDGE = f"{PREFIX}br"
SUBNET = ipaddress.ip_network("198.18.0.0/24")
HEAD_ADDRESS = str(SUBNET.network_address + 1)
FIRST_NODE_HOST = 11


class NetnsUnavailable(RuntimeError):
    """Namespaces, veth pairs or a bridge cannot be made here; the message says which command refused."""


def namespace(node: str) -> str:
    return f"{PREFIX}{node}"


def host_link(node: str) -> str:
    """The head-side end of the node's veth: its counters are the node's traffic."""
    return f"{PREFIX}{node}"


def node_link(node: str) -> str:
    return f"{PREFIX}{node}p"


def addresses(nodes: Sequence[str]) -> dict[str, str]:
    return {node: str(SUBNET.network_address + FIRST_NODE_HOST + i) for i, node in enumerate(nodes)}


def _ip(*argv: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", netns] if netns else []), *argv]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except FileNotFoundError:
        raise NetnsUnavailable("`ip` (iproute2) is not installed") from None
    if check and result.returncode:
        raise NetnsUnavailable(f"`{' '.join(cmd)}` failed: {result.stderr.strip() or result.returncode}")
    return result


def create(nodes: Sequence[str]) -> dict[str, str]:
    """The bridge, and per node a namespace with its veth and address; returns node -> address.

    Removes whatever a previous ``up`` left first. On any failure removes
    what it made and raises :class:`NetnsUnavailable`.
    """
    remove_all()
    nodes_addr = addresses(nodes)
    try:
        _ip("link", "add", BRIDGE, "type", "bridge")
        _ip("addr", "add", f"{HEAD_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        for node, addr in nodes_addr.items():
            ns = namespace(node)
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", netns=ns)
            _ip("link", "add", host_link(node), "type", "veth", "peer", "name", node_link(node))
            _ip("link", "set", node_link(node), "netns", ns)
            _ip("link", "set", host_link(node), "master", BRIDGE)
            _ip("link", "set", host_link(node), "up")
            _ip("addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", node_link(node), netns=ns)
            _ip("link", "set", node_link(node), "up", netns=ns)
    except BaseException:
        remove_all()
        raise
    return nodes_addr


def ours() -> dict[str, list[str]]:
    """The namespaces and head-side links whose names carry :data:`PREFIX` (made by any ``up``)."""
    result = _ip("netns", "list", check=False)
    spaces = [line.split()[0] for line in result.stdout.splitlines() if line.startswith(PREFIX)]
    result = _ip("-o", "link", "show", check=False)
    links = []
    for line in result.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                links.append(name)
    return {"netns": spaces, "links": links}


def remove_all() -> dict[str, list[str]]:
    """Delete every namespace and link with :data:`PREFIX`; returns what was there.

    Deleting a namespace deletes its end of each veth and so the pair; the
    links left (the bridge, a veth whose peer never moved) go by name.
    """
    found = ours()
    for ns in found["netns"]:
        _ip("netns", "delete", ns, check=False)
    for link in ours()["links"]:
        _ip("link", "delete", link, check=False)
    return found


def available() -> Optional[str]:
    """None when this host can make the network, else one line saying why not (a probe namespace)."""
    probe = f"{PREFIX}probe"
    try:
        _ip("netns", "add", probe)
    except NetnsUnavailable as e:
        return str(e)
    finally:
        _ip("netns", "delete", probe, check=False)
    return None


def exec_prefix(node: str) -> list[str]:
    """The argv prefix that runs a command inside ``node``'s network namespace, and nothing else changed.

    ``nsenter --net``, not ``ip netns exec``: the latter also mounts a fresh
    ``/sys`` in a new mount namespace, without ``/sys/fs/cgroup``, and slurmd
    then fails ("Unable to initialize cgroup plugin"). Both exec, so the PID
    recorded is the command's.
    """
    return ["nsenter", f"--net=/run/netns/{namespace(node)}", "--"]


def link_bytes(node: str) -> dict[str, int]:
    """Bytes ``node`` has sent (``sent``) and received (``received``) over its link, from the kernel's counters."""
    stats = f"/sys/class/net/{host_link(node)}/statistics"
    with open(f"{stats}/rx_bytes") as rx, open(f"{stats}/tx_bytes") as tx:
        return {"sent": int(rx.read()), "received": int(tx.read())}


def describe(node_addresses: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {
        node: {"address": addr, "netns": namespace(node), "link": host_link(node)}
        for node, addr in node_addresses.items()
    }


def listeners(node: str) -> list[tuple[str, int, str]]:
    """Every TCP listener inside ``node``'s namespace: (address, port, process), from ``ss -ltnp``."""
    result = subprocess.run([*exec_prefix(node), "ss", "-Hltnp"], capture_output=True, text=True, timeout=20)
    return parse_ss(result.stdout.splitlines())


def parse_ss(lines: Iterable[str]) -> list[tuple[str, int, str]]:
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        local = fields[3]
        host, _, port = local.rpartition(":")
        host = host.strip("[]").split("%")[0]
        out.append((host, int(port), fields[5] if len(fields) > 5 else ""))
    return out


def pids(ns: str) -> list[int]:
    """PIDs of the processes inside namespace ``ns`` (``ip netns pids``)."""
    result = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]
