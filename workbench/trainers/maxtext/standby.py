"""A warm MaxText interpreter for the next attempt: the wrapper's side of the launcher's standby.

Why: of the 8 s from a kill to a restarted MaxText's first step (one process, this machine's two cores),
5 s were the new interpreter's imports (jax 0.8 s, MaxText's trainer 4.2 s), before any JAX work.
A standby has done them before the kill.

The protocol (the other side: ``launcher.py --standby``, see its docstring). Once an attempt's MaxText has
taken its first step, the wrapper starts a standby for the group's next attempt (:func:`start`): MaxText's
interpreter running the launcher in its own session (a kill of this job must not take it along), listening on
``<run_dir>/maxtext/standby.replica-<r>.sock``, ending with the run's controller (its PID from the controller's
``start`` event, its identity checked here). The next attempt's wrapper claims it (:func:`claim`): it connects,
sends its argv and environment and the write end of its console pipe, and gets back the PID of a child forked
from the standby, which runs MaxText as a cold launch would; later the child's exit code, or the connection's
end if the standby died. The wrapper's own end closes the connection, and the standby then kills the child.

Only where a process may outlive its job: not inside a Slurm allocation (the job's processes end with it), and
for a job of one process. A refused or missing standby is a cold start, as before. A spare job (:mod:`.spare`)
starts a standby of its own on each of its nodes instead, inside the job.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Optional

from workbench.cluster.procs import start_time
from workbench.events.reader import read_all

CLAIM_TIMEOUT_S = 60.0  # a standby still importing answers once its imports are done (about 5 s)


def socket_path(run_dir: str | os.PathLike, replica: int) -> Path:
    return Path(run_dir).resolve() / "maxtext" / f"standby.replica-{replica}.sock"


def ready_path(path: Path) -> Path:
    """The file the standby listening on ``path`` creates once its imports are done."""
    return path.with_suffix(".ready")


def through_fd(path: Path) -> tuple[str, int]:
    """``path`` as ``/proc/self/fd/N/<name>``, N an ``O_PATH`` descriptor of its folder (the caller closes it):
    a socket's address holds 107 bytes, fewer than a run directory's path may have (a pytest run root's)."""
    folder = os.open(path.parent, os.O_PATH)
    return f"/proc/self/fd/{folder}/{path.name}", folder


def enabled(processes: int) -> bool:
    """Whether this job's attempts use standbys: one process, outside a Slurm allocation, not turned off
    (``WORKBENCH_MAXTEXT_STANDBY=0``)."""
    return processes == 1 and not os.environ.get("SLURM_JOB_ID") and os.environ.get("WORKBENCH_MAXTEXT_STANDBY") != "0"


def keeper(run_dir: str | os.PathLike) -> Optional[int]:
    """The run's controller, alive: the standby's lifetime; None without one."""
    for e in read_all(run_dir):
        if e.get("kind") == "start" and e.get("role") == "controller" and isinstance(e.get("pid"), int):
            started = start_time(e["pid"])
            if started is not None and abs(started - float(e.get("pid_start") or 0)) < 0.05:
                return e["pid"]
    return None


def start(python: str, launcher: str, path: Path, env: dict[str, str], keeper_pid: int) -> Optional[int]:
    """Start a standby listening on ``path`` (unless one is there); its PID, or None. Its ``.pid``, ``.log``
    and ``.ready`` files are beside the socket."""
    pid_file = path.with_suffix(".pid")
    try:
        pid, started = pid_file.read_text().split()
        if start_time(int(pid)) == float(started):
            return None  # one is there already
    except (OSError, ValueError):
        pass
    path.unlink(missing_ok=True)  # a socket its standby left when it was killed
    ready_path(path).unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path.with_suffix(".log"), "ab")
    proc = subprocess.Popen(
        [python, launcher, "--standby", str(path), str(keeper_pid), str(ready_path(path))],
        env={**env, "OPENBLAS_NUM_THREADS": "1"},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    pid_file.write_text(f"{proc.pid} {start_time(proc.pid)}")
    return proc.pid


class StandbyChild:
    """The part of ``subprocess.Popen`` the wrapper uses, for MaxText forked from a standby."""

    def __init__(self, conn: socket.socket, pid: int, stdout, pending: bytes = b"") -> None:
        self.conn, self.pid, self.stdout = conn, pid, stdout
        self.returncode: Optional[int] = None
        self._buf = pending
        self._reading = False

    def _read(self, timeout: Optional[float]) -> None:
        self.conn.settimeout(timeout)
        while not self._buf.endswith(b"\n"):
            try:
                chunk = self.conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return
            except OSError:
                chunk = b""
            if not chunk:
                break
            self._buf += chunk
        try:
            self.returncode = int(json.loads(self._buf)["returncode"])
        except (ValueError, KeyError, TypeError):
            self.returncode = -9  # the standby died (SIGKILL), and its child with it
        self.conn.close()

    def poll(self) -> Optional[int]:
        if self.returncode is None and not self._reading:  # a stop signal's handler may poll inside a poll
            self._reading = True
            try:
                self._read(0.0)
            finally:
                self._reading = False
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._read(None)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(9)


def claim(path: Path, argv: list[str], env: dict[str, str]) -> tuple[Optional[StandbyChild], Optional[str]]:
    """MaxText forked from the standby at ``path`` (argv without the interpreter and launcher), and None; or
    None and why not (no standby, a stale socket, a refusal)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        address, folder = through_fd(path)
        try:
            conn.connect(address)
        finally:
            os.close(folder)
    except OSError as e:
        conn.close()
        if path.exists() and not isinstance(e, FileNotFoundError):
            path.unlink(missing_ok=True)  # its standby is gone
        return None, f"no standby ({type(e).__name__})"
    read_fd, write_fd = os.pipe()
    try:
        request = json.dumps({"argv": argv, "env": env}).encode() + b"\n"
        sent = socket.send_fds(conn, [request[:65536]], [write_fd])
        conn.sendall(request[sent:])
        conn.settimeout(CLAIM_TIMEOUT_S)
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError("the standby closed the connection")
            answer += chunk
        line, _, pending = answer.partition(b"\n")
        reply = json.loads(line)
    except (OSError, ValueError) as e:
        conn.close()
        os.close(read_fd)
        return None, f"standby failed: {e}"
    finally:
        os.close(write_fd)
    if "pid" not in reply:
        conn.close()
        os.close(read_fd)
        return None, f"standby refused: {reply.get('error')}"
    path.with_suffix(".pid").unlink(missing_ok=True)  # this one is taken: the next attempt's may start
    stdout = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace", buffering=1)
    return StandbyChild(conn, int(reply["pid"]), stdout, pending), None
