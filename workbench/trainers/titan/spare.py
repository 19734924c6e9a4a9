"""A TorchTitan hot spare: a replica group's job started ahead of a fault, waiting to be given a group.

The controller submits ``spec.spares`` spare jobs and hands a killed group to a
ready one (:mod:`workbench.controller.spares`). What a relaunch pays before its
ranks fork — the submit, the fork server's fork, the job's start and the offline
assets — a spare has paid before the kill; on the local backend it was forked
warm too (torchtitan imported: ``rank.warm_up``). It then waits
(:meth:`JobContext.wait_for_assignment`) and becomes the group's next attempt:
a writer under the group's name, a ``start`` with ``from_spare``, and from there
the job goes on as any attempt does.

Its ranks are not started before the assignment, for two reasons: the group's
replica id is one of their flags (``fault_tolerance.replica_id``), and an idle
torchft Manager heartbeats, so the lighthouse would hold every quorum for up to
``join_timeout_ms`` waiting for a group that does not train (torchft-lite's
spare stops short of its Manager for the same reason).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from workbench.events.writer import EventWriter
from workbench.trainers.base import JobContext
from workbench.trainers.titan.assets import ensure_assets


def job_writer(ctx: JobContext, task: int) -> EventWriter:
    """The job's own writer: the group's (or the spare's) file for task 0, a file per task on other nodes."""
    if task == 0:
        return ctx.writer()
    return EventWriter(
        ctx.run_dir, f"{ctx.writer_name}.task-{task}", run=ctx.run_id, replica=ctx.replica, attempt=ctx.attempt
    )


def wait_as_spare(
    ctx: JobContext, writer: EventWriter, task: int, stopped: Callable[[], bool], start: dict, t0: float
) -> Optional[EventWriter]:
    """Wait, ready, until the controller assigns this spare a group: its writer then, or None if stopped first."""
    spare_id = ctx.spare_id
    ensure_assets()
    writer.emit("phase", phase="spare_ready", seconds=time.time() - t0)
    if not ctx.wait_for_assignment(stop=stopped):
        writer.emit("exit", reason="stopped", step=0)
        return None
    writer.close()
    writer = job_writer(ctx, task)
    writer.emit("start", **{**start, "role": "replica" if task == 0 else "task"}, from_spare=spare_id)
    return writer
