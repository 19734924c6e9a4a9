"""The embedded default: jobs are processes on this machine, forked from the run's fork server.

By default (``WORKBENCH_FORK_SERVER`` unset or ``1``) each job is a child forked from
one process that has imported torch, torchft and the trainer
(:mod:`workbench.cluster.local.forkserver`; its submitit executor is
:mod:`workbench.cluster.local.forkexecutor`): the same job
folder, pickles and ``local`` job environment, without a new interpreter's imports.
``WORKBENCH_FORK_SERVER=0`` uses submitit's ``LocalExecutor`` as before (with its per-job
controller's tasks' ends written down: :mod:`workbench.cluster.local.submitit_local`):

submitit starts, per job, a small controller process (submitit's ``Controller``, here as
``python -m workbench.cluster.local.submitit_local`` instead of ``submitit.local._local``)
that runs the task (``submitit.core._submit``) as its child; the task process
is the trainer, and its identity (the ``start`` event's PID, start time and
host) is what faults signal. ``job.done()`` is the controller process having
exited.

Faults are signals to the replica group's current process (and, for a pause,
to every process it started: MaxText's interpreter, TorchTitan's ranks),
each only after it proves it is the run's (its identity, its owner and the run's marker in its
environment, ``workbench.cluster.procs``); a process that does not is reported, never signalled. A kind with a
``signal`` in the table is that signal; ``preempt`` is SIGTERM; a pausing kind
is SIGSTOP now and SIGCONT from the detached undo helper after ``seconds``.
``straggler`` and ``freeze`` are cgroups (``Cluster.inject_host``); the
network kinds need nodes in namespaces, which this backend has not.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

import submitit

from workbench.cluster import exits
from workbench.cluster.base import Cluster
from workbench.cluster.local import submitit_local
from workbench.cluster.local.forkexecutor import ForkExecutor, ForkJob, ForkServer
from workbench.errors import FaultError
from workbench.faults import undo
from workbench.faults.kinds import FaultKind


class LocalCluster(Cluster):
    name = "local"
    loopback_only = True
    shares_this_machine = True

    def __init__(self, spec, run_dir) -> None:
        super().__init__(spec, run_dir)
        self.fork_server: Optional[ForkServer] = None

    @staticmethod
    def forks() -> bool:
        """Whether jobs are forked from a fork server (``WORKBENCH_FORK_SERVER``, default on)."""
        return os.environ.get("WORKBENCH_FORK_SERVER", "1") != "0"

    def prepare(self) -> None:
        """Start the fork server's imports now, beside the lighthouse's start (the controller calls this)."""
        if self.forks():
            self._started_fork_server()

    def _started_fork_server(self) -> ForkServer:
        if self.fork_server is None:
            self.fork_server = ForkServer(
                self.spec.trainer, self.spec.model.model_dump(mode="json"), log=self.run_dir / "forkserver.log"
            )
            self.fork_server.start()
        return self.fork_server

    def close(self) -> None:
        if self.fork_server is not None:
            self.fork_server.close()

    def _make_executor(self) -> submitit.Executor:
        if self.forks():
            return ForkExecutor(self.folder, self._started_fork_server(), marker=self.marker)
        ex = submitit_local.StatusLocalExecutor(folder=self.folder)
        # LocalExecutor's default timeout is 2 minutes; a run's lifetime is the controller's business.
        ex.update_parameters(timeout_min=7 * 24 * 60, tasks_per_node=1)
        return ex

    def exit_status(self, job: submitit.Job) -> exits.ExitStatus:
        """The job's process's wait status as the process that reaped it wrote it (the fork server, or
        submitit's local controller), with the OOM killer's evidence for a SIGKILL."""
        if isinstance(job, ForkJob):
            return job.exit_status()
        if isinstance(job, submitit.LocalJob):
            return submitit_local.exit_status(job)
        return exits.ExitStatus()

    def inject(self, kind: FaultKind, view, seconds, origin: str, proc=None) -> dict:
        """``proc``: another process of the group than its recorded one (``workbench.faults.targets``)."""
        if kind.host is not None:
            return self.inject_host(kind, view, seconds)
        proc = proc or view.live_proc()
        if proc is None:
            raise FaultError(f"target: replica {view.replica} has no live process to {kind.name}")
        why = proc.why_not_ours(self.marker)
        if why is not None:
            raise FaultError(f"target: replica {view.replica}: {why}; not signalled")
        if kind.pauses_process:
            procs = [p for p in [proc, *proc.descendants()] if p.signal(signal.SIGSTOP, self.marker)]
            undo.later(
                self.run_dir,
                kind.name,
                seconds,
                signals=[[*p.as_record(), int(signal.SIGCONT)] for p in procs],
                fields={"target": view.replica, "pid": proc.pid},
            )
        else:
            sig = kind.signal if kind.signal is not None else self.preempt_signal
            if not proc.signal(sig, self.marker):
                raise FaultError(f"target: replica {view.replica}'s process {proc.pid} exited before the {kind.name}")
        return {"target": view.replica, "pid": proc.pid, "attempt": view.attempt}
