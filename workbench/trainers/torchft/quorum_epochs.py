"""Quorum ids that stay unique when the lighthouse restarts.

A restarted lighthouse numbers quorums from 1 again. torchft's Manager
rebuilds its process group only when the quorum id changes, and uses the id
as the communicator id of the rendezvous; so after a restart a replica can
skip a rebuild it needed, or rendezvous under an id already used, and we saw
``Connection closed by peer`` / ``Gloo connectFullMesh failed`` until the ids
moved past the old ones.

The run controller writes the lighthouse's epoch (how many times it has been
started, minus one) to ``<run_dir>/lighthouse/epoch`` *before* starting it.
Every quorum result a replica receives from that lighthouse therefore arrives
after the file was updated, so all replicas map it to the same
``epoch · STRIDE + id``, including a replica that never saw the old
lighthouse.
"""

from __future__ import annotations

from pathlib import Path

STRIDE = 1_000_000


def epoch_path(run_dir) -> Path:
    return Path(run_dir) / "lighthouse" / "epoch"


def read_epoch(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


class EpochQuorumClient:
    """Wraps a Manager's ManagerClient; only ``_quorum`` is changed."""

    def __init__(self, client, path: Path) -> None:
        self._client = client
        self._path = path

    def _quorum(self, *args, **kwargs):
        result = self._client._quorum(*args, **kwargs)
        epoch = read_epoch(self._path)
        if epoch:
            result.quorum_id = epoch * STRIDE + result.quorum_id
        return result

    def __getattr__(self, name):
        return getattr(self._client, name)


def install(manager, run_dir) -> None:
    manager._client = EpochQuorumClient(manager._client, epoch_path(run_dir))
