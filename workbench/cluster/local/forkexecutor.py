"""The controller's side of the fork server: its handle, and a submitit executor whose jobs it forks.

:class:`ForkServer` starts the run's server (``python -m workbench.cluster.local.forkserver``,
with :data:`~workbench.trainers.forked.QUIET_ENV`) and speaks its protocol (one JSON
line each way, :mod:`workbench.cluster.local.forkserver`), one request at a time.
:class:`ForkExecutor` is submitit's ``LocalExecutor`` with the task forked by that server instead
of started as two new interpreters; the job is a :class:`ForkJob` whose id is the child's PID.
The server reaps its children, so :meth:`ForkJob.done` is that PID gone, a zombie, or another
process (its start time differs from the one the server answered), read from ``/proc``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Optional

from submitit.core import core, utils

from workbench.cluster import exits
from workbench.cluster.local import forkserver, submitit_local
from workbench.cluster.procs import HOST, START_TOLERANCE_S, Marker, Proc, start_time
from workbench.trainers.forked import QUIET_ENV

STATUS_WAIT_S = 0.5  # for the server's status file of a child that has just ended (it reaps every 20 ms)


class ForkServerError(RuntimeError):
    """The fork server could not start or answer; the message says why."""


class ForkServer:
    """The controller's handle on its fork server: start, fork, cancel. One request at a time."""

    def __init__(self, trainer: str, model: Optional[dict] = None, log: Optional[Path] = None) -> None:
        self.trainer, self.model, self.log = trainer, model, log
        self.proc: Optional[subprocess.Popen] = None
        self.ready: Optional[dict] = None
        self.forked: list[int] = []  # every PID it forked for this handle, for a caller that must end them
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the server without waiting for its imports (``wait_ready`` waits)."""
        if self.proc is not None and self.proc.poll() is None:
            return
        env = {**os.environ, **QUIET_ENV}
        err: IO[bytes] | int = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", forkserver.__name__, self.trainer, json.dumps(self.model or {})],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                close_fds=True,
            )
        finally:
            if not isinstance(err, int):
                err.close()
        self.ready = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 120.0) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        if self.ready is None:
            self.ready = self._read(timeout)
            if not self.ready.get("ready"):
                self.close()
                raise ForkServerError(f"fork server: not fork-safe after its imports: {self.ready.get('why')}")
        return self.ready

    def fork(self, folder: Path, env: dict) -> tuple[int, Optional[float]]:
        with self._lock:
            self.wait_ready()
            answer = self._ask({"op": "fork", "folder": str(folder), "env": env})
        if "error" in answer:
            raise ForkServerError(f"fork server: {answer['error']}")
        self.forked.append(int(answer["pid"]))
        return int(answer["pid"]), answer.get("pid_start")

    def cancel(self, pid: int) -> bool:
        """Ask the server to cancel ``pid``; False if it cannot (it is gone)."""
        if not self.alive() or self.ready is None:
            return False
        with self._lock:
            try:
                self._ask({"op": "cancel", "pid": pid})
            except ForkServerError:
                return False
        return True

    def close(self) -> None:
        """End the server (its children keep running); reap it."""
        if self.proc is None:
            return
        try:
            self._started()[1].close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._started()[2].close()

    def _started(self) -> tuple[subprocess.Popen, IO[bytes], IO[bytes]]:
        """The server's process, its stdin (requests) and its stdout (answers): ``start`` made both pipes."""
        if self.proc is None or self.proc.stdin is None or self.proc.stdout is None:
            raise ForkServerError("fork server: not started")
        return self.proc, self.proc.stdin, self.proc.stdout

    def _ask(self, req: dict) -> dict:
        _, requests, _ = self._started()
        try:
            requests.write(json.dumps(req).encode() + b"\n")
            requests.flush()
        except (BrokenPipeError, OSError) as e:
            raise ForkServerError(f"fork server exited ({e})") from None
        return self._read(10.0)

    def _read(self, timeout: float) -> dict:
        proc, _, answers = self._started()
        fd = answers.fileno()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ForkServerError(f"fork server: no answer in {timeout:.0f} s")
            chunk = os.read(fd, 1)
            if not chunk:
                raise ForkServerError(f"fork server exited (code {proc.wait()})")
            line += chunk
        return json.loads(line)


class ForkJob(core.Job):
    """A submitit job whose task is a child of the fork server; its id is the child's PID."""

    def __init__(
        self,
        folder,
        job_id: str,
        tasks=(0,),
        pid_start: Optional[float] = None,
        server: Optional[ForkServer] = None,
        marker: Optional[Marker] = None,
    ) -> None:
        super().__init__(folder, job_id, tasks)
        self._pid_start = pid_start
        self._server = server
        self._marker = marker
        self._memory_cgroup = self._own_memory_cgroup()

    def _running(self) -> bool:
        pid = int(self.job_id)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        started = start_time(pid)
        return started is not None and (self._pid_start is None or abs(started - self._pid_start) <= START_TOLERANCE_S)

    def done(self, force_check: bool = False) -> bool:  # noqa: ARG002
        return not self._running()

    def exit_status(self, wait_s: float = STATUS_WAIT_S) -> exits.ExitStatus:
        """How the child ended: the wait status the server wrote when it reaped it. The PID leaves
        ``/proc`` (or turns zombie, which ``done`` already counts) up to one reap period (20 ms) before
        the server writes it: wait up to ``wait_s``; an empty record without the server (it ended
        with its controller, and init reaped the child)."""
        status = exits.from_status_file(exits.status_path(self.paths.folder, str(self.job_id)), wait_s)
        if status.signal == "SIGKILL" and status.oom is None and self._memory_cgroup is not None:
            cgroup, before = self._memory_cgroup
            after = exits.memory_cgroup_oom_kills(cgroup)
            if after is not None and after > before:
                status.oom = "memory_cgroup"
        return status

    def _own_memory_cgroup(self) -> Optional[tuple[Path, int]]:
        """The child's memory cgroup and its ``oom_kill`` count now, where the child has one to itself (not
        the controller's: a rise there could be any process's)."""
        cgroup = exits.memory_cgroup(int(self.job_id))
        if cgroup is None or cgroup == exits.memory_cgroup(os.getpid()):
            return None
        count = exits.memory_cgroup_oom_kills(cgroup)
        return None if count is None else (cgroup, count)

    def get_info(self, mode: str = "force") -> dict:  # noqa: ARG002
        if self._running():
            return {"jobState": "RUNNING"}
        return {"jobState": "FINISHED" if self.paths.result_pickle.exists() else "INTERRUPTED"}

    @property
    def state(self) -> str:
        return self.get_info()["jobState"]

    def cancel(self, check: bool = True) -> None:  # noqa: ARG002
        """SIGINT, then SIGKILL after 1 s (the server escalates: its own child); without the server,
        SIGKILL at once if the process proves it is the run's (``marker``, ``workbench.cluster.procs``)."""
        if not self._running():
            return
        if self._server is None or not self._server.cancel(int(self.job_id)):
            Proc(int(self.job_id), HOST, self._pid_start).signal(signal.SIGKILL, self._marker)

    def __getstate__(self) -> dict:
        out = dict(self.__dict__)
        out["_server"] = None
        out["_marker"] = None
        return out


class ForkExecutor(core.PicklingExecutor):
    """submitit's ``LocalExecutor``, with each task forked from a :class:`ForkServer`.

    Same folder layout, pickles and logs; the job environment inside is submitit's
    ``local`` one, so a trainer cannot tell the difference but for its parent.
    """

    job_class = ForkJob

    def __init__(self, folder, server: ForkServer, max_num_timeout: int = 3, marker: Optional[Marker] = None) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.server = server
        self.marker = marker  # the run's: what a job's process must carry to be cancelled without the server
        self._throttling = 0.0  # submitit's 0.2 s between submissions protects a scheduler; there is none here
        utils.JobPaths.get_first_id_independent_folder(self.folder).mkdir(parents=True, exist_ok=True)

    @classmethod
    def _valid_parameters(cls) -> set:
        return {"timeout_min", "tasks_per_node"}

    def _submit_command(self, command: str) -> ForkJob:  # noqa: ARG002
        env = submitit_local.local_job_env(1, self.parameters.get("timeout_min", 2.0), 30)
        pid, pid_start = self.server.fork(self.folder, env)
        return ForkJob(self.folder, str(pid), tasks=[0], pid_start=pid_start, server=self.server, marker=self.marker)

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return ""

    @staticmethod
    def _get_job_id_from_submission_command(string) -> str:
        return "0"

    def _make_submission_command(self, submission_file_path: Path) -> list:
        return []
