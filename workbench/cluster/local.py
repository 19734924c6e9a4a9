"""The embedded default: jobs are processes on this machine, via submitit's LocalExecutor.

submitit starts, per job, a small controller process (``submitit.local._local``)
that runs the task (``submitit.core._submit``) as its child; the task process
is the trainer, and its PID (reported in the trainer's ``start`` event) is what
faults signal. ``job.done()`` is the controller process having exited.
"""

from __future__ import annotations

import submitit

from .base import Cluster


class LocalCluster(Cluster):
    name = "local"

    def _make_executor(self) -> submitit.LocalExecutor:
        ex = submitit.LocalExecutor(folder=self.folder)
        # LocalExecutor's default timeout is 2 minutes; a run's lifetime is the controller's business.
        ex.update_parameters(timeout_min=7 * 24 * 60, tasks_per_node=1)
        return ex
