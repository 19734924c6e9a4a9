"""The one fault menu, used by the API, the CLI, the dashboard and schedules.

A fault acts on a replica group's current process (found from its ``start``
event: the newest attempt that has not exited) or on the lighthouse (found from
the controller's ``lighthouse`` events), and is recorded as a ``fault`` event
with its ``origin``. Locally a fault is a signal:

| action | what happens |
|---|---|
| ``kill`` | SIGKILL: the process dies mid-step, as on a hardware fault |
| ``hang`` | SIGSTOP, then SIGCONT after ``seconds`` (a detached helper resumes it, so a hang ends even if the notebook dies) |
| ``preempt`` | SIGTERM: the trainer finishes its step and exits as preempted |
| ``lighthouse_kill`` | SIGKILL to the lighthouse; the run controller restarts it on the same address |
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from .events import EventReader, EventWriter

ACTIONS = ("kill", "hang", "preempt", "lighthouse_kill")
ORIGINS = ("api", "cli", "button", "schedule", "watchdog")

_writers: dict[str, EventWriter] = {}


class FaultError(ValueError):
    pass


def _cluster(run_dir) -> str:
    from .rundir import read_record

    return read_record(run_dir)["spec"].get("cluster", "local")


def actions_for(run_dir) -> list[str]:
    """The actions this run's backend supports (the dashboard's menu)."""
    if _cluster(run_dir) == "slurm":
        from .cluster import slurm

        return list(slurm.ACTIONS)
    return list(ACTIONS)


def _control_writer(run_dir: Path) -> EventWriter:
    key = str(Path(run_dir).resolve())
    if key not in _writers:
        from .rundir import read_record

        run_id = read_record(run_dir)["run_id"]
        _writers[key] = EventWriter(run_dir, f"control-{os.getpid()}", run=run_id)
    return _writers[key]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def replica_pid(run_dir, replica: int, attempt: Optional[int] = None, events: Optional[list] = None) -> Optional[int]:
    """PID of the replica group's live process (newest attempt, or ``attempt``), or None."""
    events = events if events is not None else EventReader(run_dir).poll()
    starts, exited = {}, set()
    here = socket.gethostname()
    for e in events:
        if e.get("replica") != replica or e.get("role") == "controller":
            continue
        if e["kind"] == "start" and e.get("host", here) == here:  # a PID means nothing on another host
            starts[e.get("attempt", 0)] = e.get("pid")
        elif e["kind"] == "exit":
            exited.add(e.get("attempt", 0))
    candidates = [attempt] if attempt is not None else sorted(starts, reverse=True)
    for a in candidates:
        pid = starts.get(a)
        if pid and a not in exited and _alive(pid):
            return pid
    return None


def lighthouse_pid(run_dir, events: Optional[list] = None) -> Optional[int]:
    events = events if events is not None else EventReader(run_dir).poll()
    ups = [e for e in events if e["kind"] == "lighthouse" and e.get("state") == "up"]
    return ups[-1].get("pid") if ups else None


def inject(
    run_dir,
    action: str,
    target: Optional[int] = None,
    origin: str = "api",
    seconds: Optional[float] = None,
    writer: Optional[EventWriter] = None,
    events: Optional[list] = None,
) -> dict:
    """Inject one fault and record it. Raises FaultError (nothing done) on bad input.

    ``events``: the run's events if the caller already holds them (a ``Run`` does); else they are read.
    """
    run_dir = Path(run_dir)
    allowed = actions_for(run_dir)
    if action not in allowed:
        raise FaultError(f"action: {action!r} is not a fault here; allowed: {', '.join(allowed)}")
    if origin not in ORIGINS:
        raise FaultError(f"origin: {origin!r}; allowed: {', '.join(ORIGINS)}")
    writer = writer or _control_writer(run_dir)
    events = events if events is not None else EventReader(run_dir).poll()
    if _cluster(run_dir) == "slurm":
        from .cluster import slurm

        return slurm.inject(run_dir, action, target, origin=origin, seconds=seconds, writer=writer, events=events)
    if action == "lighthouse_kill":
        pid = lighthouse_pid(run_dir, events)
        if not pid or not _alive(pid):
            raise FaultError("lighthouse_kill: this run has no live lighthouse")
        os.kill(pid, signal.SIGKILL)
        return writer.emit("fault", action=action, target="lighthouse", pid=pid, origin=origin)
    if target is None:
        raise FaultError(f"target: {action} needs a replica index")
    pid = replica_pid(run_dir, int(target), events=events)
    if pid is None:
        raise FaultError(f"target: replica {target} has no live process to {action}")
    if action == "kill":
        os.kill(pid, signal.SIGKILL)
    elif action == "preempt":
        os.kill(pid, signal.SIGTERM)
    elif action == "hang":
        seconds = float(seconds if seconds is not None else 5.0)
        if seconds <= 0:
            raise FaultError(f"seconds: a hang lasts > 0 seconds, got {seconds}")
        pids = [pid, *descendants(pid)]
        for p in pids:
            os.kill(p, signal.SIGSTOP)
        subprocess.Popen(
            [sys.executable, "-m", "workbench.faults", "resume", str(run_dir), ",".join(map(str, pids)),
             repr(time.time() + seconds), str(target)],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    return writer.emit("fault", action=action, target=int(target), pid=pid, origin=origin, seconds=seconds)


def descendants(pid: int) -> list[int]:
    """Processes a trainer started itself (MaxText's interpreter, TorchTitan's ranks): a hang
    must stop them too, or they train on while their parent is stopped."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _resume(run_dir: str, pids: list[int], resume_at: float, target: int) -> None:
    time.sleep(max(0.0, resume_at - time.time()))
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGCONT)
    if alive:
        _control_writer(Path(run_dir)).emit("fault", action="resume", target=target, pid=pids[0], origin="schedule")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "resume":
        _resume(sys.argv[2], [int(p) for p in sys.argv[3].split(",")], float(sys.argv[4]), int(sys.argv[5]))
