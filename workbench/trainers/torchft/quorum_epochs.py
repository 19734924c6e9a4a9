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

The Manager exposes a quorum result to no callback: the ids are renumbered
on their way from the Manager's client (:func:`workbench.trainers.compat.torchft_compat.map_quorum_results`).
"""

from __future__ import annotations

from pathlib import Path

from workbench.trainers.compat import torchft_compat

STRIDE = 1_000_000


def epoch_path(run_dir) -> Path:
    return Path(run_dir) / "lighthouse" / "epoch"


def read_epoch(path: Path) -> int:
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def install(manager, run_dir) -> None:
    """Every quorum id ``manager`` receives becomes ``epoch · STRIDE + id`` (see the module docstring)."""
    path = epoch_path(run_dir)

    def renumber(result):
        epoch = read_epoch(path)
        if epoch:
            result.quorum_id = epoch * STRIDE + result.quorum_id
        return result

    torchft_compat.map_quorum_results(manager, renumber)
