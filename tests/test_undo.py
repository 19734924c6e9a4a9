"""The detached helper that undoes a timed fault and records its ``resume``."""

import os
import signal
import subprocess
import sys
import time

import psutil

from workbench.cluster.procs import HOST, Marker, Proc, start_time
from workbench.events import reader as events
from workbench.faults import undo
from workbench.run import rundir


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_the_resume_is_recorded_at_the_undo_without_importing_the_package_api(tmp_path):
    """A live check reads the log, so the ``resume`` has to land when the fault is undone, not after
    the package's API is imported (pandas: seconds on a busy host, in which a group whose partition
    had ended committed 24 steps that the network-faults notebook's live check counted as cut off).

    Test double: a ``pandas`` that fails to import stands in for an import too slow to wait on; the
    helper that imported the API after the undo never recorded it under this stand-in.
    """
    run_dir = rundir.create(tmp_path / "runs", "20250101-000000-undo-abcdef", {"replicas": 1})
    stand_in = tmp_path / "stand_in"
    stand_in.mkdir()
    (stand_in / "pandas.py").write_text("raise ImportError('stand-in for a slow import')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stand_in), os.environ.get("PYTHONPATH", "")])}

    marker = Marker.of(run_dir)
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **marker.env()}
    )
    helper = None
    try:
        os.kill(victim.pid, signal.SIGSTOP)
        assert _wait(lambda: psutil.Process(victim.pid).status() == psutil.STATUS_STOPPED, 10)
        until = time.time() + 1.0
        helper = undo.later(
            run_dir,
            "hang",
            1.0,
            env=env,
            fields={"target": 0},
            signals=[[victim.pid, HOST, start_time(victim.pid), int(signal.SIGCONT)]],
        )

        def resumes():
            return [e for e in events.read_all(run_dir) if e.get("action") == "resume"]

        (resume,) = _wait(resumes, 30)
        assert resume["resumed"] == "hang" and resume["target"] == 0 and resume["t"] >= until
        assert psutil.Process(victim.pid).status() != psutil.STATUS_STOPPED
    finally:
        victim.kill()
        victim.wait()
        if helper is not None:
            Proc(*helper).signal(signal.SIGKILL, marker)
