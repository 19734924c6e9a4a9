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

Identity is not ownership: a PID and its start time are public
(``/proc/PID/stat``), so one forged line in a run's event log could name any
process on the machine. Before a signal the process must also prove it is
the run's (:class:`Marker`, :meth:`Proc.why_not_ours`): it belongs to the
user who owns the run directory, and its environment carries the run's
marker, a secret made when the directory was (``process-marker`` in it, 0600)
and handed to the run's controller, which every process the run starts
inherits. ``/proc/PID/environ`` is readable only by the process's owner (and
root): a stranger can neither read the secret from a run's process nor plant
it in a process of someone else's. A run directory without a marker (made by
an older workbench) proves nothing, and its processes are reported, never
signalled. The dev cluster's daemons prove themselves the same way, with the
state directory's marker (``workbench.cluster.slurm.statedir``). A process
signalling its own child (``Popen.terminate``, the fork server's cancel,
submitit's) needs no proof: a PID is not reused before its parent reaps it.

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
import secrets
import socket
import time
from pathlib import Path
from typing import Optional, Union

import psutil

HOST = socket.gethostname()
START_TOLERANCE_S = 0.05  # the start is counted in clock ticks (10 ms)
WALL_CLOCK_START = 1e9  # a pid_start this large is psutil's create_time, as workbenches before 2026-12-03 wrote it
RUN_MARKER = "WORKBENCH_RUN_MARKER"  # the variable a run's (or a sweep's) processes carry the marker in
MARKER_FILE = "process-marker"  # in the run (sweep, dev cluster state) directory, 0600
# Right after ``Popen`` returns, ``/proc/PID/environ`` (and ``cmdline``) of the child read empty about one time
# in five here: the exec is not complete. An empty environment is read again, for up to 0.1 s.
ENVIRON_RETRIES, ENVIRON_RETRY_S = 5, 0.02


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
class Marker:
    """What proves a live process is one a run (a sweep, the dev cluster) started: it is ``uid``'s, and its
    environment carries ``var=value`` from its start.

    ``uid`` is the owner of the directory the marker belongs to, as the file system says, not as any
    record of the run says: a user can write a run directory's every file, but cannot give it away, so a
    run directory proves at most its owner's processes, whoever runs ``workbench stop`` on it.
    """

    var: str
    value: str
    uid: int

    @classmethod
    def create(cls, directory: Union[str, os.PathLike], var: str = RUN_MARKER) -> "Marker":
        """A new secret for ``directory`` (``process-marker`` in it, 0600; refused if one exists)."""
        value = secrets.token_hex(16)
        fd = os.open(Path(directory) / MARKER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        return cls(var, value, os.stat(directory).st_uid)

    @classmethod
    def of(cls, directory: Union[str, os.PathLike], var: str = RUN_MARKER) -> Optional["Marker"]:
        """The marker of ``directory``; None where it has none (an older workbench made it)."""
        try:
            value = (Path(directory) / MARKER_FILE).read_text().strip()
            uid = os.stat(directory).st_uid
        except (FileNotFoundError, NotADirectoryError):
            return None
        return cls(var, value, uid) if value else None

    @classmethod
    def ensure(cls, directory: Union[str, os.PathLike], var: str = RUN_MARKER) -> "Marker":
        """The marker of ``directory``, made now if it has none."""
        found = cls.of(directory, var)
        if found is not None:
            return found
        try:
            return cls.create(directory, var)
        except FileExistsError:  # made meanwhile by another process
            return cls.of(directory, var) or cls.create(directory, var)

    def env(self) -> dict[str, str]:
        """What to add to the environment of a process the run starts."""
        return {self.var: self.value}

    def why_not(self, pid: int) -> Optional[str]:
        """None if live process ``pid`` is ``uid``'s and carries this marker; else why not, in a few words.

        The environment is the one ``/proc/PID/environ`` shows: what the process was started with,
        which no later change to its ``os.environ`` alters, and which a fork inherits."""
        try:
            p = psutil.Process(pid)
            name = p.name()
            uids = p.uids()
        except psutil.NoSuchProcess:
            return f"pid {pid} has exited"
        except (psutil.Error, OSError) as e:
            return f"pid {pid}: {e}"
        if uids.real != self.uid or uids.effective != self.uid:
            return f"pid {pid} ({name}) belongs to uid {uids.effective}, not to the owner of the run (uid {self.uid})"
        try:
            environ = p.environ()
            for _ in range(ENVIRON_RETRIES):
                if environ:
                    break
                time.sleep(ENVIRON_RETRY_S)
                environ = p.environ()
        except psutil.NoSuchProcess:
            return f"pid {pid} has exited"
        except (psutil.Error, OSError) as e:
            return f"pid {pid} ({name}): its environment cannot be read ({type(e).__name__})"
        if not secrets.compare_digest(environ.get(self.var, ""), self.value):
            return f"pid {pid} ({name}) does not carry the run's marker ({self.var}) in its environment"
        return None


NO_MARKER = "the run directory has no process marker (an older workbench made it), so no process proves it is the run's"


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

    def why_not_ours(self, marker: Optional[Marker]) -> Optional[str]:
        """None if this is the live process it claims to be and ``marker`` proves it the run's; else why
        not. ``marker`` None (a run directory without one) proves nothing."""
        why = self.why_not()
        if why is not None:
            return why
        if marker is None:
            return f"pid {self.pid}: {NO_MARKER}"
        return marker.why_not(self.pid)

    def alive(self) -> bool:
        return self.why_not() is None

    def signal(self, sig: int, marker: Optional[Marker]) -> bool:
        """Send ``sig`` if this is still the recorded process and ``marker`` proves it the run's
        (:meth:`why_not_ours` says why not); False, nothing sent, otherwise."""
        if self.why_not_ours(marker) is not None:
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
