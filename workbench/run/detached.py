"""Controllers that outlive the kernel: start one detached, stop one with a fallback.

A run controller (``python -m workbench.controller.loop RUN_DIR``) and a sweep
controller (``python -m workbench.experiments.sweep SWEEP_DIR``) are started the same way:
in a session of their own, so that the kernel's death (or a Ctrl-C in it) does
not reach them, with their stdout and stderr appended to a log file in the
directory they work on, and with this checkout first on ``PYTHONPATH``, so the
controller runs the same ``workbench`` as the kernel that started it, installed
or not, and with the directory's process marker in their environment
(``workbench.cluster.procs.Marker``), which everything they start inherits and
which proves each of those processes the run's before it is signalled. Nothing
else ties them to the kernel: every kernel finds a controller through the PID
it records in its event log.

Stopping one is a request, then force: SIGTERM (a controller stops what it
started and writes its end event), wait until the caller sees the end it
expects, SIGKILL when that does not come in time; neither unless the
controller proves it is the directory's (its marker). What to do once a controller
had to be killed (stop its jobs directly, record the end) is the caller's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from workbench.cluster.procs import Marker, Proc
from workbench.paths import CHECKOUT


def spawn(module: str, args: list[str], log_path: Path, marker: Marker) -> subprocess.Popen:
    """Start ``python -m module *args`` in its own session, appending its output to ``log_path`` (mode 0600),
    with ``marker`` in its environment.

    The Popen is only for reaping the process when it exits while the caller
    lives (``proc.poll()``); the process does not depend on it.
    """
    env = {**os.environ, **marker.env()}
    env["PYTHONPATH"] = str(CHECKOUT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


def stop(proc: Proc, marker: Optional[Marker], ended: Callable[[], bool], timeout: float, poll: float = 0.2) -> bool:
    """SIGTERM ``proc``, then poll ``ended()`` for up to ``timeout`` s; SIGKILL it if it never held.

    Each signal goes only to the recorded process (its start time checked) proven the directory's by
    ``marker`` (``workbench.cluster.procs``). True when ``ended()`` held in time. A process already gone,
    or one not proven, gets no wait: the answer is ``ended()`` at once.
    """
    if not proc.signal(signal.SIGTERM, marker):
        return ended()
    deadline = time.monotonic() + timeout
    while not ended():
        if time.monotonic() > deadline:
            proc.signal(signal.SIGKILL, marker)
            return False
        time.sleep(poll)
    return True
