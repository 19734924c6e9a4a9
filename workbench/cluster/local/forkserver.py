"""The fork server: a process that has imported torch, torchft and the trainer, and forks each local job.

Why: a replica group started the submitit way is ``python -m submitit.local._local``
(one interpreter) which starts ``python -m submitit.core._submit`` (a second one)
which imports workbench, torch and torchft before the trainer runs: about 2.5 s of
imports per attempt on this machine (``import torch`` 1.5 s, torchft 0.2 s,
workbench + pandas 1.2 s, measured with ``-X importtime``), and N of them at once at
submit on two cores. A fork of a process that has them imported costs milliseconds.

The protocol. One fork server per run (started by the controller through
:class:`~workbench.cluster.local.forkexecutor.ForkServer`, not per host: it imports
exactly the run's trainer, inherits the controller's environment, and ends with its
controller, so there is no daemon, no shared socket to authenticate and nothing to
clean up between runs). The server is ``python -m workbench.cluster.local.forkserver
TRAINER [MODEL_JSON]`` (this module); it reads one JSON request a line on stdin and
answers one JSON line on stdout:

- first, unasked: ``{"ready": R, "imported_s": S, "why": W}``, once its imports are
  done (``ready`` false: it is not fork-safe, ``why`` says what, and it exits);
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
``ForkJob.done`` reads ``/proc``. It writes each reaped child's wait status next to the
child's logs (``workbench.cluster.exits.status_path``; it alone writes that file), which
``ForkJob.exit_status`` reads: an uncaught exception in the child is exit code 1 (its
traceback in the stderr log), a ``KeyboardInterrupt`` (the cancel's SIGINT) 130, a signal
is the signal (``workbench.trainers.forked.run_child``, which ends a TorchTitan rank
forked warm the same way). The child stays in the server's process
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
background thread (``JE_ARROW_MALLOC_CONF=background_thread:false``): ``forked.QUIET_ENV``;
the child gets the controller's environment back (``env`` of the request), which
only affects libraries initialised after the fork.

RNG state: a child starts as a fresh interpreter would: ``random``, numpy's global
state and torch's default generator are each reseeded from the OS (``torch.seed()``;
a new process's ``torch.initial_seed()`` differs from run to run with this torch,
measured). So two groups never share RNG state, and a trainer that seeds from the
spec (all of them: ``torch.manual_seed(spec.seed)``, batches from ``(seed, step,
replica)``) computes exactly what it computes on submitit's path.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import select
import signal
import sys
import time
from typing import BinaryIO, Optional

from submitit.core import utils

from workbench.cluster import exits
from workbench.cluster.procs import start_time
from workbench.trainers.forked import fork_safety, reseed, run_child

CANCEL_GRACE_S = 1.0  # submitit's local controller: SIGINT, then SIGKILL after 1 s
REAP_S = 0.02
PICKLE_WAIT_S = 60.0  # process_job's own wait for the submitted pickle


def preload(trainer: str, model: Optional[dict] = None) -> float:
    """Import what every attempt of ``trainer`` imports, and run its ``TrainerKind.warm_up`` (torchft-lite's
    first AdamW step imports ``torch._dynamo``, ``torch._inductor`` and sympy, 2.1 s measured, which a fork then
    inherits); the seconds it took. The trainer runs with ``torch.set_num_threads(1)``, which the server sets
    first so that the warm-up starts no thread.

    The imports are the point of the server, and timed (``imported_s``), so they are made here, not at the
    top of this module."""
    t0 = time.perf_counter()
    import numpy  # noqa: F401  (process_job imports it first, "to avoid unexpected interactions")
    import torch

    from workbench.trainers import trainer_kind

    kind = trainer_kind(trainer)
    if kind.elastic:
        import torchft  # noqa: F401
    importlib.import_module(kind.module)
    if kind.warm_up and model:
        module, _, function = kind.warm_up.partition(":")
        torch.set_num_threads(1)
        getattr(importlib.import_module(module), function)(model)
    return time.perf_counter() - t0


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
                    run_child(functools.partial(_job, req["folder"], req["env"]))
                _CHILDREN[pid] = (req["folder"], start_time(pid))
                _answer(answers, {"pid": pid, "pid_start": _CHILDREN[pid][1]})
            elif req["op"] == "cancel":
                pid = int(req["pid"])
                if pid in _CHILDREN:
                    _signal(pid, signal.SIGINT)
                    cancels.setdefault(pid, time.monotonic() + CANCEL_GRACE_S)
                _answer(answers, {})


def _job(folder: str, env: dict) -> None:
    """In the forked child: become a fresh job process and run submitit's task (ended by ``run_child``)."""
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
    reseed()
    deadline = time.monotonic() + PICKLE_WAIT_S
    while not paths.submitted_pickle.exists() and time.monotonic() < deadline:
        time.sleep(0.002)  # the executor moves the pickle in place right after the fork's answer
    # submitit's job runner imports numpy, which the server imports in ``preload`` (timed there)
    from submitit.core.submission import process_job

    process_job(folder)


# Forked and not yet reaped (the only PIDs a cancel may signal): their job folder and start time.
_CHILDREN: dict[int, tuple[str, Optional[float]]] = {}


def _answer(stream: BinaryIO, obj: dict) -> None:
    stream.write(json.dumps(obj).encode() + b"\n")
    stream.flush()


def _reap(cancels: dict[int, float]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            folder, pid_start = child
            path = exits.status_path(utils.JobPaths(folder, str(pid), 0).folder, str(pid))
            exits.write_status(path, pid, pid_start, os.waitstatus_to_exitcode(status))
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


if __name__ == "__main__":
    serve(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
