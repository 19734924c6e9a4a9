"""Injecting a fault: one entry point for the API, the CLI, the dashboard and schedules.

:func:`inject` takes a handle on a run (a ``Run``, or the run controller):
anything with ``run_dir``, ``spec``, ``run_state`` (the up-to-date
``RunState`` fold, which names each replica group's current process and job)
and ``cluster`` (its backend). It checks the kind against the one table
(``workbench.faults.kinds``) and the backend, lets the backend inject it
(``Cluster.inject``), and records one ``fault`` event with its ``origin``.
Nothing here reads the event log or ``run.json``: the handle holds both.
The lighthouse is the controller's child on the submit host on every
backend, so ``lighthouse_kill`` is done here.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Optional, Protocol

from workbench.cluster.base import Cluster
from workbench.errors import FaultError
from workbench.events.writer import EventWriter
from workbench.faults import armed
from workbench.faults import kinds as faultkinds
from workbench.faults import targets as fault_targets
from workbench.run.rundir import read_record
from workbench.spec.models import Spec
from workbench.state.fold import RunState
from workbench.trainers.registry import trainer_kind

ORIGINS = ("api", "cli", "button", "schedule", "watchdog")

_writers: dict[str, EventWriter] = {}


class RunHandle(Protocol):
    run_dir: Path
    spec: Spec
    run_state: RunState
    cluster: Cluster


def control_writer(run_dir, spec_run_id: Optional[str] = None) -> EventWriter:
    """This process's own event file in the run (``control-<pid>``): where its faults go."""
    key = str(Path(run_dir).resolve())
    if key not in _writers:
        if spec_run_id is None:
            spec_run_id = read_record(run_dir)["run_id"]
        _writers[key] = EventWriter(run_dir, f"control-{os.getpid()}", run=spec_run_id)
    return _writers[key]


def actions_for(run: RunHandle) -> list[str]:
    """The fault kinds this run's backend injects and its trainer has a target for (the dashboard's menu, the CLI's check)."""
    trainer = trainer_kind(run.spec.trainer)
    return [n for n in run.cluster.fault_kinds() if faultkinds.KINDS[n].supported_by(trainer)]


def inject(
    run: RunHandle,
    action: str,
    target: Optional[int] = None,
    origin: str = "api",
    seconds: Optional[float] = None,
    writer: Optional[EventWriter] = None,
    fire: bool = False,
    **fields,
) -> Optional[dict]:
    """Inject one fault and record it; the event recorded (None where the run's event log is not writable,
    ``EventWriter.emit``). Raises FaultError (nothing done) on bad input.

    A kind with a ``trigger`` is armed instead (an ``armed`` event; see ``workbench.faults.armed``)
    unless ``fire``: the controller fires it, with the trigger's ``fields``, when its event comes.
    """
    backend = run.spec.cluster
    try:
        kind = faultkinds.require(action, backend)
    except ValueError as e:
        raise FaultError(f"action: {e}") from None
    trainer = trainer_kind(run.spec.trainer)
    if not kind.supported_by(trainer):
        raise FaultError(
            f"action: {kind.name} does not apply to trainer {trainer.name} (it has no "
            f"{kind.process}); allowed: {', '.join(faultkinds.names_for(trainer, backend))}"
        )
    if origin not in ORIGINS:
        raise FaultError(f"origin: {origin!r}; allowed: {', '.join(ORIGINS)}")
    if kind.has_duration:
        chosen = seconds if seconds is not None else kind.default_seconds
        if chosen is None:
            raise FaultError(f"seconds: a {kind.name} lasts a number of seconds; none given")
        seconds = float(chosen)
        if seconds <= 0:
            raise FaultError(f"seconds: a {kind.name} lasts > 0 seconds, got {seconds}")
    else:
        seconds = None
    state = run.run_state
    writer = writer or control_writer(run.run_dir, getattr(run, "id", None))
    if kind.targets == "lighthouse":
        proc = state.lighthouse if state.lighthouse_up else None
        if proc is None or not proc.signal(signal.SIGKILL, run.cluster.marker):
            why = proc.why_not_ours(run.cluster.marker) if proc is not None else None
            raise FaultError(
                f"{kind.name}: this run has no live lighthouse" + (f" ({why}; not signalled)" if why else "")
            )
        return writer.emit("fault", action=kind.name, target="lighthouse", pid=proc.pid, origin=origin)
    if target is None:
        raise FaultError(f"target: {kind.name} needs a replica index")
    try:
        target = int(target)
    except (TypeError, ValueError):
        raise FaultError(f"target: {target!r} is not a replica index") from None
    replicas = state.groups
    if not 0 <= target < replicas:
        raise FaultError(f"target: replica {target} out of range; allowed: 0..{replicas - 1}")
    view = fault_targets.target_view(kind, trainer, state, target)
    if kind.trigger and not fire:
        t = time.time()  # stamped before the arm file exists: a save that finds it started after ``t``
        armed.arm(run.run_dir, kind.trigger, view.replica, {"action": kind.name, "origin": origin, "t": t})
        return writer.emit("armed", t=t, action=kind.name, target=view.replica, origin=origin, trigger=kind.trigger)
    proc = fault_targets.target_proc(kind, trainer, view, run.run_dir)
    extra = {"proc": proc} if proc is not None else {}
    fields = {**fields, **run.cluster.inject(kind, view, seconds, origin, **extra)}
    return writer.emit("fault", action=kind.name, origin=origin, seconds=seconds, **fields)
