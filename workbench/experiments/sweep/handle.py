"""``Sweep``: a notebook's handle on one sweep, built from its directory alone.

Like a Run, a Sweep reads its event log incrementally and holds no
connection to the processes: ``attach_sweep(sweep_dir)`` from any kernel sees
what the kernel that started it saw. The point -> run index is the sweep
controller's ``submit`` events; each point's figures come from its own run.
Control is the controller's: :meth:`Sweep.stop` asks it (SIGTERM, once it
proves it is the sweep's: its owner and the sweep directory's marker in its
environment, ``workbench.cluster.procs``) and only stops the runs itself when it
is gone.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Optional, Union

import pandas as pd

from workbench import analysis
from workbench.cluster.procs import HOST, Marker, Proc, start_time
from workbench.errors import SpecError
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.experiments.sweep import runner as controller
from workbench.experiments.sweep.points import point_spec
from workbench.experiments.sweep.sweepdir import SWEEP_JSON, is_sweep_dir, read_record
from workbench.run import detached, rundir
from workbench.run.handle import ENDED, Run
from workbench.spec.models import Spec

SWEEP_TERMINAL = ("completed", "stopped", "failed")


class Sweep:
    """A notebook's handle on one sweep, built from its directory alone (``attach_sweep``)."""

    def __init__(self, sweep_dir: Union[str, os.PathLike], _controller: Optional[subprocess.Popen] = None) -> None:
        self.sweep_dir = Path(sweep_dir).resolve()
        self.record = read_record(self.sweep_dir)
        self.id: str = self.record["sweep_id"]
        self.base = Spec.model_validate(self.record["base"])
        self.points: list[dict] = self.record["points"]
        self.max_parallel: int = self.record["max_parallel"]
        self._reader = EventReader(self.sweep_dir)
        self._events: list[dict] = []
        self._runs: dict[int, Run] = {}
        self._controller = _controller

    def __repr__(self) -> str:
        return f"Sweep({self.id!r}, {len(self.points)} points, state={self.state()!r})"

    def __len__(self) -> int:
        return len(self.points)

    @property
    def params(self) -> list[str]:
        """The swept keys, in first-seen order."""
        keys: list[str] = []
        for p in self.points:
            keys.extend(k for k in p if k not in keys)
        return keys

    def refresh(self) -> list[dict]:
        new = self._reader.poll()
        self._events.extend(new)
        for e in new:
            if e.get("kind") == "submit" and e.get("point") not in self._runs and rundir.is_run_dir(e["run_dir"]):
                self._runs[e["point"]] = Run(e["run_dir"])
        if self._controller is not None:
            self._controller.poll()
        return new

    def events(self) -> pd.DataFrame:
        from workbench.events.reader import to_frame

        self.refresh()
        return to_frame(self._events)

    def runs(self) -> dict[int, Run]:
        """The submitted points' runs, by point index."""
        self.refresh()
        return dict(sorted(self._runs.items()))

    def index(self) -> pd.DataFrame:
        """Point -> run directory, from the controller's ``submit`` events."""
        self.refresh()
        rows = [
            {"point": e["point"], "run_id": e.get("run_id"), "run_dir": e["run_dir"], "submitted": e["t"]}
            for e in self._events
            if e.get("kind") == "submit"
        ]
        return pd.DataFrame(rows, columns=["point", "run_id", "run_dir", "submitted"])

    def controller(self) -> Optional[Proc]:
        """The newest sweep controller's process (a resumed sweep has had more than one)."""
        self.refresh()
        starts = [e for e in self._events if e.get("kind") == "start" and e.get("role") == "sweep-controller"]
        return Proc.from_event(starts[-1]) if starts else None

    def _end(self) -> Optional[dict]:
        """The ``sweep_end`` that ended the newest controller's work, if any."""
        self.refresh()
        last_start = max((e["t"] for e in self._events if e.get("kind") == "start"), default=0.0)
        ends = [e for e in self._events if e.get("kind") == "sweep_end" and e["t"] >= last_start]
        return ends[-1] if ends else None

    def state(self) -> str:
        """``pending`` (controller not up yet), ``running``, then ``completed``, ``stopped`` or ``failed``
        (``failed`` too when the controller died without a word: :meth:`resume` carries on)."""
        end = self._end()
        if end is not None:
            return end.get("state", "failed")
        proc = self.controller()
        if proc is None:
            if self._controller is not None and self._controller.poll() is not None:
                return "failed"
            return "pending"
        return "running" if proc.alive() else "failed"

    def resume(self) -> "Sweep":
        """Start a new sweep controller for the points not submitted yet (after a crash or a reboot)."""
        proc = self.controller()
        if proc is not None and proc.alive():
            raise RuntimeError(f"sweep {self.id}: its controller (pid {proc.pid}) is still running")
        self._controller = controller.start(self.sweep_dir)
        return self

    def point_states(self) -> list[str]:
        self.refresh()
        errors = {e.get("point") for e in self._events if e.get("kind") == "point_error"}
        ended = self.state() in SWEEP_TERMINAL
        out = []
        for i in range(len(self.points)):
            if i in self._runs:
                out.append(self._runs[i].state())
            elif i in errors:
                out.append("error")
            else:
                out.append("skipped" if ended else "queued")
        return out

    def status(self) -> pd.DataFrame:
        """One row per point: its parameters, state, step, run directory."""
        states = self.point_states()
        rows = []
        for i, params in enumerate(self.points):
            run = self._runs.get(i)
            rows.append(
                {
                    "point": i,
                    **params,
                    "state": states[i],
                    "step": analysis.max_committed_step(run.events_read) if run is not None else None,
                    "steps_target": point_spec(self.record["base"], params, i).steps,
                    "run_id": run.id if run is not None else None,
                    "run_dir": str(run.run_dir) if run is not None else None,
                }
            )
        return pd.DataFrame(rows)

    def table(self) -> pd.DataFrame:
        """The comparison table: one row per point, its parameters and the figures of its run."""
        from workbench.analysis import compare

        self.refresh()
        runs = [self._runs.get(i) for i in range(len(self.points))]
        df = compare.table(runs, params=self.points)
        df.insert(0, "point", range(len(self.points)))
        df["state"] = self.point_states()
        return df

    def wait(self, timeout: Optional[float] = None, poll: float = 0.5) -> pd.DataFrame:
        """Block until the sweep has ended (every point's run ended); returns ``status()``."""
        self.wait_for(lambda s: s.state() in SWEEP_TERMINAL, float("inf") if timeout is None else timeout, poll)
        return self.status()

    def wait_for(self, predicate, timeout: float = 300.0, poll: float = 0.2) -> "Sweep":
        """Poll the sweep's files until ``predicate(sweep)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.id}: condition not met within {timeout}s (state {self.state()})")
            time.sleep(poll)
        return self

    def wait_for_point(self, point: int, timeout: float = 300.0) -> Run:
        """The run of ``point`` once the controller has submitted it."""
        if not 0 <= point < len(self.points):
            raise SpecError(f"point: {point} out of range; allowed: 0..{len(self.points) - 1}")
        self.wait_for(lambda s: point in s.runs() or s.state() in SWEEP_TERMINAL, timeout)
        if point not in self._runs:
            raise RuntimeError(f"sweep {self.id} ended ({self.state()}) without submitting point {point}")
        return self._runs[point]

    def stop(self, timeout: float = 60.0) -> pd.DataFrame:
        """Stop the sweep: submit nothing more and stop its unfinished runs.

        Through the sweep controller (SIGTERM) when it is alive and proves it is the sweep's; otherwise
        this process stops the runs itself and records the end, with a warning for each process it did
        not signal (a controller or a run's process that did not prove it is theirs), and why. A sweep
        directory without a marker (an older workbench's) whose controller runs is left to it, with a warning.
        """
        if self._end() is not None:
            return self.status()
        proc = self.controller()
        if proc is None and self._controller is not None and self._controller.poll() is None:
            proc = Proc(self._controller.pid, HOST, start_time(self._controller.pid))  # our own child
        not_signalled = []
        marker = Marker.of(self.sweep_dir)
        if proc is not None and proc.alive():
            why = proc.why_not_ours(marker)
            if why is None:
                detached.stop(proc, marker, lambda: not proc.alive(), timeout)
            else:
                not_signalled.append(f"sweep controller: {why}; not signalled")
        if self._end() is None and marker is None and not_signalled:  # an older workbench's sweep, still running
            EventWriter(self.sweep_dir, f"control-{os.getpid()}", sweep=self.id).emit(
                "warning", message=f"not stopped: {not_signalled[0]}"
            )
        elif self._end() is None:
            for run in self.runs().values():
                if run.state() not in ENDED:
                    not_signalled += [f"run {run.id}: {line}" for line in run.stop()["not_stopped"]]
            writer = EventWriter(self.sweep_dir, f"control-{os.getpid()}", sweep=self.id)
            for line in not_signalled:
                writer.emit("warning", message=f"not stopped: {line}")
            writer.emit("sweep_end", state="stopped", reason="sweep controller unreachable; runs stopped")
        return self.status()

    def pids(self) -> list[int]:
        """The sweep controller and every process its runs recorded, that are still alive."""
        out = []
        proc = self.controller()
        if proc is not None and proc.alive():
            out.append(proc.pid)
        for run in self.runs().values():
            out.extend(run.pids())
        return out

    def figures(self, color_by: Optional[str] = None) -> list:
        from workbench.analysis import compare_figures

        return compare_figures.sweep_report_figures(self, color_by=color_by)


def attach_sweep(sweep_dir: Union[str, os.PathLike]) -> Sweep:
    """A Sweep for an existing sweep directory (from a new kernel, say)."""
    if not is_sweep_dir(sweep_dir):
        raise SpecError(f"sweep_dir: {str(sweep_dir)!r} is not a sweep directory (no {SWEEP_JSON})")
    return Sweep(sweep_dir)
