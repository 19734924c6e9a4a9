"""Which process a single-point fault kind hits: the store host, rank 0, the checkpoint writer.

A fault kind's ``process`` (``faultkinds``) names a field of the trainer's row
(``trainers/registry.py``); its value says where that process is recorded:

| value | the process |
|---|---|
| ``"group"`` | the target group's own process (its ``start`` event) |
| ``"replica0"`` | the process recorded as replica 0: rank 0 of a one-job trainer (ddp-restart), whatever the target |
| ``"child_rank0"`` | the target group's child that is rank 0 (TorchTitan's ranks; the job hosts the store) |

Which child is rank 0: the one whose PID rank 0's own event file
(``replica-<r>.attempt-<a>.rank-0.jsonl``, every event carries its writer's PID)
names, among the descendants of the group's proven process; else the one
started with ``RANK=0`` in its environment. The event file is needed because a
rank the job forks warm (``trainers/forked.py``) gets its environment after the
fork: ``/proc/<pid>/environ`` still shows the job's. Only a local process's
descendants can be listed, so ``child_rank0`` is a local-only answer, as the
kinds that use it are (their ``backends``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import psutil

from workbench.cluster.procs import Proc
from workbench.errors import FaultError
from workbench.events.layout import EVENTS_DIR


def target_view(kind, trainer, state, target: int):
    """The ``ReplicaView`` the fault is recorded against (and injected on)."""
    where = "group" if kind.process == "group" else getattr(trainer, kind.process, None)
    if where is None:
        raise FaultError(f"action: {kind.name} does not apply to trainer {trainer.name} (it has no {kind.process})")
    return state.replicas[0 if where == "replica0" else target]


def target_proc(kind, trainer, view, run_dir=None) -> Optional[Proc]:
    """The process to signal, when it is not the view's own (None: the view's ``live_proc``)."""
    if kind.process == "group" or getattr(trainer, kind.process, None) != "child_rank0":
        return None
    group = view.live_proc()
    if group is None:
        return None
    children = group.descendants()
    writer_pid = _rank0_writer_pid(run_dir, view) if run_dir is not None else None
    for child in children:
        if child.pid == writer_pid or _env(child.pid).get("RANK") == "0":
            return child
    raise FaultError(f"target: replica {view.replica} has no live rank-0 process yet")


def _rank0_writer_pid(run_dir, view) -> Optional[int]:
    """The PID in the first event of the group's current attempt's rank-0 file (TorchTitan's ``.rank``)."""
    path = Path(run_dir) / EVENTS_DIR / f"replica-{view.replica}.attempt-{view.attempt}.rank-0.jsonl"
    try:
        with open(path, "rb") as f:
            return int(json.loads(f.readline())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _env(pid: int) -> dict:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}
