"""Local jobs forked from a process that has already imported torch, torchft and the trainer.

Why: a replica group started the submitit way is ``python -m submitit.local._local``
(one interpreter) which starts ``python -m submitit.core._submit`` (a second one)
which imports workbench, torch and torchft before the trainer runs: about 2.5 s of
imports per attempt on this machine (``import torch`` 1.5 s, torchft 0.2 s,
workbench + pandas 1.2 s, measured with ``-X importtime``), and N of them at once at
submit on two cores. A fork of a process that has them imported costs milliseconds.

The protocol. One fork server per run (started by the controller through
:class:`ForkExecutor`, not per host: it imports exactly the run's trainer, inherits
the controller's environment, and ends with its controller, so there is no daemon,
no shared socket to authenticate and nothing to clean up between runs). The server
is ``python -m workbench.cluster.local.forkserver TRAINER``; it reads one JSON request a
line on stdin and answers one JSON line on stdout:

- ``{"op": "fork", "folder": F, "env": {...}}`` → ``{"pid": P, "pid_start": S}``: a
  child runs submitit's own ``process_job(F)`` (the pickled ``job_entrypoint(ctx)``,
  the result pickle, the logs ``F/P_0_log.out|err``) under submitit's
  ``LocalJobEnvironment`` (``SUBMITIT_LOCAL_JOB_ID`` = its PID), as a task of
  ``LocalExecutor`` does; the job id is the child's PID;
- ``{"op": "cancel", "pid": P}`` → ``{}``: SIGINT, then SIGKILL after 1 s, as
  submitit's local controller cancels a task;
- end of stdin (the controller exited): the server exits; its children keep
  running (as a ``LocalExecutor`` task outlives the controller that started it) and
  are reaped by init; ``Cluster.stop_all`` ends them by their recorded identity.

The server reaps its children (``waitpid(-1, WNOHANG)`` every 20 ms), so a job's end
is its PID gone (or a zombie, or the PID reused: the start time differs) —
:meth:`ForkJob.done` reads ``/proc``. The child stays in the server's process
group and session (that of the controller), where a ``LocalExecutor`` task is too;
faults signal it by PID after :mod:`workbench.cluster.procs` proves its identity.

What must not exist at the fork (docs/design.md, "The fork server"): another thread
(only the forking thread survives in the child; a lock another thread held stays
locked forever), an initialised CUDA/ROCm context (the driver's state is not
fork-safe: ``torch.cuda`` refuses a forked child, "Cannot re-initialize CUDA in
forked subprocess"), an open listener or socket (the child would hold the port; two
processes would accept on it). The server checks all three before it says it is
ready and before every fork (``fork_safety``), and refuses to fork otherwise. Two
libraries start a thread on import here, and the server's environment turns them
off: numpy's OpenBLAS pool (``OPENBLAS_NUM_THREADS=1``) and pyarrow's jemalloc
background thread (``JE_ARROW_MALLOC_CONF=background_thread:false``); the child gets
the controller's environment back (``env`` of the request), which only affects
libraries initialised after the fork.

RNG state: a child starts as a fresh interpreter would: ``random``, numpy's global
state and torch's default generator are each reseeded from the OS (``torch.seed()``;
a new process's ``torch.initial_seed()`` differs from run to run with this torch,
measured). So two groups never share RNG state, and a trainer that seeds from the
spec (all of them: ``torch.manual_seed(spec.seed)``, batches from ``(seed, step,
replica)``) computes exactly what it computes on submitit's path.
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
from typing import Optional

from submitit.core import core, utils

QUIET_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
CANCEL_GRACE_S = 1.0  # submitit's local controller: SIGINT, then SIGKILL after 1 s
REAP_S = 0.02
PICKLE_WAIT_S = 60.0  # process_job's own wait for the submitted pickle


class ForkServerError(RuntimeError):
    """The fork server could not start or answer; the message says why."""


# -- in the server ---------------------------------------------------------------------------------
def fork_safety() -> Optional[str]:
    """None if this process may fork a job; else what makes it unsafe (threads, CUDA, sockets)."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in threads)
        return f"{len(threads)} threads ({', '.join(names)})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    import psutil

    conns = psutil.Process().net_connections(kind="all")
    if conns:
        return f"{len(conns)} open sockets"
    return None


WARM_UP = frozenset({"torchft-lite"})
"""Trainers whose first AdamW step (``tiny_decoder.warm_up_adamw``) the server takes ahead: it imports
``torch._dynamo``, ``torch._inductor`` and sympy, 2.1 s measured, which a fork then inherits. The trainer
runs with ``torch.set_num_threads(1)``, which the server sets first so that the step starts no thread."""


def preload(trainer: str, model: Optional[dict] = None) -> float:
    """Import what every attempt of ``trainer`` imports (and warm it up, ``WARM_UP``); the seconds it took."""
    import importlib

    t0 = time.perf_counter()
    import numpy  # noqa: F401  (process_job imports it first, "to avoid unexpected interactions")
    import torch  # noqa: F401

    from workbench.trainers import trainer_kind

    kind = trainer_kind(trainer)
    if kind.elastic:
        import torchft  # noqa: F401
    importlib.import_module(kind.module)
    if trainer in WARM_UP and model:
        from workbench.trainers.lite.model import warm_up_adamw

        torch.set_num_threads(1)
        warm_up_adamw(model)
    return time.perf_counter() - t0


def _child(folder: str, env: dict) -> None:
    """In the forked child: become a fresh job process, run submitit's task, never return."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        pid = os.getpid()
        os.environ.update(SUBMITIT_LOCAL_JOB_ID=str(pid), SUBMITIT_LOCAL_LOCALID="0", SUBMITIT_LOCAL_GLOBALID="0")
        paths = utils.JobPaths(folder, str(pid), 0)
        paths.folder.mkdir(parents=True, exist_ok=True)
        out = os.open(paths.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = os.open(paths.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, 1 << 20)  # the server's request and answer pipes, anything an import opened
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        _reseed()
        deadline = time.monotonic() + PICKLE_WAIT_S
        while not paths.submitted_pickle.exists() and time.monotonic() < deadline:
            time.sleep(0.002)  # the executor moves the pickle in place right after the fork's answer
        from submitit.core.submission import process_job

        process_job(folder)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def _reseed() -> None:
    """A fresh interpreter's RNG state (see the module docstring)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def serve(trainer: str, model: Optional[dict] = None) -> None:
    """The server's loop (``python -m workbench.cluster.local.forkserver TRAINER [MODEL_JSON]``)."""
    requests = sys.stdin.buffer
    answers = os.fdopen(os.dup(1), "wb", buffering=0)  # not inheritable: a child never holds it
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing else (an import's print) may write into the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook's ^C is for the notebook, not the run
    imported_s = preload(trainer, model)
    why = fork_safety()
    _answer(answers, {"ready": why is None, "imported_s": round(imported_s, 3), "why": why})
    if why is not None:
        return
    cancels: dict[int, float] = {}
    fd = requests.fileno()
    buf = b""
    while True:
        _reap(cancels)
        readable, _, _ = select.select([fd], [], [], REAP_S)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            while cancels:  # finish the cancels asked for; then leave the rest running
                _reap(cancels)
                time.sleep(REAP_S)
            os._exit(0)  # no interpreter teardown of torch (about 1 s measured); nothing is left to flush
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            if req["op"] == "fork":
                why = fork_safety()
                if why is not None:
                    _answer(answers, {"error": f"not fork-safe: {why}"})
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req["folder"], req["env"])
                from workbench.cluster.procs import start_time

                _answer(answers, {"pid": pid, "pid_start": start_time(pid)})
            elif req["op"] == "cancel":
                pid = int(req["pid"])
                if pid in _CHILDREN:
                    _signal(pid, signal.SIGINT)
                    cancels.setdefault(pid, time.monotonic() + CANCEL_GRACE_S)
                _answer(answers, {})


_CHILDREN: set[int] = set()  # forked and not yet reaped: the only PIDs a cancel may signal


def _answer(stream, obj: dict) -> None:
    if "pid" in obj:
        _CHILDREN.add(obj["pid"])
    stream.write(json.dumps(obj).encode() + b"\n")
    stream.flush()


def _reap(cancels: dict[int, float]) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        _CHILDREN.discard(pid)
        cancels.pop(pid, None)
    now = time.monotonic()
    for pid, at in list(cancels.items()):
        if now >= at:
            _signal(pid, signal.SIGKILL)
            del cancels[pid]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- in the controller -----------------------------------------------------------------------------
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
        err = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "workbench.cluster.local.forkserver",
                    self.trainer,
                    json.dumps(self.model or {}),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                close_fds=True,
            )
        finally:
            if self.log:
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
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()

    def _ask(self, req: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise ForkServerError(f"fork server exited ({e})") from None
        return self._read(10.0)

    def _read(self, timeout: float) -> dict:
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ForkServerError(f"fork server: no answer in {timeout:.0f} s")
            chunk = os.read(fd, 1)
            if not chunk:
                raise ForkServerError(f"fork server exited (code {self.proc.wait()})")
            line += chunk
        return json.loads(line)


class ForkJob(core.Job):
    """A submitit job whose task is a child of the fork server; its id is the child's PID."""

    def __init__(self, folder, job_id: str, tasks=(0,), pid_start: Optional[float] = None, server=None) -> None:
        super().__init__(folder, job_id, tasks)
        self._pid_start = pid_start
        self._server = server

    def _running(self) -> bool:
        from workbench.cluster.procs import START_TOLERANCE_S, start_time

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

    def get_info(self, mode: str = "force") -> dict:  # noqa: ARG002
        if self._running():
            return {"jobState": "RUNNING"}
        return {"jobState": "FINISHED" if self.paths.result_pickle.exists() else "INTERRUPTED"}

    @property
    def state(self) -> str:
        return self.get_info()["jobState"]

    def cancel(self, check: bool = True) -> None:  # noqa: ARG002
        """SIGINT, then SIGKILL after 1 s (the server escalates; without it, SIGKILL at once)."""
        if not self._running():
            return
        if self._server is None or not self._server.cancel(int(self.job_id)):
            _signal(int(self.job_id), signal.SIGKILL)

    def __getstate__(self) -> dict:
        out = dict(self.__dict__)
        out["_server"] = None
        return out


class ForkExecutor(core.PicklingExecutor):
    """submitit's ``LocalExecutor``, with each task forked from a :class:`ForkServer`.

    Same folder layout, pickles and logs; the job environment inside is submitit's
    ``local`` one, so a trainer cannot tell the difference but for its parent.
    """

    job_class = ForkJob

    def __init__(self, folder, server: ForkServer, max_num_timeout: int = 3) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.server = server
        self._throttling = 0.0  # submitit's 0.2 s between submissions protects a scheduler; there is none here
        utils.JobPaths.get_first_id_independent_folder(self.folder).mkdir(parents=True, exist_ok=True)

    @classmethod
    def _valid_parameters(cls) -> set:
        return {"timeout_min", "tasks_per_node"}

    def _submit_command(self, command: str) -> ForkJob:  # noqa: ARG002
        env = dict(os.environ)
        env.update(
            SUBMITIT_LOCAL_NTASKS="1",
            SUBMITIT_LOCAL_NODEID="0",
            SUBMITIT_LOCAL_JOB_NUM_NODES="1",
            SUBMITIT_STDERR_TO_STDOUT="",
            SUBMITIT_EXECUTOR="local",
            CUDA_VISIBLE_DEVICES="",
            SUBMITIT_LOCAL_WITH_SHELL="",
            SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * self.parameters.get("timeout_min", 2.0))),
            SUBMITIT_LOCAL_SIGNAL_DELAY_S="30",
        )
        pid, pid_start = self.server.fork(self.folder, env)
        return ForkJob(self.folder, str(pid), tasks=[0], pid_start=pid_start, server=self.server)

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return ""

    @staticmethod
    def _get_job_id_from_submission_command(string) -> str:
        return "0"

    def _make_submission_command(self, submission_file_path: Path) -> list:
        return []


if __name__ == "__main__":
    serve(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
