"""A TorchTitan hot spare: a replica group's job started ahead of a fault, waiting to be given a group.

The controller submits ``spec.spares`` spare jobs and hands a killed group to a
ready one (:mod:`workbench.controller.spares`). What a relaunch pays before its
ranks fork — the submit, the fork server's fork, the job's start and the offline
assets — a spare has paid before the kill; and it is warm (torchtitan imported:
``rank.warm_up``), so it forks its ranks warm (``job.warm_ranks``) after the
kill instead of exec'ing them: on the local backend the fork server forked it
warm, on Slurm (a fresh interpreter, whose ranks a relaunch execs) it imports
torchtitan itself while it waits (:func:`warm_while_waiting`). It then waits
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

import os
import sys
import time
from typing import Callable, Optional

from workbench.events.writer import EventWriter
from workbench.trainers import forked
from workbench.trainers.base import JobContext
from workbench.trainers.titan.assets import ensure_assets
from workbench.trainers.titan.rank import warm_up


def job_writer(ctx: JobContext, task: int) -> EventWriter:
    """The job's own writer: the group's (or the spare's) file for task 0, a file per task on other nodes."""
    return ctx.writer(f".task-{task}" if task else "")


def wait_as_spare(
    ctx: JobContext, writer: EventWriter, task: int, stopped: Callable[[], bool], start: dict, t0: float
) -> Optional[EventWriter]:
    """Wait, ready, until the controller assigns this spare a group: its writer then, or None if stopped first."""
    spare_id = ctx.spare_id
    ensure_assets()
    warm = warm_while_waiting()
    writer.emit("phase", phase="spare_ready", seconds=time.time() - t0, warm=warm, task=task)
    if not ctx.wait_for_assignment(stop=stopped):
        writer.emit("exit", reason="stopped", step=0)
        return None
    writer.close()
    writer = job_writer(ctx, task)
    writer.emit("start", **{**start, "role": "replica" if task == 0 else "task"}, from_spare=spare_id)
    return writer


def warm_while_waiting() -> bool:
    """Import what a rank imports (``rank.warm_up``) in this spare's job, unless the fork server did it or
    ``WORKBENCH_TITAN_WARM_RANKS`` is ``0``; whether the job is warm now (``torchtitan.train`` imported).

    What it saves is the exec'd rank's imports after the kill: 9-10 s of the 17.6 s from a kill to
    participating of a 2 nodes x 1 rank group on the dev cluster (``docs/benchmarks.md``). Whether the
    ranks are then forked is ``job.warm_ranks``'s to decide at the assignment (fork-safe, no accelerator)."""
    if os.environ.get("WORKBENCH_TITAN_WARM_RANKS", "1") != "0" and "torchtitan.train" not in sys.modules:
        with forked.quiet_imports():
            warm_up()
    return "torchtitan.train" in sys.modules
