"""The sweep controller: the detached process that submits a sweep's points and records what it did.

Protocol. ``python -m workbench.experiments.sweep SWEEP_DIR`` (:func:`start`) runs in its
own session, so the sweep outlives the kernel that started it. It submits
point after point through ``workbench.submit`` (each point is a normal run
directory under the run root, named ``<name>-p<i>``) whenever fewer than
``max_parallel`` of its runs have not ended, and writes ``sweep_end`` once
every run has. Its ``submit`` events are the index of point -> run dir, so the
same command started again resumes a sweep without submitting a point twice.
A sweep with a ``lock`` file holds an exclusive ``flock`` on it from before
it submits a run until none of its runs is going (so, one run at a time, run
by run), or, given ``lock_turn_s``, until that long has passed since it took
it and none is going (a turn of several short runs); a thread waits for it,
so the stop signal is still heard.
SIGTERM (``Sweep.stop()``) means: submit nothing more, stop the runs still
going, write ``sweep_end state=stopped``. The files use the event-log protocol
of ``workbench/events.py``.

Not a Slurm job array: each point is itself a controller-driven run
(lighthouse, relaunches, fault schedule), so the points are submitted one run
at a time like any other.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from workbench.cluster.procs import Marker
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.experiments.sweep.points import point_spec
from workbench.experiments.sweep.sweepdir import read_record
from workbench.run import detached
from workbench.run.handle import ENDED, Run, attach, submit

POLL_S = 0.5


def start(sweep_dir: Path) -> subprocess.Popen:
    """Start the sweep controller of ``sweep_dir`` detached, logging to its ``controller.log``, with the sweep
    directory's process marker (made now for a sweep an older workbench started; ``Sweep.stop`` signals only
    a controller that carries it)."""
    return detached.spawn(
        "workbench.experiments.sweep", [str(sweep_dir)], Path(sweep_dir) / "controller.log", Marker.ensure(sweep_dir)
    )


class SweepController:
    """Submits the points, at most ``max_parallel`` unfinished runs at a time; see the module docstring."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = Path(sweep_dir).resolve()
        self.record = read_record(self.sweep_dir)
        self.points = self.record["points"]
        self.max_parallel = int(self.record["max_parallel"])
        previous = EventReader(self.sweep_dir).poll()
        self.runs: dict[int, Run] = {e["point"]: attach(e["run_dir"]) for e in previous if e.get("kind") == "submit"}
        self.errors = {e["point"] for e in previous if e.get("kind") == "point_error"}
        self.writer = EventWriter(self.sweep_dir, "controller", sweep=self.record["sweep_id"])
        self.stopping = False
        self.lock: Optional[str] = self.record.get("lock")
        self._lock_fd: Optional[int] = None
        self._waiter: Optional[threading.Thread] = None
        self._lock_used = False  # a run was submitted under the lock held now
        self._lock_since = 0.0

    def _hold_lock(self) -> bool:
        """Whether the sweep holds its lock now (True without a lock). A thread waits for it in a blocking
        ``flock``, as ``flock(1)`` does, so the sweep queues with the others instead of polling past them."""
        if self.lock is None or self._lock_fd is not None:
            return True
        if self._waiter is None or not self._waiter.is_alive():
            self._waiter = threading.Thread(target=self._wait_for_lock, args=(self.lock,), daemon=True)
            self._waiter.start()
        return False

    def _wait_for_lock(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._lock_since = time.monotonic()
        self._lock_fd = fd

    def _let_go(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the last descriptor releases the flock
            self._lock_fd = None
        self._lock_used = False

    def _on_stop_signal(self, *_: Any) -> None:
        self.stopping = True

    def run(self) -> str:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        self.writer.emit(
            "start",
            role="sweep-controller",
            points=len(self.points),
            max_parallel=self.max_parallel,
            resumed=len(self.runs),
        )
        state, reason = "failed", ""
        try:
            state, reason = self._loop()
        except Exception as e:
            reason = f"sweep controller error: {type(e).__name__}: {e}"
            import traceback

            traceback.print_exc()
            self._stop_runs()
        finally:
            self.writer.emit(
                "sweep_end", state=state, reason=reason, points={i: r.state() for i, r in sorted(self.runs.items())}
            )
            self.writer.close()
            self._let_go()
        return state

    def _loop(self) -> tuple[str, str]:
        pending = [i for i in range(len(self.points)) if i not in self.runs and i not in self.errors]
        while True:
            if self.stopping:
                self._stop_runs()
                return "stopped", "stop requested"
            live = [r for r in self.runs.values() if r.state() not in ENDED]
            turn_over = time.monotonic() - self._lock_since >= float(self.record.get("lock_turn_s") or 0)
            if not live and self._lock_used and turn_over:  # the next run queues for the lock again
                self._let_go()
            while pending and len(live) < self.max_parallel and not self.stopping and self._hold_lock():
                i = pending.pop(0)
                try:
                    spec = point_spec(self.record["base"], self.points[i], i)
                    run = submit(spec)
                except Exception as e:
                    self.errors.add(i)
                    self.writer.emit("point_error", point=i, message=f"{type(e).__name__}: {e}")
                    continue
                self.runs[i] = run
                self._lock_used = self.lock is not None
                live.append(run)
                self.writer.emit("submit", point=i, run_id=run.id, run_dir=str(run.run_dir), params=self.points[i])
            if not pending and not live:
                return "completed", ""
            time.sleep(POLL_S)

    def _stop_runs(self) -> None:
        for run in self.runs.values():
            if run.state() not in ENDED:
                try:
                    for line in run.stop()["not_stopped"]:
                        self.writer.emit("warning", message=f"stopping {run.id}: not stopped: {line}")
                except Exception as e:  # keep stopping the others
                    self.writer.emit("warning", message=f"stopping {run.id}: {type(e).__name__}: {e}")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m workbench.experiments.sweep SWEEP_DIR", file=sys.stderr)
        return 2
    state = SweepController(Path(argv[0])).run()
    return 0 if state in ("completed", "stopped") else 1
