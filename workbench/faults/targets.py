"""Which process a single-point fault kind hits: the store host, rank 0, the checkpoint writer.

A fault kind's ``process`` (``faultkinds``) names a field of the trainer's row
(``trainers/registry.py``); its value says where that process is recorded:

| value | the process |
|---|---|
| ``"group"`` | the target group's own process (its ``start`` event) |
| ``"replica0"`` | the process recorded as replica 0: rank 0 of a one-job trainer (ddp-restart), whatever the target |
| ``"child_rank0"`` | the target group's child that is rank 0 (TorchTitan's ranks; the job hosts the store) |

Which child is rank 0: the one its job recorded as rank 0
(``run/rank_pids.py``: a rank the job forks warm, ``trainers/forked.py``, gets
its environment after the fork, so ``/proc/<pid>/environ`` still shows the
job's and cannot say), among the live descendants of the group's proven
process. There is no other source to fall back on, and none is needed: the
record is absent only before the job has started its ranks, when there is no
rank 0 to hit; the fault is refused with "not started its ranks yet" (the
controller's schedule tries a refused fault again for 60 s, ``controller/fault_schedule.py``).
Only a local process's descendants can be listed, so ``child_rank0`` is a
local-only answer, as the kinds that use it are (their ``backends``).
"""

from __future__ import annotations

from typing import Optional

from workbench.cluster.procs import Proc
from workbench.errors import FaultError
from workbench.run.rank_pids import recorded_ranks


def target_view(kind, trainer, state, target: int):
    """The ``ReplicaView`` the fault is recorded against (and injected on)."""
    where = "group" if kind.process == "group" else getattr(trainer, kind.process, None)
    if where is None:
        raise FaultError(f"action: {kind.name} does not apply to trainer {trainer.name} (it has no {kind.process})")
    return state.replicas[0 if where == "replica0" else target]


def target_proc(kind, trainer, view, run_dir) -> Optional[Proc]:
    """The process to signal, when it is not the view's own (None: the view's ``live_proc``)."""
    if kind.process == "group" or getattr(trainer, kind.process, None) != "child_rank0":
        return None
    group = view.live_proc()
    if group is None:
        return None
    rank0 = next((pid for pid, rank in recorded_ranks(run_dir, view.replica, view.attempt).items() if rank == 0), None)
    if rank0 is None:
        raise FaultError(f"target: replica {view.replica} attempt {view.attempt} has not started its ranks yet")
    for child in group.descendants():
        if child.pid == rank0:
            return child
    raise FaultError(f"target: replica {view.replica}'s rank 0 (pid {rank0}) is no longer a live process of its job")
