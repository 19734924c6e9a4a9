"""Child processes forked from a warm job, instead of a fresh interpreter: a TorchTitan rank started warm.

Why: a TorchTitan rank started as ``python -m workbench.trainers.titan.rank``
imports torch, its CPU patches and torchtitan before it can parse its config:
8.2 s of the 13.1 s from a kill to the replacement taking part (one node, one
rank per group, measured on this machine's two cores), and twice that with
two ranks importing at once. The local fork server (``cluster/local/forkserver.py``)
has imported all of it before it forks the job (the trainer's ``warm_up``), so
a rank forked from the job inherits it: its imports take milliseconds.

The protocol (:func:`fork_waiting`, then :meth:`WaitingChild.release`): the
job forks each rank *before* it builds anything a child must not inherit (the
group's TCPStore listener, the stderr-copying threads, the loopback patch), so
the checks of :func:`fork_safety` hold at every fork; the child is born holding
the stop signals (blocked across the fork: a SIGTERM meanwhile stays pending, as
it does for an exec'd rank, until the rank has its handler and releases them),
sets ``PR_SET_PDEATHSIG`` and waits on a pipe for its environment, which the
job writes once the store's port is known. Then the child becomes the rank:
its stdin is ``/dev/null``, its stderr a pipe the job copies
(:mod:`.process_group`), every other inherited descriptor closed, the
environment replaced, the RNGs reseeded from the OS as a fresh interpreter's are;
it runs ``target(*args)`` and never returns (:func:`run_child`).

Where the job is not warm (the Slurm path: submitit's fresh interpreter has
not imported torchtitan) or not fork-safe, the job execs its ranks as before.

What must not exist at a fork (:func:`fork_safety`, also the fork server's
check): another thread (only the forking thread survives in the child; a lock
another thread held stays locked forever), an initialised CUDA/ROCm context
("Cannot re-initialize CUDA in forked subprocess"), an open socket (the child
would hold the port).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Optional

import psutil

from workbench.trainers.kit import STOP_SIGNALS, die_with_parent

QUIET_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
"""The environment under which the imports a fork inherits start no thread: numpy's OpenBLAS pool and
pyarrow's jemalloc background thread would otherwise start at import (the fork server's, and a TorchTitan
spare's on Slurm)."""


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import under :data:`QUIET_ENV` (where the environment does not set those already), then give the
    environment back: the libraries read it when they load, and the children get the environment as it was."""
    added = {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def fork_safety() -> Optional[str]:
    """None if this process may fork a child that goes on running Python; else what makes it unsafe."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in threads)
        return f"{len(threads)} threads ({', '.join(names)})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised"
    conns = psutil.Process().net_connections(kind="all")
    if conns:
        return f"{len(conns)} open sockets"
    return None


def reseed() -> None:
    """A fresh interpreter's RNG state: ``random``, numpy's global state and torch's default generator."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


class ForkedProcess:
    """The part of ``subprocess.Popen`` a :class:`~.process_group.ProcessGroup` uses, for a forked child."""

    def __init__(self, pid: int, stderr) -> None:
        self.pid, self.stderr = pid, stderr
        self.returncode: Optional[int] = None
        self._reaper = threading.Lock()
        self._done = threading.Event()

    def wait(self) -> int:
        if self._reaper.acquire(blocking=False):  # one thread reaps; any other waits for it
            try:
                if self.returncode is None:
                    _, status = os.waitpid(self.pid, 0)
                    self.returncode = os.waitstatus_to_exitcode(status)
                    self._done.set()
            finally:
                self._reaper.release()
        self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> Optional[int]:
        return self.returncode  # until reaped it is a zombie at most: its PID is not reused, a kill is harmless

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class WaitingChild:
    """A child forked by :func:`fork_waiting`, blocked until :meth:`release` sends its environment."""

    def __init__(self, pid: int, control: int, stderr: int) -> None:
        self.pid, self._control, self._stderr = pid, control, stderr

    def release(self, env: dict[str, str]) -> ForkedProcess:
        """Send the child its environment: from now on it runs as a rank."""
        with os.fdopen(self._control, "wb") as f:
            f.write(json.dumps(env).encode())
        return ForkedProcess(self.pid, os.fdopen(self._stderr, "rb"))

    def abandon(self) -> None:
        """The job will not use it (it failed before the release): end it."""
        os.close(self._control)  # an empty read: the child leaves
        os.close(self._stderr)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def fork_waiting(target: Callable[..., Any], *args: Any) -> WaitingChild:
    """Fork a child that waits for its environment and then runs ``target(*args)`` (see the module docstring)."""
    control_r, control_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the child is born holding them
    pid = os.fork()
    if pid == 0:
        run_child(functools.partial(_become_rank, parent, control_r, stderr_w, target, args))
    signal.pthread_sigmask(signal.SIG_SETMASK, held)
    os.close(control_r)
    os.close(stderr_w)
    return WaitingChild(pid, control_w, stderr_r)


def _become_rank(parent: int, control: int, stderr: int, target: Callable[..., Any], args: tuple) -> None:
    """In the forked child: wait for the environment, become the rank, run ``target(*args)``."""
    for sig in (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(parent)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stderr, 2)
    os.close(stderr)
    os.closerange(3, control)  # the job's event file, pipes, the other ranks' pipes: all but ``control``
    os.closerange(control + 1, 1 << 20)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # whatever the job had made of them: fds 1, 2
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
    chunks = []
    while chunk := os.read(control, 1 << 16):
        chunks.append(chunk)
    os.close(control)
    if not chunks:
        return  # abandoned
    os.environ.clear()
    os.environ.update(json.loads(b"".join(chunks)))
    reseed()
    target(*args)


def run_child(body: Callable[[], Any]) -> NoReturn:
    """In a forked child: run ``body`` (its set-up, then its work) and end the process with the exit code a
    fresh interpreter would end with; never return into the parent's code after the fork.

    The code: 0 when ``body`` returns; a ``SystemExit``'s code (None: 0; not an int: printed on stderr,
    then 1, as Python does); a ``KeyboardInterrupt`` (SIGINT: the fork server's cancel, a ^C) its traceback
    and 130, the shell's 128 + SIGINT (a fresh interpreter kills itself with SIGINT instead, so its wait
    status is the signal); any other exception its traceback and 1. Then stdout and stderr are flushed and
    the process leaves by ``os._exit``: no interpreter teardown and no ``atexit`` handler (those registered
    before the fork are the parent's).

    Both of the workbench's forks end this way: a rank forked warm from its TorchTitan job
    (:func:`fork_waiting`) and a job forked from the local fork server (``cluster/local/forkserver.py``).
    A third copy, which cannot import the workbench (it runs in ``.venv-maxtext``), is MaxText's standby
    child (``trainers/maxtext/launcher.py`` ``_child``): it runs the ``atexit`` handlers before it leaves,
    and has no ``KeyboardInterrupt`` branch and no message for a ``SystemExit`` that is not an int.
    """
    code = 1
    try:
        body()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)
