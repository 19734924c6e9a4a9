"""torchft's private names the trainers reach, one function each (torchft-nightly 2026.10.26).

Each docstring names the private and why torchft's public API does not serve.
torchft is imported inside the functions that need the module (see the
package docstring). ``tests/test_upstream_compat.py`` checks every name here
on the installed torchft.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable

# -- the Manager ---------------------------------------------------------------


def replace_client(manager, wrap: Callable[[Any], Any]) -> None:
    """The Manager's ManagerClient becomes ``wrap(client)``.

    ``Manager._client`` is the gRPC client of the group's ManagerServer, through
    which the Manager asks for each quorum (``_quorum``) and sends each commit
    vote (``should_commit``). torchft has no hook on either: the workbench
    answers a one-rank group's vote in process (``torchft/commit_vote.py``) and
    renumbers quorum ids across lighthouse restarts (:func:`map_quorum_results`).
    """
    manager._client = wrap(manager._client)


class _MappedQuorumClient:
    """A ManagerClient whose ``_quorum`` results pass through a function; everything else is the client's."""

    def __init__(self, client, after: Callable[[Any], Any]) -> None:
        self._client = client
        self._after = after

    def _quorum(self, *args, **kwargs):
        return self._after(self._client._quorum(*args, **kwargs))

    def __getattr__(self, name):
        return getattr(self._client, name)


def map_quorum_results(manager, after: Callable[[Any], Any]) -> None:
    """Every quorum result the Manager receives is ``after(result)`` (it may change ``quorum_id`` in place).

    ``Manager._async_quorum`` calls its client's private ``_quorum`` and acts on
    the result at once (reconfigures the process group when the id changed);
    torchft exposes the result to no callback, so the client is wrapped
    (:func:`replace_client`).
    """
    replace_client(manager, lambda client: _MappedQuorumClient(client, after))


def wrap_async_quorum(manager, wrap: Callable[[Callable], Callable]) -> None:
    """The Manager's quorum, as run on its quorum thread, becomes ``wrap(quorum)``.

    ``Manager._async_quorum`` is what ``start_quorum`` submits to the quorum
    thread: the lighthouse round trip and the process group's reconfiguration.
    The public ``start_quorum`` only submits it and ``wait_quorum`` only waits,
    so the round trip itself (the timing mode's ``quorum_rtt``) is timed here.
    """
    manager._async_quorum = wrap(manager._async_quorum)


def quorum_id(manager) -> int:
    """The id of the quorum the Manager last configured its process group for (``Manager._quorum_id``).

    torchft logs it with each commit (``torchft_commits``), which the trainers
    read; this is the value where there is no record: structured logs off, or a
    semi-synchronous inner step, which votes on nothing. No public getter.
    """
    return manager._quorum_id


def is_healing(manager) -> bool:
    """Whether the last quorum told this Manager to heal and the received state is not applied yet (``_healing``)."""
    return manager._healing


def apply_pending_heal(manager) -> None:
    """Load the checkpoint the quorum received and leave the healing state, now.

    What torchft's synchronous-quorum ``start_quorum`` does
    (``Manager._apply_pending_state_dict``, then ``_healing = False``). With
    the asynchronous quorum torchtitan's Manager uses, torchft applies it only
    in ``should_commit``, after a forward and backward on stale weights; the
    public API has no call for it (``titan/hooks.py``, problem 2).
    """
    manager._apply_pending_state_dict()
    manager._healing = False


def checkpoint_transport(manager):
    """The Manager's checkpoint transport (``Manager._checkpoint_transport``).

    torchtitan builds the Manager and torchft its default transport inside it,
    so the workbench never holds it; the titan hooks wrap its
    ``recv_checkpoint`` to measure a heal. No public getter.
    """
    return manager._checkpoint_transport


def state_dict_keys(manager) -> list[str]:
    """The keys of the state-dict pairs registered with the Manager (``Manager._user_state_dicts``)."""
    return list(manager._user_state_dicts)


def state_dict_fn(manager, key: str) -> Callable:
    """The state-dict function registered under ``key`` (``Manager._user_state_dicts``; no public getter)."""
    return manager._user_state_dicts[key]


def load_fn(manager, key: str) -> Callable:
    """The load function registered under ``key`` (``Manager._load_state_dict_fns``; no public getter)."""
    return manager._load_state_dict_fns[key]


def replace_state_dict_fn(manager, key: str, load_state_dict: Callable, state_dict: Callable) -> None:
    """The pair registered under ``key`` becomes this one (``_user_state_dicts``, ``_load_state_dict_fns``).

    ``register_state_dict_fn`` refuses a key already registered and torchft has
    no way to unregister one; torchtitan registers its pair when it builds the
    checkpointer, before the workbench can act (``titan/rank_state.py``).
    """
    manager._user_state_dicts[key] = state_dict
    manager._load_state_dict_fns[key] = load_state_dict


def manager_state_dict(manager) -> dict:
    """The full state the Manager sends a healing peer: the user state dicts and its own (``_manager_state_dict``).

    A ``PGTransport`` receives in place into the state its ``state_dict``
    callable returns, which must have the layout of what the sender sends;
    the public ``Manager.state_dict`` is torchft's step counters alone.
    """
    return manager._manager_state_dict()


def manager_process_group(manager):
    """The process group the Manager reconfigures each quorum (``Manager._pg``).

    The Manager holds the one current process group of the quorum; dropping
    it when a collective fails (``torchft/collective_failure.py``) needs that
    one. No public getter.
    """
    return manager._pg


def manager_logger(manager):
    """The Manager's logger (``Manager._logger``), which prefixes each line with the replica and rank.

    The lean DDP hook logs a failed all-reduce on it, as torchft's own hook does.
    """
    return manager._logger


def manager_server_factory() -> Callable:
    """What ``Manager.__init__`` builds its ManagerServer with: the module global ``torchft.manager.ManagerServer``."""
    import torchft.manager

    return torchft.manager.ManagerServer


def set_manager_server_factory(factory: Callable) -> None:
    """Every Manager built from now on builds its server with ``factory`` (``torchft.manager.ManagerServer``).

    ``Manager.__init__`` calls that module global with ``bind=f"[::]:{port}"``
    hard-coded and takes no bind address; loopback.py binds it to one address.
    """
    import torchft.manager

    torchft.manager.ManagerServer = factory


def replace_future_timeout(wrap: Callable[[Callable], Callable]) -> None:
    """``torchft.manager.future_timeout`` becomes ``wrap(future_timeout)``, in this process.

    ``Manager.wrap_future`` arms a timer on every collective's future through
    that module global (imported from ``torchft.futures``); the Manager has no
    option to skip it (``torchft/collective_failure.py``, ``pg_timeout_only``).
    """
    import torchft.manager

    torchft.manager.future_timeout = wrap(torchft.manager.future_timeout)


# -- process groups ------------------------------------------------------------


def wrapped_process_group(wrapper):
    """The process group a torchft ``ProcessGroupWrapper`` holds now (``_pg``), None once aborted.

    ``abort`` drops that last reference (destroying the group) and sets it to
    None; the workbench checks the group it saw fail is still the current one
    before it aborts. No public getter.
    """
    return getattr(wrapper, "_pg", None)


def reconfigure_handle(pg, host: str, make_store: Callable[[], Any]) -> str:
    """``ProcessGroup.get_reconfigure_handle`` of torchft, with its rendezvous store made by ``make_store``.

    Upstream's builds the store on every interface and advertises
    ``socket.gethostname()``; a subclass that binds it elsewhere must keep the
    same handle, built from ``_rendezvous_store``, ``_handle_id()`` and
    ``_global_rank`` (``loopback.py``).
    """
    if pg._rendezvous_store is None:
        pg._rendezvous_store = make_store()
    return json.dumps(
        {"id": pg._handle_id(), "store": f"{host}:{pg._rendezvous_store.port}", "global_rank": pg._global_rank}
    )


# -- checkpoint transports -----------------------------------------------------


def replace_checkpoint_http_server(server_class: type) -> None:
    """torchft's checkpoint HTTP server class (``http_transport._IPv6HTTPServer``) becomes ``server_class``.

    ``HTTPTransport.__init__`` builds that module global on every interface
    (``("", 0)``), with no bind address to give it (``loopback.py``).
    """
    import torchft.checkpointing.http_transport as http_transport

    http_transport._IPv6HTTPServer = server_class


def http_transport_port(transport) -> int:
    """The port an ``HTTPTransport``'s checkpoint server listens on (``HTTPTransport._server``).

    Its public ``address()`` advertises ``socket.gethostname()`` with it;
    loopback.py replaces ``address()`` to advertise the address it binds.
    """
    return transport._server.socket.getsockname()[1]


def http_transport_with_fetch(fetch: Callable[[str, Any], Any]) -> type:
    """torchft's ``HTTPTransport`` whose fetch of one checkpoint (or chunk) is ``fetch(address, timeout)``.

    ``HTTPTransport._load_from_address`` (a classmethod) opens the URL and
    deserialises the stream in one call; torchft-lite times its two halves
    (the peer staging its state, the transfer) for the ``heal`` event.
    """
    from torchft.checkpointing.http_transport import HTTPTransport

    class FetchingHTTPTransport(HTTPTransport):
        @classmethod
        def _load_from_address(cls, address, timeout):
            return fetch(address, timeout)

    return FetchingHTTPTransport


def streaming_load(stream, weights_only: bool = False):
    """torchft's deserialiser of a checkpoint streamed over HTTP (``checkpointing._serialization._streaming_load``).

    The format is what torchft's server writes (``_streaming_save``); a fetch
    in place of ``_load_from_address`` must read it the same way. On this torch
    both are torch's ``torch.distributed._serialization`` pair, which torchft
    imports where it exists (else its slow ``torch.load`` fallback).
    """
    from torchft.checkpointing._serialization import _streaming_load

    return _streaming_load(stream, weights_only=weights_only)


@contextlib.contextmanager
def pg_transport_process_group(transport, pg):
    """Inside the block, a ``PGTransport`` sends and receives over ``pg`` (``PGTransport._pg``), then its own again.

    torchft-lite times the first receive of a heal (the serving side's
    staging) through a process group that wraps the transport's own.
    """
    previous = transport._pg
    transport._pg = pg
    try:
        yield
    finally:
        transport._pg = previous


# -- DistributedDataParallel ---------------------------------------------------


def comm_hook(ddp_class: type) -> Callable:
    """The gradient hook a torchft ``DistributedDataParallel`` class registers (``_comm_hook``, a staticmethod)."""
    return ddp_class._comm_hook


def ddp_with_comm_hook(base: type, hook: Callable, name: str) -> type:
    """A subclass of torchft's ``DistributedDataParallel`` ``base`` whose gradient hook is ``hook(state, bucket)``.

    The parameters must be named so: torch's ``register_comm_hook`` looks them up by name
    (``KeyError: 'bucket'`` for a ``*args`` wrapper).

    ``DistributedDataParallel.__init__`` registers ``self._comm_hook`` with
    ``register_comm_hook``, and torch's DDP takes a comm hook only once, so
    another hook must take that name.
    """
    return type(name, (base,), {"_comm_hook": staticmethod(hook), "__qualname__": name})


# -- LocalSGD and DiLoCo -------------------------------------------------------


def local_step(algorithm) -> int:
    """Inner steps since the last sync of a ``LocalSGD`` or ``DiLoCo`` (``_local_step``)."""
    return algorithm._local_step


def set_local_step(algorithm, step: int) -> None:
    """Move a ``LocalSGD``'s or ``DiLoCo``'s inner-step counter (``_local_step``).

    Neither class has a call for an early sync; its optimizer hook syncs when
    the counter reaches the window's end (``lite/semi_sync.py``, "Catching up").
    """
    algorithm._local_step = step


def sync_every(algorithm) -> int:
    """A window's inner steps (``_sync_every``): ``LocalSGD``'s ``sync_every``; ``DiLoCo``'s per fragment."""
    return algorithm._sync_every


def fragment_sync_delay(diloco) -> int:
    """Inner steps a ``DiLoCo`` fragment's all-reduce is issued before the step that waits for it
    (``_fragment_sync_delay``)."""
    return diloco._fragment_sync_delay


def diloco_fragments(diloco) -> list:
    """A ``DiLoCo``'s fragments (``_fragments``), whose ``prepare_sync``/``perform_sync`` the workbench times.

    No public getter; the fragments are built inside ``DiLoCo.__init__``.
    """
    return diloco._fragments


def diloco_current_fragment(diloco) -> int:
    """The index of the fragment ``DiLoCo`` syncs next (``_current_fragment()``); the join syncs it by hand."""
    return diloco._current_fragment()
