"""submitit's ``LocalExecutor`` whose per-job controller also writes down how each task ended.

With ``WORKBENCH_FORK_SERVER=0`` a job is submitit's: a small controller process
(``python -m submitit.local._local``) runs the task (the trainer) as its child, waits for it, and exits 0
whatever the task did; the ``LocalJob``'s ``Popen`` is that controller, so its ``returncode`` is the
controller's, not the trainer's (a signal or an exit code of the task is lost). This executor starts
``python -m workbench.cluster.local.submitit_local`` instead: submitit's own ``Controller``, which,
once its tasks ended, writes each one's ``returncode`` (negative: the signal) to the status file of
:mod:`workbench.cluster.exits`, before it exits, so the file is there when the job is seen done. The
environment, the folder layout and the task's command are submitit's (``start_controller``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import submitit
from submitit.core import utils
from submitit.local import local as submitit_local
from submitit.local.local import LocalJob

from workbench.cluster import exits
from workbench.cluster.procs import start_time


class StatusController(submitit_local.Controller):
    """submitit's local job controller; its tasks' ends go to their status files."""

    def start_tasks(self) -> None:
        super().start_tasks()
        self.starts = [start_time(t.pid) for t in self.tasks]

    def wait(self, freq: int = 24) -> Sequence[Optional[int]]:
        codes = super().wait(freq)
        folder = utils.JobPaths(self.folder, self.pid).folder
        for k, (task, code) in enumerate(zip(self.tasks, codes)):
            if code is not None:
                exits.write_status(exits.status_path(folder, self.pid, k), task.pid, self.starts[k], code)
        return codes


class StatusLocalExecutor(submitit.LocalExecutor):
    """``LocalExecutor`` with :class:`StatusController` as each job's controller."""

    def _submit_command(self, command: str) -> LocalJob:
        ntasks = self.parameters.get("tasks_per_node", 1)
        timeout_min, delay_s = self.parameters.get("timeout_min", 2.0), self.parameters.get("signal_delay_s", 30)
        env = local_job_env(ntasks, timeout_min, delay_s, command=command)
        process = subprocess.Popen([sys.executable, "-m", __name__, str(self.folder)], env=env)
        return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))


def local_job_env(ntasks: int, timeout_min: float, signal_delay_s: float, command: Optional[str] = None) -> dict:
    """This process's environment plus what submitit's local job runner reads, as submitit's
    ``start_controller`` sets it (``SUBMITIT_LOCAL_COMMAND`` only for a controller that starts the task)."""
    env = dict(os.environ)
    env.update(
        SUBMITIT_LOCAL_NTASKS=str(ntasks),
        SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)),
        SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(signal_delay_s)),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_STDERR_TO_STDOUT="",
        SUBMITIT_EXECUTOR="local",
        CUDA_VISIBLE_DEVICES="",
        SUBMITIT_LOCAL_WITH_SHELL="",
    )
    if command is not None:
        env["SUBMITIT_LOCAL_COMMAND"] = command
    return env


def exit_status(job: LocalJob) -> exits.ExitStatus:
    """Task 0's status file; else the controller's own ``returncode`` when it did not exit 0 (it was killed
    itself, or failed before its task ran); else an empty record."""
    status = exits.from_status_file(exits.status_path(job.paths.folder, str(job.job_id)))
    if status.exit_code is None and status.signal is None:
        proc = job._process
        code = proc.poll() if proc is not None else None
        if proc is not None and code:
            status = exits.from_returncode(code, pid=proc.pid)
    return status


if __name__ == "__main__":
    StatusController(Path(sys.argv[1])).run()
