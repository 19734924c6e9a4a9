"""``Run``: a notebook's handle on one run, built from its directory alone.

A Run reads the event log incrementally (new bytes only) and turns it into
pandas views. It holds no connection to the jobs, so a kernel that attaches
to a running or finished run (``workbench.attach(run_dir)``) sees exactly what
the kernel that submitted it saw. Control (kill, hang, stop) goes through
signals to PIDs recorded in the events: the fault menu and the run
controller.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import pandas as pd

from . import analysis, cluster, detached, faults, rundir, schedule
from .events import EventReader, EventWriter, to_frame
from .spec import Spec, SpecError, load_spec, preflight

TERMINAL = ("completed", "failed", "stopped")


class Run:
    def __init__(self, run_dir: Union[str, os.PathLike], _controller: Optional[subprocess.Popen] = None) -> None:
        self.run_dir = Path(run_dir).resolve()
        record = rundir.read_record(self.run_dir)
        self.record = record
        self.id: str = record["run_id"]
        self.spec: Spec = Spec.model_validate(record["spec"])
        self._reader = EventReader(self.run_dir)
        self._events: list[dict] = []
        self._controller = _controller

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.state()!r})"

    # -- reading -------------------------------------------------------------
    def refresh(self) -> list[dict]:
        """Read what was appended since the last call; returns the new events."""
        new = self._reader.poll()
        self._events.extend(new)
        if self._controller is not None:
            self._controller.poll()  # reap the controller once it exits
        return new

    def events(self, kind: Optional[str] = None) -> pd.DataFrame:
        self.refresh()
        evs = self._events if kind is None else [e for e in self._events if e["kind"] == kind]
        return to_frame(evs)

    def event_records(self) -> list[dict]:
        """The raw events, as written (dicts), in time order; what the analysis functions take."""
        self.refresh()
        return sorted(self._events, key=lambda e: e.get("t", 0.0))

    def metrics(self) -> pd.DataFrame:
        """One row per replica per step attempt: step, loss, committed, timings."""
        self.refresh()
        return analysis.metrics_frame(self._events)

    def state(self) -> str:
        self.refresh()
        return analysis.run_state(self._events)

    def status(self) -> dict:
        self.refresh()
        return analysis.status(self._events, self.spec)

    def summary(self) -> dict:
        """The headline figures of the run: steps, faults, stall, kill→rejoin."""
        self.refresh()
        return {**analysis.summary(self._events, self.spec), "run_dir": str(self.run_dir)}

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
            return analysis.max_committed_step(run._events, replica) >= step or run.state() in TERMINAL

        return self.wait_for(reached, timeout)

    def wait(self, timeout: Optional[float] = None) -> dict:
        """Block until the run ends; returns ``status()``."""
        self.wait_for(lambda r: r.state() in TERMINAL, timeout if timeout is not None else float("inf"))
        return self.status()

    # -- control -------------------------------------------------------------
    def kill(self, replica: Optional[int] = None, how: str = "sigkill", seconds: float = 5.0, origin: str = "api") -> dict:
        """Kill (``how="sigkill"``), hang (``"hang"``, for ``seconds``) or preempt a replica group."""
        action = {"sigkill": "kill", "kill": "kill", "hang": "hang", "preempt": "preempt"}.get(how)
        if action is None:
            raise faults.FaultError(f"how: {how!r}; allowed: sigkill, hang, preempt")
        if replica is None:
            from .trainers import ELASTIC

            replica = 0 if self.spec.replicas == 1 or self.spec.trainer not in ELASTIC else None
        if replica is not None and not 0 <= replica < self.spec.replicas:
            raise faults.FaultError(f"replica: {replica} out of range; allowed: 0..{self.spec.replicas - 1}")
        return faults.inject(self.run_dir, action, replica, origin=origin, seconds=seconds, events=self.event_records())

    def fault(self, action: str, target: Optional[int] = None, origin: str = "api", seconds: Optional[float] = None) -> dict:
        return faults.inject(self.run_dir, action, target, origin=origin, seconds=seconds, events=self.event_records())

    def stop(self, timeout: float = 30.0) -> dict:
        """Stop the run: the controller stops every job and the lighthouse.

        If the controller is gone, every process the run recorded is killed
        directly and the run is marked stopped.
        """
        self.refresh()
        if self.state() in TERMINAL:
            return self.status()
        pid = analysis.controller_pid(self._events)
        if pid and faults._alive(pid):
            os.kill(pid, signal.SIGTERM)
            try:
                self.wait_for(lambda r: r.state() in TERMINAL and not r.pids(), timeout)
                return self.status()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
        if self.spec.cluster == "slurm":
            from .cluster import slurm

            job_ids = sorted({str(e["job_id"]) for e in self._events if e["kind"] == "submit"})
            if job_ids:
                slurm.slurm_cmd(slurm._conf_of(self.run_dir), "scancel", *job_ids)
        for p in analysis.all_pids(self._events):
            if faults._alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        EventWriter(self.run_dir, f"control-{os.getpid()}", run=self.id).emit(
            "run_end", state="stopped", reason="controller unreachable; processes killed"
        )
        return self.status()

    def pids(self) -> list[int]:
        """Every process this run recorded (controller, lighthouse, jobs) that is still alive."""
        self.refresh()
        return [p for p in analysis.all_pids(self._events) if faults._alive(p)]

    def wait_exited(self, timeout: float = 30.0) -> "Run":
        """After the run ended: wait until every process it recorded has exited."""
        return self.wait_for(lambda r: not r.pids(), timeout)

    def dashboard(self, **kwargs: Any):
        from .widgets import Dashboard

        return Dashboard(self, **kwargs)


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
    proc = detached.spawn("workbench.controller", [str(run_dir)], run_dir / "controller.log")
    return Run(run_dir, _controller=proc)


def attach(run_dir: Union[str, os.PathLike]) -> Run:
    """A Run for an existing run directory (from a new kernel, say)."""
    if not rundir.is_run_dir(run_dir):
        raise SpecError(f"run_dir: {str(run_dir)!r} is not a run directory (no run.json)")
    return Run(run_dir)
