"""The one-timeout rule for a collective (``workbench.trainers.torchft.collective_failure.pg_timeout_only``), with
torchft's own ``future_timeout`` and torch futures, in a fresh interpreter (torchft's timer thread stays there).

The script ends with ``os._exit``, as the workbench's trainers do. Left to the interpreter's own exit it aborted in
14 of 40 runs here (``terminate called without an active exception``, exit -6; 3 of 20 with torchft and torch alone,
no workbench code): torchft's TimeoutManager fails the timed future on its daemon thread, whose
``PythonFutureWrapper::markCompleted`` (torch) retakes the GIL after the main thread has finalized; CPython 3.11
ends such a thread with ``pthread_exit``, whose unwind through torch's C++ frame calls ``std::terminate`` (gdb).
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, sys
from datetime import timedelta
import torch, torchft.manager
from workbench.trainers.torchft import collective_failure

collective_failure.pg_timeout_only(timedelta(seconds=1))
longer = torch.futures.Future()
print("longer", torchft.manager.future_timeout(longer, timedelta(seconds=30)) is longer)
shorter = torch.futures.Future()
timed = torchft.manager.future_timeout(shorter, timedelta(milliseconds=200))
print("shorter", timed is shorter)
try:
    timed.wait()
except Exception as e:
    print("failed", type(e).__name__, str(e).splitlines()[0])
sys.stdout.flush()
os._exit(0)
"""


def test_torchft_arms_no_timer_on_a_collective_its_process_group_times_out_first():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # The Manager's 30 s against a 1 s process group: the future is passed through, no timer is armed.
    assert lines[0] == "longer True"
    # A Manager timeout shorter than the process group's is torchft's timer as before: it fails the future.
    assert lines[1] == "shorter False"
    assert lines[2].startswith("failed TimeoutError") and "did not complete within 0:00:00.200000" in lines[2], lines
