"""How a job's process ended, as its backend knows it: the record ``Cluster.exit_status`` returns.

A backend knows different things: the local one its process's wait status (the fork server reaps its
children; submitit's local controller waits for its task), Slurm its accounting (``sacct``: the final
state, ``code:signal``, the node). :class:`ExitStatus` holds whichever it has; the controller copies its
fields into the ``job`` event (``workbench.events.end_fields.JOB``).

The wait status crosses a process boundary as a small JSON file next to the job's submitit logs
(:func:`status_path`: ``<job folder>/<job id>_<task>_exit.json``), written once, atomically, by the
process that reaped the task (the fork server, or the local controller of
``workbench.cluster.local.submitit_local``), and read by the controller: ``{"pid", "pid_start",
"returncode"}``, ``returncode`` in ``subprocess.Popen``'s form (negative: the signal).

The OOM killer ends a process with SIGKILL, which says nothing by itself: any SIGKILL looks the same. It
counts as the OOM killer's only with evidence for that process: the kernel's own line for that PID, logged
after the process started (:func:`oom_killed_in_kernel_log`: ``Out of memory: Killed process PID (...)``,
``Memory cgroup out of memory: Killed process PID``, ``oom-kill:...,pid=PID,...``), a rise of the
``oom_kill`` count of a memory cgroup the job has to itself (:func:`memory_cgroup_oom_kills`), or Slurm's
``OUT_OF_MEMORY``. The kernel log is ``/dev/kmsg`` (readable by root, or by anyone where
``kernel.dmesg_restrict`` is 0), else ``dmesg``; its timestamps are seconds since boot, close to (not
quite) the clock of a process's start time (``workbench.cluster.procs.start_time``). A PID is the
kernel's, in the initial PID namespace: a controller inside another PID namespace finds no line for its
jobs.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Optional

from workbench.events.end_fields import signal_name

KERNEL_LOG = "/dev/kmsg"
KERNEL_LOG_RECORDS = 100_000  # a bound on one read of the ring buffer (a few thousand records here, 3 ms)
KERNEL_CLOCK_SLACK_S = 1.0
"""How far before a process's start its OOM line may be stamped and still count. The kernel log's clock
(``local_clock``) is not ``CLOCK_BOOTTIME``, a start time's clock: here, up 21 h, it ran 24 ms behind, so
a line logged right after a start read as before it (20 of 20 tries with 10 ms of slack). An earlier
process's line within 1 s of this start would need its PID reused within that second (``pid_max`` is
32768 here)."""
_OOM_LINE = re.compile(r"(?:Killed process (?P<pid>\d+) \(|^oom-kill:.*[,:]pid=(?P<pid2>\d+)\b)")
_DMESG_LINE = re.compile(r"^\[\s*(?P<t>\d+\.\d+)\]\s?(?P<text>.*)$")


@dataclasses.dataclass
class ExitStatus:
    """What ended a job's process, as far as its backend knows; every field may be unknown (None)."""

    exit_code: Optional[int] = None  # it exited with this status (0-255)
    signal: Optional[str] = None  # a signal ended it (``SIGSEGV``)
    oom: Optional[str] = None  # the OOM killer did, known from: ``kernel_log``, ``memory_cgroup``, ``slurm``
    slurm_state: Optional[str] = None  # sacct's State (``NODE_FAIL``, ``CANCELLED by 0``)
    slurm_exit_code: Optional[str] = None  # sacct's ExitCode, ``code:signal``
    node: Optional[str] = None
    pid: Optional[int] = None  # the process the status is of (not an event field)

    def fields(self) -> dict:
        """The ``job`` event's fields this record knows."""
        out = dataclasses.asdict(self)
        out.pop("pid")
        return {k: v for k, v in out.items() if v is not None}


def from_returncode(returncode: int, pid: Optional[int] = None) -> ExitStatus:
    """``Popen.returncode`` (and ``os.waitstatus_to_exitcode``): negative is the signal that ended it."""
    if returncode < 0:
        return ExitStatus(signal=signal_name(-returncode), pid=pid)
    return ExitStatus(exit_code=returncode, pid=pid)


# -- the status file -------------------------------------------------------------------------------------
def status_path(folder: Path, job_id: str, task: int = 0) -> Path:
    """Where the process that reaped task ``task`` of job ``job_id`` writes its status; ``folder``: the
    job's folder (submitit's ``JobPaths.folder``, ``%j`` replaced)."""
    return Path(folder) / f"{job_id}_{task}_exit.json"


def write_status(path: Path, pid: int, pid_start: Optional[float], returncode: int) -> None:
    """Write the status file at once (a temporary file renamed over it): a reader sees all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps({"pid": pid, "pid_start": pid_start, "returncode": returncode}))
        os.replace(tmp, path)
    except OSError:
        pass  # the job's folder is gone (a deleted run): nobody will ask


def read_status(path: Path, wait_s: float = 0.0) -> Optional[dict]:
    """The status file's record, waiting up to ``wait_s`` for it (its writer reaps every few ms); None."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            record = json.loads(Path(path).read_text())
            if isinstance(record, dict) and isinstance(record.get("returncode"), int):
                return record
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def from_status_file(path: Path, wait_s: float = 0.0) -> ExitStatus:
    """The record of :func:`read_status` as an :class:`ExitStatus`, with the OOM killer's evidence looked up
    for a SIGKILL; an empty one without a file."""
    record = read_status(path, wait_s)
    if record is None:
        return ExitStatus()
    status = from_returncode(record["returncode"], pid=record.get("pid"))
    if status.signal == "SIGKILL" and status.pid is not None:
        if oom_killed_in_kernel_log(status.pid, since=record.get("pid_start")):
            status.oom = "kernel_log"
    return status


# -- the OOM killer's evidence ---------------------------------------------------------------------------
def kernel_log() -> list[tuple[float, str]]:
    """The kernel's ring buffer as ``(seconds since boot, text)``; empty where it cannot be read."""
    try:
        fd = os.open(KERNEL_LOG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return _dmesg()
    records = []
    try:
        for _ in range(KERNEL_LOG_RECORDS):
            try:
                raw = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while read: the next read goes on from the oldest
                    continue
                break  # EAGAIN: the end
            if not raw:
                break
            head, _, text = raw.decode(errors="replace").partition(";")
            parts = head.split(",")
            if len(parts) >= 3 and parts[2].isdigit():
                records.append((int(parts[2]) / 1e6, text.split("\n", 1)[0]))
    finally:
        os.close(fd)
    return records


def _dmesg() -> list[tuple[float, str]]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=2).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [(float(m["t"]), m["text"]) for m in map(_DMESG_LINE.match, out.splitlines()) if m]


def oom_killed_in_kernel_log(pid: int, since: Optional[float] = None) -> bool:
    """Whether the kernel logged that its OOM killer killed ``pid`` at or after ``since`` (seconds since
    boot: the process's start; a line for an earlier process with the same PID does not count). The kernel
    log's clock stops in a suspend, which ``CLOCK_BOOTTIME`` counts; ``since`` is moved back by the time
    suspended so far, and by :data:`KERNEL_CLOCK_SLACK_S`."""
    if since is not None:
        suspended = time.clock_gettime(time.CLOCK_BOOTTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)
        since -= suspended + KERNEL_CLOCK_SLACK_S
    for t, text in kernel_log():
        m = _OOM_LINE.search(text)
        if m and int(m["pid"] or m["pid2"]) == pid and (since is None or t >= since):
            return True
    return False


def memory_cgroup(pid: int) -> Optional[Path]:
    """The memory cgroup directory of ``pid`` (cgroup v2's unified one, else v1's ``memory``); None."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for line in lines:
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def memory_cgroup_oom_kills(cgroup: Optional[Path]) -> Optional[int]:
    """The cgroup's ``oom_kill`` count (v2 ``memory.events``, v1 ``memory.oom_control``); None."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        if m:
            return int(m[1])
    return None
