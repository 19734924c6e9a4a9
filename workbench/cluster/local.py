"""The embedded default: jobs are processes on this machine, via submitit's LocalExecutor.

submitit starts, per job, a small controller process (``submitit.local._local``)
that runs the task (``submitit.core._submit``) as its child; the task process
is the trainer, and its identity (the ``start`` event's PID, start time and
host) is what faults signal. ``job.done()`` is the controller process having
exited.

Faults are signals to the replica group's current process (and, for a pause,
to every process it started: MaxText's interpreter, TorchTitan's ranks),
each only after its identity is proven (``workbench.procs``). A kind with a
``signal`` in the table is that signal; ``preempt`` is SIGTERM; a pausing kind
is SIGSTOP now and SIGCONT from the detached undo helper after ``seconds``.
``straggler`` and ``freeze`` are cgroups (``Cluster.inject_host``); the
network kinds need nodes in namespaces, which this backend has not.
"""

from __future__ import annotations

import signal

import submitit

from .. import undo
from ..faultkinds import FaultKind
from .base import Cluster, FaultError


class LocalCluster(Cluster):
    name = "local"
    loopback_only = True
    shares_this_machine = True

    def _make_executor(self) -> submitit.LocalExecutor:
        ex = submitit.LocalExecutor(folder=self.folder)
        # LocalExecutor's default timeout is 2 minutes; a run's lifetime is the controller's business.
        ex.update_parameters(timeout_min=7 * 24 * 60, tasks_per_node=1)
        return ex

    def inject(self, kind: FaultKind, view, seconds, origin: str, proc=None) -> dict:
        """``proc``: another process of the group than its recorded one (``workbench.fault_targets``)."""
        if kind.host is not None:
            return self.inject_host(kind, view, seconds)
        proc = proc or view.live_proc()
        if proc is None:
            raise FaultError(f"target: replica {view.replica} has no live process to {kind.name}")
        why = proc.why_not()
        if why is not None:
            raise FaultError(f"target: replica {view.replica}: {why}; not signalled")
        if kind.pauses_process:
            procs = [proc, *proc.descendants()]
            for p in procs:
                p.signal(signal.SIGSTOP)
            undo.later(self.run_dir, kind.name, seconds, signals=[[*p.as_record(), int(signal.SIGCONT)] for p in procs],
                       fields={"target": view.replica, "pid": proc.pid})
        else:
            sig = kind.signal if kind.signal is not None else self.preempt_signal
            if not proc.signal(sig):
                raise FaultError(f"target: replica {view.replica}'s process {proc.pid} exited before the {kind.name}")
        return {"target": view.replica, "pid": proc.pid, "attempt": view.attempt}
