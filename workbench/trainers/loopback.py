"""Keep every listener of a run on one address: 127.0.0.1 locally, the node's own address on a cluster.

torchft's control path can kill training and serves the full model: the
lighthouse's ``POST /replica/<id>/kill``, each Manager's gRPC ``Kill``, the
checkpoint HTTP server a healing peer fetches weights from, and the TCPStores
the process groups rendezvous on. Upstream, all of them bind every interface
(the Manager's ``[::]`` is hard-coded). For a run on one machine nothing needs
to be reachable from elsewhere, so the workbench binds each to loopback:

- lighthouse: ``--bind 127.0.0.1:PORT`` (workbench/controller/lighthouse.py);
- gloo: ``GLOO_SOCKET_IFNAME=lo``;
- Manager server: :func:`install` swaps ``[::]`` for ``127.0.0.1`` in the
  bind address torchft passes to ``ManagerServer``, and advertises 127.0.0.1;
- checkpoint server: :class:`LoopbackHTTPServer` replaces torchft's IPv6
  any-address server, and :func:`loopback_address` the advertised address;
- TCPStores: :func:`loopback_store` hands the store a socket already bound to
  127.0.0.1 (``master_listen_fd``), and :func:`loopback_process_group`
  subclasses a torchft process group to host its rendezvous store that way.

:func:`install` patches torchft's module attributes (the private ones through
:mod:`workbench.trainers.compat.torchft_compat`), so it also covers a
Manager and process group that someone else builds (torchtitan's
``TorchFTManager`` calls ``torchft.ProcessGroupGloo(...)`` and
``torchft.Manager(...)`` without a hostname); call it before they are built.

On a cluster the nodes must reach each other, so there :func:`bind_to` sets
the one address every listener binds to the node's own (``JobContext.listen_host``:
Slurm's ``NodeAddr``, on the dev cluster the node's namespace address), never a
wildcard, and gloo's interface to the one holding it (:func:`interface_of`).
docs/security.md says what stays exposed and to whom.

A heal records where its bytes came from (:func:`route`): torchft issue 329
was a heal over the wrong interface that took ~800 s instead of ~20 s.

Importing this module imports neither torch nor torchft (the functions that
patch or build their objects import them): a job binds and learns its
interface before it imports them.
"""

from __future__ import annotations

import socket
from http.server import ThreadingHTTPServer
from urllib.parse import urlsplit

import psutil

from workbench.trainers.compat import torchft_compat

HOST = "127.0.0.1"
_LISTEN_SOCKETS: list[socket.socket] = []


def bind_to(host: str) -> None:
    """Every listener made from now on binds ``host`` (a loopback or the node's own address)."""
    global HOST
    HOST = host


def interface_of(address: str) -> str:
    """The name of this network stack's interface that holds ``address`` (``lo`` for a loopback)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    raise LookupError(f"no interface here holds {address}")


def route(url_or_host: str) -> dict:
    """Where a connection to ``url_or_host`` goes: the peer's address, and this side's address and interface."""
    host = urlsplit(url_or_host).hostname if "//" in url_or_host else url_or_host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))  # UDP: picks the route, sends nothing
        local = s.getsockname()[0]
    try:
        iface = interface_of(local)
    except LookupError:
        iface = None
    return {"served_from": host, "local_address": local, "interface": iface}


def heal_fields(metadata: str, seconds: float, nbytes: int) -> dict:
    """What every ``heal`` event carries about its transfer: source, route and rate."""
    try:
        where = route(metadata)
    except (OSError, TypeError, ValueError):
        where = {"served_from": None, "local_address": None, "interface": None}
    return {**where, "bytes_per_s": nbytes / seconds if seconds > 0 else None}


class LoopbackHTTPServer(ThreadingHTTPServer):
    address_family = socket.AF_INET

    def __init__(self, server_address, handler) -> None:
        super().__init__((HOST, server_address[1]), handler)


def loopback_store():
    """A master TCPStore listening on 127.0.0.1 only (upstream binds every interface)."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    sock.listen(128)
    store = dist.TCPStore(
        HOST, sock.getsockname()[1], is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno()
    )
    _LISTEN_SOCKETS.append(sock)  # the store serves on this fd: keep the socket object alive
    return store


def loopback_address(transport) -> str:
    return f"http://{HOST}:{torchft_compat.http_transport_port(transport)}/checkpoint/"


def install(host: str = None) -> None:
    """Patch torchft so the Manager server, checkpoint server and process groups' stores bind :data:`HOST`
    (``host`` when given)."""
    import torchft
    import torchft.checkpointing.http_transport as http_transport

    if host:
        bind_to(host)
    torchft_compat.replace_checkpoint_http_server(LoopbackHTTPServer)
    http_transport.HTTPTransport.address = loopback_address
    upstream = torchft_compat.manager_server_factory()
    if getattr(upstream, "_workbench_loopback", False):
        return

    def loopback_manager_server(*args, bind: str, **kwargs):
        return upstream(*args, **{**kwargs, "hostname": HOST}, bind=bind.replace("[::]", HOST))

    loopback_manager_server._workbench_loopback = True
    torchft_compat.set_manager_server_factory(loopback_manager_server)
    for name in ("ProcessGroupGloo", "ProcessGroupNCCL"):
        base = getattr(torchft, name, None)
        if base is not None:
            setattr(torchft, name, loopback_process_group(base))


def loopback_process_group(base: type) -> type:
    """A subclass of the torchft process group ``base`` whose rendezvous store listens on loopback."""

    class LoopbackProcessGroup(base):
        def get_reconfigure_handle(self) -> str:
            return torchft_compat.reconfigure_handle(self, HOST, loopback_store)

    LoopbackProcessGroup.__name__ = LoopbackProcessGroup.__qualname__ = f"Loopback{base.__name__}"
    return LoopbackProcessGroup


def loopback_process_group_gloo():
    """torchft's ProcessGroupGloo whose rendezvous store listens on loopback."""
    from torchft.process_group import ProcessGroupGloo

    return loopback_process_group(ProcessGroupGloo)
