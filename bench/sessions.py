"""Training runs for the benchmarks, one at a time, variants interleaved.

Every run is submitted through ``workbench.submit`` like a notebook would, with
a huge ``steps`` target, and stopped once it has trained for ``window_s``
seconds after its first committed step: a time window, not a step count, so a
slow machine costs precision, not wall time, and runs with faults at
``at_s`` see the same fault density. Its events are kept in memory for
analysis; every process it recorded is killed by PID when it is done.

Interleaving: the variants of one comparison run in turn (A, B, A, B, ...),
so a change in the machine's load moves both.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from pathlib import Path
from typing import Any, Optional

import workbench as wb
from workbench import analysis

BIG = 10_000_000


@dataclasses.dataclass
class Variant:
    name: str
    overrides: dict

    def kills(self, every_s: float, window_s: float, targets: list[int]) -> "Variant":
        """This variant with a SIGKILL every ``every_s`` s, half a period in, cycling ``targets``."""
        faults = [
            {"action": "kill", "target": targets[i % len(targets)], "at_s": every_s * (i + 0.5)}
            for i in range(int(window_s // every_s))
        ]
        return Variant(f"{self.name} +kill/{every_s:g}s", {**self.overrides, "faults": faults})


TORCHFT = Variant("torchft-lite", {"trainer": "torchft-lite"})
TORCHFT_SPARE = Variant("torchft-lite spares=1", {"trainer": "torchft-lite", "spares": 1})
TORCHFT_NO_EVENTS = Variant("torchft-lite write_events=false", {"trainer": "torchft-lite", "write_events": False})


def ddp_restart(checkpoint_every_s: float) -> Variant:
    return Variant("ddp-restart", {"trainer": "ddp-restart", "checkpoint.every_s": checkpoint_every_s})


@dataclasses.dataclass
class RunRecord:
    variant: str
    run_dir: str
    spec: Any
    events: list[dict]
    window_s: float
    wall_s: float
    loadavg: tuple
    error: Optional[str] = None

    @functools.cached_property
    def timeline(self):
        """``analysis.recovery_timeline`` of this run, computed once for every figure that reads it."""
        return analysis.recovery_timeline(self.events)


def run_variant(
    variant: Variant, window_s: float, run_root: Path, log=print, startup_timeout: float = 240.0
) -> RunRecord:
    overrides = {"faults": [], "steps": BIG, "run_root": str(run_root), **variant.overrides}
    t0 = time.time()
    load = os.getloadavg()
    run = wb.submit("demo", overrides)
    error = None
    progress = _ProgressWatch()
    try:
        run.wait_for(
            lambda r: progress.first_t(r.events_read) is not None or r.state() in ("failed", "stopped"),
            timeout=startup_timeout,
        )
        first = progress.first_t(run.events_read)
        if first is None:
            error = f"run {run.id} ended ({run.state()}) before its first step"
        else:
            run.wait_for(
                lambda r: time.time() - first >= window_s or r.state() in ("failed", "stopped", "completed"),
                timeout=window_s + startup_timeout,
            )
    except TimeoutError as e:
        error = str(e)
    finally:
        _stop(run)
    events = run.event_records()
    record = RunRecord(variant.name, str(run.run_dir), run.spec, events, window_s, time.time() - t0, load, error)
    log(
        f"  {variant.name}: {len([e for e in events if e['kind'] == 'step'])} step events, "
        f"{sum(1 for e in events if e['kind'] == 'fault')} faults, {record.wall_s:.0f} s wall"
        + (f", ERROR {error}" if error else "")
    )
    return record


class _ProgressWatch:
    """When a run first made progress: its first committed ``step`` event, or, for a run that writes no
    step events (``write_events: false``), its first ``heartbeat`` past step 0 (heartbeats carry the step
    either way). Reads only the events it has not seen yet, so waiting costs O(new events) a poll.
    """

    def __init__(self) -> None:
        self._seen = 0
        self._t: Optional[float] = None

    def first_t(self, events: list[dict]) -> Optional[float]:
        for e in events[self._seen :]:
            kind = e.get("kind")
            if (kind == "step" and e.get("committed")) or (kind == "heartbeat" and (e.get("step") or 0) > 0):
                self._t = e["t"] if self._t is None else min(self._t, e["t"])
        self._seen = len(events)
        return self._t


def writes_steps(record: "RunRecord") -> bool:
    """Whether the run wrote step events (the throughput, startup and recovery figures read them)."""
    return bool(getattr(record.spec, "write_events", True))


def _stop(run) -> None:
    try:
        run.stop(timeout=30)
        run.wait_exited(timeout=30)
    except Exception:
        pass
    for pid in run.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if run._controller is not None and run._controller.poll() is None:
        run._controller.kill()
        run._controller.wait()


def interleaved(
    variants: list[Variant], reps: int, window_s: float, run_root: Path, log=print, alternate: bool = False
) -> list[RunRecord]:
    """Every variant once per repetition. ``alternate``: odd repetitions run the variants in reverse
    order, so a drift linear in time cancels over each two repetitions (neighbours stay neighbours)."""
    out = []
    for rep in range(reps):
        for v in variants[::-1] if alternate and rep % 2 else variants:
            log(f"[rep {rep + 1}/{reps}] {v.name}, {window_s:g} s window")
            out.append(run_variant(v, window_s, run_root, log))
    return out
