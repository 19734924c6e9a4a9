"""Process identity: a signal goes only to a process proven to be the run's.

A PID alone names a process only while it lives: after it exits (or the
machine reboots) the number is reused, and the workbench's CLI may run as
root on a login node. Every ``start`` event therefore records the process's
identity: ``pid``, ``host`` and ``pid_start`` (:func:`start_time`: when the
kernel started that PID, in seconds since boot). Before a signal,
:meth:`Proc.why_not` compares the live process's start time with the recorded
one; a different or missing process is reported, never signalled. A record
without ``pid_start`` (written by an older workbench) is never signalled
either.

Not psutil's ``create_time``: it adds ``btime`` from ``/proc/stat``, the boot
time in whole seconds, which the kernel derives from the wall clock, so a
clock adjustment moves it by a second. Seen here on 2026-12-03: a run's
controller read "started 1796311861.88, recorded 1796311860.88", so ``stop``
left the run training for an hour; in a CI run every daemon of a test's dev
cluster was taken for another process and left running by ``down``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Optional

import psutil

HOST = socket.gethostname()
START_TOLERANCE_S = 0.05  # the start is counted in clock ticks (10 ms)
WALL_CLOCK_START = 1e9  # a pid_start this large is psutil's create_time, as workbenches before 2026-12-03 wrote it


def start_time(pid: int) -> Optional[float]:
    """Seconds from boot to the start of ``pid`` (field 22 of ``/proc/PID/stat``, in clock ticks); None if
    there is no such process. psutil's ``create_time`` where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        return round(int(fields[19]) / os.sysconf("SC_CLK_TCK"), 3)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        return round(psutil.Process(pid).create_time(), 3)
    except (psutil.Error, OSError, ValueError):
        return None


def identity(pid: Optional[int] = None) -> dict:
    """``{pid, host, pid_start}`` of this (or ``pid``'s) process, for a ``start`` event."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": HOST, "pid_start": start_time(pid)}


@dataclasses.dataclass(frozen=True)
class Proc:
    """A process as an event recorded it."""

    pid: int
    host: Optional[str] = None
    started: Optional[float] = None

    @classmethod
    def from_event(cls, e: dict, pid_key: str = "pid") -> Optional["Proc"]:
        pid = e.get(pid_key)
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return None
        started = e.get("pid_start")
        return cls(pid, e.get("host"), float(started) if isinstance(started, (int, float)) else None)

    @property
    def local(self) -> bool:
        return self.host in (None, HOST)

    def why_not(self) -> Optional[str]:
        """None if this is the live process it claims to be; else why not, in a few words."""
        if not self.local:
            return f"pid {self.pid} runs on {self.host}, not here"
        if self.started is None:
            return f"pid {self.pid} was recorded without its start time"
        try:
            p = psutil.Process(self.pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return f"pid {self.pid} has exited"
            if self.started > WALL_CLOCK_START:  # a run started by an older workbench: still ours to stop
                now, tolerance = p.create_time(), 1.5
            else:
                now, tolerance = start_time(self.pid), START_TOLERANCE_S
        except psutil.NoSuchProcess:
            return f"pid {self.pid} has exited"
        except (psutil.Error, OSError) as e:
            return f"pid {self.pid}: {e}"
        if now is None:
            return f"pid {self.pid} has exited"
        if abs(now - self.started) > tolerance:
            return f"pid {self.pid} is now another process (started {now:.2f}, recorded {self.started:.2f})"
        return None

    def alive(self) -> bool:
        return self.why_not() is None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still the recorded process; False (nothing sent) otherwise."""
        if self.why_not() is not None:
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def descendants(self) -> list["Proc"]:
        """Processes it started (MaxText's interpreter, TorchTitan's ranks), identified now."""
        if self.why_not() is not None:
            return []
        try:
            children = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        out = []
        for c in children:
            started = start_time(c.pid)
            if started is not None:
                out.append(Proc(c.pid, HOST, started))
        return out

    def as_record(self) -> list:
        return [self.pid, self.host, self.started]


def alive(pid: int) -> bool:
    """A PID that exists and is not a zombie (for processes this one started itself)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
