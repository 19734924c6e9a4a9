"""``Run``: a notebook's handle on one run, built from its directory alone.

A Run holds one :class:`~workbench.events.reader.EventReader` (new bytes only) and
one :class:`~workbench.state.fold.RunState` fold of what it read; ``state()``,
``status()``, faults and ``stop()`` answer from the fold, and the pandas
views from the events it holds. It holds no connection to the jobs, so a
kernel that attaches to a running or finished run (``workbench.attach``) sees
exactly what the kernel that submitted it saw. A dashboard subscribes to the
Run (``run.run_state.subscribe``) instead of reading the log a second time.
Control goes through the run's backend (``Cluster.inject``), each signal
only to a process whose recorded identity still matches and that proves it is
the run's (its owner, and the run's marker in its environment:
``workbench.cluster.procs``); one that does not is reported, never signalled.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import pandas as pd

from workbench import analysis, cluster
from workbench.analysis import straggler
from workbench.cluster.procs import Marker
from workbench.errors import ControllerGone, SpecError
from workbench.events.reader import EventReader, to_frame
from workbench.faults import inject as faults
from workbench.faults import kinds as faultkinds
from workbench.run import detached, rundir, stacks, unwritten_end
from workbench.spec import schedule
from workbench.spec.load import load_spec
from workbench.spec.models import Spec
from workbench.spec.preflight import preflight
from workbench.state import causes
from workbench.state.fold import RunState
from workbench.state.run_status import TERMINAL
from workbench.trainers import trainer_kind

KILL_ALIASES = {"sigkill": "kill"}
ENDED = (*TERMINAL, "lost")


class Run:
    def __init__(self, run_dir: Union[str, os.PathLike], _controller: Optional[subprocess.Popen] = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        record = rundir.read_record(self.run_dir)
        self.record = record
        self.id: str = record["run_id"]
        self.spec: Spec = Spec.model_validate(record["spec"])
        self._reader = EventReader(self.run_dir)
        self._events: list[dict] = []
        self._steps: Optional[analysis.StepColumns] = None
        self._lock = threading.RLock()
        self.run_state = RunState(self.spec.replicas, self.spec.steps)
        self.run_state.ends.one_job = not trainer_kind(self.spec.trainer).elastic  # its ranks end together
        self._controller = _controller
        self._cluster: Optional[cluster.Cluster] = None

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.state()!r})"

    @property
    def cluster(self) -> cluster.Cluster:
        """The run's backend (for faults and stop; the controller submits the jobs)."""
        if self._cluster is None:
            self._cluster = cluster.make_cluster(self.spec, self.run_dir)
        return self._cluster

    # -- reading -------------------------------------------------------------
    def refresh(self) -> list[dict]:
        """Read what was appended since the last call, fold it in; returns the new events."""
        with self._lock:
            new = self._reader.poll()
            self._events.extend(new)
            self.run_state.apply(new)
        if self._controller is not None:
            self._controller.poll()  # reap the controller once it exits
        return new

    @property
    def bad_lines(self) -> int:
        """Lines of the event log that were not well-formed events (skipped, counted)."""
        return self._reader.skipped_lines + self.run_state.bad_events

    @property
    def events_read(self) -> Sequence[dict]:
        """The events this handle has read so far, as written, in the order read; no refresh.

        A view for analyses that take event dicts (``analysis.*``), the dashboard and the report:
        the handle's own list, not a copy (100k events), so treat it as read-only.
        """
        return self._events

    def events(self, kind: Optional[str] = None) -> pd.DataFrame:
        self.refresh()
        evs = self._events if kind is None else [e for e in self._events if e["kind"] == kind]
        return to_frame(evs)

    def event_records(self) -> list[dict]:
        """The raw events, as written (dicts), in time order; what the analysis functions take."""
        self.refresh()
        return sorted(self._events, key=lambda e: e.get("t", 0.0))

    def metrics(self) -> pd.DataFrame:
        """One row per replica per step attempt: step, loss, committed, timings.

        Read through its own columnar reader (``analysis.StepColumns``: each file's new bytes straight
        into columns), not from the fold's dicts, starting from the controller's step index where there is
        one (``analysis.step_index``: only the bytes after it are parsed); the fold is refreshed too only when something
        (a dashboard) is subscribed to it, so that a cell calling ``metrics()`` still moves the dashboard.
        """
        if self.run_state._subscribers:
            self.refresh()
        with self._lock:
            if self._steps is None:
                self._steps = analysis.StepColumns(self.run_dir)
            return self._steps.frame()

    def state(self) -> str:
        """pending | starting | running | completed | failed | stopped, or ``lost``: the
        controller is gone without having ended the run (``stop()`` cleans up after it)."""
        self.refresh()
        state = self.run_state.state
        if state not in TERMINAL and self.controller_gone():
            return "lost"
        return state

    def controller_gone(self) -> Optional[str]:
        """Why the run's controller is not running (None while it runs, or cannot be checked here)."""
        if self._controller is not None:
            code = self._controller.poll()
            if code is None:
                return None
            if self.run_state.controller is None:
                return f"controller exited with {code} before it started the run"
        proc = self.run_state.controller
        if proc is None or not proc.local:
            return None
        why = proc.why_not()
        if why is None:
            return None
        trace = unwritten_end.read(self.run_dir)  # the run_end it could not write, if it left one
        return f"controller {why}" + (f"; {trace}" if trace else "")

    def status(self) -> dict:
        self.refresh()
        st = self.run_state
        return {
            "state": st.state,
            "reason": st.end_reason,  # run_end's, None before it
            "state_lost": st.state_lost,  # every group died with no peer holding the model state (total_loss)
            "trainer": self.spec.trainer,
            "cluster": self.spec.cluster,
            "steps_target": self.spec.steps,
            "step": st.max_committed,
            **st.counts(),
            "bad_lines": self.bad_lines,
            "write_gaps": st.write_gaps,  # a writer that could not append for a while (events/writer.py)
            "events_lost": st.events_lost,
            "controller": self.controller_gone() or "running",
            "replicas": {str(r): v.as_dict() for r, v in sorted(st.replicas.items())},
            "ends": [c.as_dict() for c in st.ends],  # why each ended attempt ended (state/causes.py)
            "checkpoints": None if trainer_kind(self.spec.trainer).elastic else st.checkpoint_status(),
            "nodes": {
                row["node"]: {k: v for k, v in row.items() if k != "node"} for row in st.nodes.table(st.attempts())
            },
            "stragglers": straggler.summary(st),  # which group is slow, by score (analysis/straggler.py)
        }

    def ends(self) -> pd.DataFrame:
        """One row per ended attempt, in the order they ended: why (``cause``, ``summary``), whether it was
        ``planned`` or ``injected``, and what the trainer, the backend and Slurm said (``workbench.state.causes``)."""
        self.refresh()
        return pd.DataFrame([c.row() for c in self.run_state.ends], columns=list(causes.ROW))

    def nodes(self) -> pd.DataFrame:
        """Every ``node_health`` sample (the controller's, ``workbench.controller.nodehealth``): one row per node per sample."""
        self.refresh()
        rows = [
            {k: v for k, v in e.items() if k not in ("kind", "run", "source", "pid")}
            for e in self._events
            if e.get("kind") == "node_health"
        ]
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        """The headline figures of the run: steps, faults, stall, kill→rejoin."""
        self.refresh()
        return {**analysis.summary(self._events, self.spec), "run_dir": str(self.run_dir)}

    def project(self, **kwargs) -> dict:
        """This run's job projected to another scale (``workbench.projection.calibrate.project``):
        ``run.project(gpus=4096, groups=8, device_mtbf_h=5e4)``."""
        from workbench.projection.calibrate import project

        self.refresh()
        return project(self, **kwargs)

    # -- waiting -------------------------------------------------------------
    def wait_for(self, predicate: Callable[["Run"], bool], timeout: float = 300.0, poll: float = 0.2) -> "Run":
        """Poll the event log until ``predicate(run)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if predicate(self):
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id}: condition not met within {timeout}s (state {self.state()})")
            time.sleep(poll)

    def wait_for_step(self, step: int, replica: Optional[int] = None, timeout: float = 300.0) -> "Run":
        def reached(run: "Run") -> bool:
            return analysis.max_committed_step(run.events_read, replica) >= step or run.state() in ENDED

        return self.wait_for(reached, timeout)

    def wait(self, timeout: Optional[float] = None) -> dict:
        """Block until the run ends; returns ``status()``. Raises ControllerGone, naming why, if
        the controller died without ending it (its jobs may still run: ``stop()`` ends them)."""
        self.wait_for(lambda r: r.state() in ENDED, timeout if timeout is not None else float("inf"))
        if self.state() == "lost":
            raise ControllerGone(
                f"run {self.id}: {self.controller_gone()} without ending the run; "
                f"`workbench stop {self.run_dir}` stops what is left"
            )
        return self.status()

    # -- control -------------------------------------------------------------
    def fault_kinds(self) -> list[str]:
        """The fault kinds this run's backend injects."""
        return faults.actions_for(self)

    def kill(
        self, replica: Optional[int] = None, how: str = "kill", seconds: Optional[float] = None, origin: str = "api"
    ) -> dict:
        """Inject fault kind ``how`` (any of :meth:`fault_kinds`; ``"sigkill"`` is ``"kill"``) into a
        replica group; ``seconds`` for kinds that last (a hang)."""
        action = KILL_ALIASES.get(how, how)
        kind = faultkinds.kind(action)
        if kind is None or not kind.supported_on(self.spec.cluster):
            if kind is not None and kind.needs:
                raise faults.FaultError(f"how: {how!r} needs {kind.needs}; cluster {self.spec.cluster} has none")
            raise faults.FaultError(f"how: {how!r}; allowed: {', '.join(self.fault_kinds())}")
        if replica is None and kind.targets == "replica":
            replica = 0 if self.run_state.groups == 1 or not trainer_kind(self.spec.trainer).elastic else None
        return self.fault(action, replica, origin=origin, seconds=seconds)

    def fault(
        self, action: str, target: Optional[int] = None, origin: str = "api", seconds: Optional[float] = None
    ) -> dict:
        self.refresh()
        return faults.inject(self, action, target, origin=origin, seconds=seconds)

    def stacks(self, replica: Union[int, str, None] = None, origin: str = "api") -> list[dict]:
        """Sample the stacks of every process of group ``replica`` (None: of every group; ``"controller"``:
        the controller) with py-spy (``workbench.run.stacks``); the ``stacks`` events written, one a group,
        each naming its file under ``<run_dir>/stacks/`` and where each process is."""
        self.refresh()
        return stacks.take(self, replica, origin=origin)

    def stop(self, timeout: float = 30.0) -> dict:
        """Stop the run: the controller stops every job and the lighthouse.

        If the controller is gone (or does not prove it is the run's), the backend ends every process
        and job the run recorded (``Cluster.stop_all``) and the run is marked stopped, unless the run
        directory has no process marker (an older workbench made it): then nothing is signalled.
        Returns ``status()`` with ``not_stopped``: a line for each live process of the run's record it did
        not signal, and why (``workbench stop`` exits non-zero naming them); empty for a run that had ended.
        """
        self.refresh()
        if self.run_state.state in TERMINAL:
            return {**self.status(), "not_stopped": []}
        marker = self.cluster.marker
        ctl = self.run_state.controller
        if ctl is not None and ctl.why_not_ours(marker) is None:
            if detached.stop(ctl, marker, lambda: self.state() in TERMINAL and not self._stoppable(), timeout):
                return {**self.status(), "not_stopped": self._not_stopped()}
        if marker is None:
            return {**self.status(), "not_stopped": self._not_stopped()}
        skipped = self.cluster.stop_all(self.run_state)
        faults.control_writer(self.run_dir, self.id).emit(
            "run_end", state="stopped", reason="controller unreachable; processes killed", not_signalled=skipped or None
        )
        return {**self.status(), "not_stopped": skipped}

    def _stoppable(self) -> list:
        """The live processes of the run's record that prove they are the run's (what a stop waits for)."""
        self.refresh()
        return [p for p in self.run_state.live_processes() if p.why_not_ours(self.cluster.marker) is None]

    def _not_stopped(self) -> list[str]:
        """A line for each live process of the run's record that does not prove it is the run's."""
        lines = (p.why_not_ours(self.cluster.marker) for p in self.run_state.live_processes())
        return [f"{why}; not signalled" for why in lines if why is not None and "exited" not in why]

    def pids(self) -> list[int]:
        """Every process this run recorded (controller, lighthouse, jobs) that is still alive."""
        self.refresh()
        return [p.pid for p in self.run_state.live_processes()]

    def wait_exited(self, timeout: float = 30.0) -> "Run":
        """After the run ended: wait until every process it recorded has exited."""
        return self.wait_for(lambda r: not r.pids(), timeout)


def submit(
    spec: Union[str, os.PathLike, Mapping[str, Any], Spec, None] = "demo",
    overrides: Union[Sequence[str], Mapping[str, Any], None] = None,
    **kwargs: Any,
) -> Run:
    """Validate, create the run directory, start the run controller; returns at once.

    Nothing is created or started unless the spec is valid and passes
    preflight.
    """
    spec = load_spec(spec, overrides, **kwargs)
    for message in preflight(spec):
        warnings.warn(message, stacklevel=2)
    cluster.validate(spec)
    chaos = spec.chaos.model_dump(mode="json") if spec.chaos else None
    spec = schedule.materialize(spec)
    run_id = rundir.new_run_id(spec.name)
    run_dir = rundir.create(spec.run_root, run_id, spec.to_dict(), extra={"chaos": chaos})
    proc = detached.spawn(
        "workbench.controller.loop", [str(run_dir)], run_dir / "controller.log", Marker.ensure(run_dir)
    )
    return Run(run_dir, _controller=proc)


def attach(run_dir: Union[str, os.PathLike]) -> Run:
    """A Run for an existing run directory (from a new kernel, say)."""
    if not rundir.is_run_dir(run_dir):
        raise SpecError(f"run_dir: {str(run_dir)!r} is not a run directory (no run.json)")
    return Run(run_dir)


def as_run(run: Union[Run, str, os.PathLike]) -> Run:
    """``run`` itself, or a Run attached to the run directory it names."""
    return run if isinstance(run, Run) else attach(run)
