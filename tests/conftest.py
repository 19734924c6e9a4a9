"""Shared fixtures. Every process a test starts is stopped by PID in a finalizer."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def kill_pids(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def run_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "runs"
    monkeypatch.setenv("WORKBENCH_RUN_ROOT", str(root))
    return root


@pytest.fixture
def start_run(run_root):
    """Submit runs through the public API; stop them, and kill anything they left, by PID."""
    import workbench as wb

    runs = []

    def _start(config="demo", overrides=None, **kw):
        run = wb.submit(config, overrides, **kw)
        runs.append(run)
        return run

    yield _start
    for run in runs:
        try:
            run.stop(timeout=20)
        finally:
            kill_pids(run.pids())
            if run._controller is not None and run._controller.poll() is None:
                run._controller.kill()
                run._controller.wait()


def workbench_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, cwd=REPO,
    )


@contextlib.contextmanager
def local_slurm(state_dir: Path):
    """The real local Slurm (workbench.devcluster) for one test module; down, and every
    daemon it started killed by PID, also on failure."""
    import psutil

    from workbench import devcluster

    env = pytest.MonkeyPatch()
    try:
        info = devcluster.up(state_dir)
        env.setenv("SLURM_CONF", info["env"]["SLURM_CONF"])
        yield info
    finally:
        env.undo()
        daemons = []
        for pid in devcluster.daemon_pids(state_dir).values():
            with contextlib.suppress(psutil.NoSuchProcess):
                daemons.append(psutil.Process(pid))
        try:
            devcluster.down(state_dir)
        finally:
            for proc in daemons:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        proc.kill()
