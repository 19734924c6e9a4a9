"""A MaxText hot spare: a whole job submitted ahead of a fault, its processes' imports done, waiting for the run.

MaxText is checkpoint-restart: a fault ends the job, the controller relaunches it, and the new job
restores the last durable checkpoint. On Slurm a relaunch pays the submit and the job's start, then
every process imports jax and MaxText afresh: of the 14.2 s from ``node_down`` to the first step of a
two-process job on the dev cluster, 0.7 s were sbatch -> start and 5.6 s the two imports
(``docs/benchmarks.md``). The standby that spares a local restart its imports cannot help there: a
job's processes end with the job (:mod:`.standby`).

A spare job pays both before the fault. Each of its tasks (one per node) starts a standby inside the
job, kept by the task's wrapper; task 0 says ``phase phase=spare_ready`` once every task's standby has
imported (``warm``), or after ``READY_TIMEOUT_S`` without (``warm=false``: still a submit saved). The
controller gives it the run when the job ends, as it gives an elastic group's spare its group
(:mod:`workbench.controller.spares`). Each task then claims its own standby: MaxText forks from it and
restores the last checkpoint, as in a relaunched job, with its imports done. A spare holds its nodes
while it waits: a two-node job with one spare takes four.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from workbench.trainers.base import JobContext
from workbench.trainers.kit import on_stop_signals
from workbench.trainers.maxtext import standby
from workbench.trainers.maxtext.command import JobLayout, build_command
from workbench.trainers.placement import placement

READY_TIMEOUT_S = 120.0  # two cold imports at once on this machine's two cores take about 6 s
POLL_S = 0.05


def socket_path(run_dir: str | os.PathLike, spare_id: int, rank: int) -> Path:
    """A spare's standby on rank ``rank``, its ``.pid``, ``.log`` and ``.ready`` beside it (rank 0 reads every
    rank's ``.ready``: the run directory is on the filesystem the nodes share)."""
    return Path(run_dir).resolve() / "maxtext" / f"spare-{spare_id}-rank-{rank}.sock"


def wait_as_spare(ctx: JobContext, layout: JobLayout, writer) -> Optional[Path]:
    """Start this task's standby, wait until the controller gives this spare the run, and return the standby's
    socket for the attempt to claim; None if the job was stopped first (``writer``: the spare's, rank 0's)."""
    t0 = time.time()
    spare_id = ctx.spare_id
    assert spare_id is not None
    writer.emit(
        "start", trainer="maxtext", world_size=layout.processes, role="spare", nodes=list(layout.nodes), **placement()
    )
    stop: list[int] = []
    restore = on_stop_signals(stop.append)
    try:
        argv, env = build_command(ctx, layout)
        path = socket_path(ctx.run_dir, spare_id, layout.rank)
        started = None
        if os.environ.get("WORKBENCH_MAXTEXT_STANDBY") != "0":
            started = standby.start(argv[0], argv[1], path, env, os.getpid())
        if layout.rank == 0:
            every = [standby.ready_path(socket_path(ctx.run_dir, spare_id, r)) for r in range(layout.processes)]
            deadline = time.time() + (READY_TIMEOUT_S if started else 0.0)
            while not stop and time.time() < deadline and not all(p.exists() for p in every):
                time.sleep(POLL_S)
            writer.emit("phase", phase="spare_ready", seconds=time.time() - t0, warm=all(p.exists() for p in every))
        if not ctx.wait_for_assignment(stop=lambda: bool(stop)):
            writer.emit("exit", reason="stopped", step=0)
            return None
    finally:
        restore()
    return path
