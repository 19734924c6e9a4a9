"""Which process a single-point fault kind hits: the store host, rank 0, the checkpoint writer.

A fault kind's ``process`` (``faultkinds``) names a field of the trainer's row
(``trainers/registry.py``); its value says where that process is recorded:

| value | the process |
|---|---|
| ``"group"`` | the target group's own process (its ``start`` event) |
| ``"replica0"`` | the process recorded as replica 0: rank 0 of a one-job trainer (ddp-restart), whatever the target |
| ``"child_rank0"`` | the target group's child started with ``RANK=0`` (TorchTitan's ranks; the job hosts the store) |

Only a local process's environment can be read, so ``child_rank0`` is a
local-only answer, as the kinds that use it are (their ``backends``).
"""

from __future__ import annotations

from typing import Optional

import psutil

from workbench.cluster.procs import Proc
from workbench.errors import FaultError


def target_view(kind, trainer, state, target: int):
    """The ``ReplicaView`` the fault is recorded against (and injected on)."""
    where = "group" if kind.process == "group" else getattr(trainer, kind.process, None)
    if where is None:
        raise FaultError(f"action: {kind.name} does not apply to trainer {trainer.name} (it has no {kind.process})")
    return state.replicas[0 if where == "replica0" else target]


def target_proc(kind, trainer, view) -> Optional[Proc]:
    """The process to signal, when it is not the view's own (None: the view's ``live_proc``)."""
    if kind.process == "group" or getattr(trainer, kind.process, None) != "child_rank0":
        return None
    group = view.live_proc()
    if group is None:
        return None
    for child in group.descendants():
        if _env(child.pid).get("RANK") == "0":
            return child
    raise FaultError(f"target: replica {view.replica} has no live rank-0 process yet")


def _env(pid: int) -> dict:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}
