"""The cluster interface: everything the rest of the package asks of a backend.

A backend is modelled on submitit's executors, which it wraps: a job is a
submitit ``Job``. On top of submitting, a backend owns what only it knows:

- ``validate(spec)``: world-facing checks at submit (before anything starts);
- ``submit`` / ``is_done`` / ``cancel``: one job per replica group attempt;
- ``exit_status(job)``: how a job that is done ended (``workbench.cluster.exits``): the exit code or
  the signal, the OOM killer's evidence, the scheduler's final state; bounded in time, since the
  controller's loop waits for it;
- ``lighthouse_host``: where the lighthouse binds and the jobs dial;
- ``loopback_only``: whether every listener of a run must be on 127.0.0.1;
- ``shares_this_machine``: whether runs compete for this machine (a sweep
  then runs one at a time by default);
- ``inject(kind, view, ...)``: a fault of the table (``workbench.faults.kinds``)
  on a replica group, the way submitit's Slurm job owns its ``scancel
  --signal``; a timed fault's undo is a command (or signals) the backend hands
  to the detached helper (``workbench.faults.undo``);
- ``stop_all(state)``: end every process and job of a run whose controller
  is gone.

Every signal goes to a process the run recorded only once it proves it is
the run's (``marker``: the run directory's ``workbench.cluster.procs.Marker``);
one that does not is reported, never signalled.

The controller builds the executor lazily (``executor``): a ``Run`` in a
notebook uses a backend only for faults and stop, and must not, say, set
``SLURM_CONF`` in the kernel's environment.
"""

from __future__ import annotations

import abc
import signal
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional

import submitit

from workbench.cluster.exits import ExitStatus
from workbench.cluster.procs import Marker, Proc
from workbench.errors import FaultError
from workbench.faults import host as hostfaults
from workbench.faults import kinds as faultkinds
from workbench.faults import undo
from workbench.faults.kinds import FaultKind


class Cluster(abc.ABC):
    name: ClassVar[str] = "base"
    loopback_only: ClassVar[bool] = False
    shares_this_machine: ClassVar[bool] = False  # jobs compete with each other for this machine's cores
    job_gpus_key: ClassVar[Optional[str]] = None  # jobs run elsewhere, with the GPUs this spec key says; None: here
    preempt_signal: ClassVar[int] = signal.SIGTERM

    def __init__(self, spec, run_dir: Path) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / "jobs" / "%j"
        self._executor: Optional[submitit.Executor] = None
        self._marker: Optional[Marker] = None

    @property
    def marker(self) -> Optional[Marker]:
        """The run's process marker (``workbench.cluster.procs``); None for a run directory without one."""
        if self._marker is None:
            self._marker = Marker.of(self.run_dir)
        return self._marker

    # -- jobs ----------------------------------------------------------------
    @property
    def executor(self) -> submitit.Executor:
        if self._executor is None:
            self._executor = self._make_executor()
        return self._executor

    @abc.abstractmethod
    def _make_executor(self) -> submitit.Executor: ...

    def prepare(self) -> None:
        """In the controller, before the first submit: start what the jobs need (local: the fork server)."""

    def close(self) -> None:
        """In the controller, after the last job: end what ``prepare`` started."""

    @classmethod
    def validate(cls, spec) -> None:
        """World-facing checks at submit, before the detached controller starts.

        Raises ``SpecError`` naming the field; submits nothing. A backend may
        pin what it resolved (which cluster) into ``spec``, which is then recorded.
        """

    def submit(self, fn: Callable[..., Any], *args: Any, name: str, whole_nodes: bool = False) -> submitit.Job:
        """Start ``fn(*args)`` as one job; ``name`` labels it where the backend shows names. ``whole_nodes``:
        the job shares no node with another (a backend of nodes honours it; on one machine it means nothing)."""
        return self.executor.submit(fn, *args)

    def is_done(self, job: submitit.Job) -> bool:
        return job.done()

    def cancel(self, job: submitit.Job) -> None:
        job.cancel(check=False)

    def exit_status(self, job: submitit.Job) -> ExitStatus:
        """How ``job`` (done) ended, as far as the backend knows; an empty record where it knows nothing."""
        return ExitStatus()

    @classmethod
    def kill_wait_s(cls, spec) -> Optional[float]:
        """Seconds a job stopped by the scheduler (a cancel, a preemption, its time limit) has between the
        stop signal and SIGKILL (Slurm's ``KillWait``); None where no SIGKILL follows (``spec.timeouts``)."""
        return None

    @property
    def lighthouse_host(self) -> str:
        """The address the lighthouse binds to and the jobs dial."""
        return self.spec.lighthouse.bind_host

    # -- faults --------------------------------------------------------------
    @classmethod
    def fault_kinds(cls) -> list[str]:
        """The kinds of the table this backend injects (the CLI's and the dashboard's menu)."""
        return faultkinds.names(cls.name)

    def inject(self, kind: FaultKind, view, seconds: Optional[float], origin: str, proc: Optional[Proc] = None) -> dict:
        """Inject ``kind`` on replica group ``view`` (a ``ReplicaView``); returns the ``fault``
        event's fields. Raises FaultError, having done nothing, if it cannot. ``proc``: the process to
        hit when it is not the group's recorded one (``workbench.faults.targets``: a rank-0 child, which
        only kinds of the local backend name)."""
        raise FaultError(
            f"action: {kind.name} is not a fault on cluster {self.name}; allowed: {', '.join(self.fault_kinds())}"
        )

    def inject_host(self, kind: FaultKind, view, seconds: float, node: Optional[str] = None) -> dict:
        """A kind of the table done to the machine (``kind.host``: cgroup or link, ``workbench.faults.host``),
        undone by the detached helper after ``seconds``; the ``fault`` event's fields."""
        fields = {"target": view.replica, "attempt": view.attempt}
        try:
            if kind.host == "link":
                if not node:
                    raise FaultError(f"target: replica {view.replica} has not started on a node yet")
                made = hostfaults.cut_link(kind.name, node, owner=self.run_dir)
                fields["node"] = node
            else:
                proc = view.live_proc()
                why = "has no live process" if proc is None else proc.why_not_ours(self.marker)
                if why is not None:
                    raise FaultError(f"target: replica {view.replica}: {why}; {kind.name} needs its processes here")
                share = faultkinds.STRAGGLER_SHARE
                made = hostfaults.confine(
                    kind.name,
                    hostfaults.cgroup_name(self.run_dir.name, view.replica, kind.name),
                    [proc.pid, *(p.pid for p in proc.descendants() if p.why_not_ours(self.marker) is None)],
                    share=share,
                    owner=self.run_dir,
                )
                fields.update(pid=proc.pid, cgroup=made.cgroup, pids=sorted(made.origins))
                if kind.name == "straggler":
                    fields["share"] = share
        except hostfaults.HostFaultError as e:
            raise FaultError(str(e)) from None
        fields["undo_helper"] = undo.later(
            self.run_dir,
            kind.name,
            seconds,
            argv=made.undo_argv(),
            fields={k: v for k, v in fields.items() if k in ("target", "node", "pid", "cgroup")},
        )
        return fields

    def release_faults(self, state) -> list[str]:
        """Undo what this run's machine-level faults still hold (a stop mid-fault): its cgroups by name,
        and each link of a fault whose ``resume`` has not come. Returns what was undone."""
        open_faults = list(state.host_faults.items())
        links = [
            (k, e["node"])
            for (k, _), e in open_faults
            if getattr(faultkinds.kind(k), "host", None) == "link" and e.get("node")
        ]
        undone = hostfaults.release_run(self.run_dir.name, links)
        for helper in self.undo_helpers(state):  # their undo is done: the helpers waiting to do it have nothing left
            helper.signal(signal.SIGKILL, self.marker)
        return undone

    @staticmethod
    def undo_helpers(state) -> list[Proc]:
        """The detached undo helpers of the run's machine-level faults still held, as their events recorded them."""
        helpers = (e.get("undo_helper") for e in state.host_faults.values())
        return [Proc(*h) for h in helpers if isinstance(h, list) and len(h) == 3]

    def stop_all(self, state, remote_ended: bool = False) -> list[str]:
        """The controller is gone: SIGKILL every live process the run recorded that proves it is the
        run's. Returns a line per live process not signalled, and why; with ``remote_ended`` (the
        backend ended the jobs on other hosts its own way) none for a process on another host."""
        self.release_faults(state)
        skipped = []
        for proc in [*state.processes(), *self.undo_helpers(state)]:
            why = proc.why_not_ours(self.marker)
            if why is None:
                proc.signal(signal.SIGKILL, self.marker)
            elif "exited" not in why and not (remote_ended and not proc.local):
                skipped.append(f"{why}; not signalled")
        return skipped
