"""Shared fixtures. Every process a test starts is stopped by PID in a finalizer."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


IN_CI = os.environ.get("CI") == "true"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true`` a skip is a failure: a missing prerequisite (MaxText's environment,
    Slurm, chromium) must not let the suite pass green with part of it not run. A test that can
    only run on hardware CI does not have says so with ``@pytest.mark.needs_hardware``."""
    outcome = yield
    report = outcome.get_result()
    if (
        IN_CI
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("needs_hardware") is None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every prerequisite must be present: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a skip while collecting: ``pytest.importorskip`` (or ``pytest.skip(allow_module_level=
    True)``) at a module's top skips the whole module before any of its tests exists, so the hook above never
    sees it; under ``CI=true`` the module's collection fails instead, naming what was missing. Changed here,
    where the report is made, so that every ``pytest_collectreport`` (the terminal's summary, the session's
    failure count) already sees a failure."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and collector.get_closest_marker("needs_hardware") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.nodeid}: skipped under CI=true, where every prerequisite must be present: {reason}"
        )


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
        [sys.executable, "-m", "workbench.apps.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


@contextlib.contextmanager
def local_slurm(state_dir: Path, **up_kwargs):
    """The real local Slurm (workbench.devcluster) for one test module; down, and every
    daemon it started killed by PID, also on failure. ``up_kwargs`` go to ``devcluster.up``."""
    import psutil

    from workbench import devcluster

    env = pytest.MonkeyPatch()
    try:
        info = devcluster.up(state_dir, **up_kwargs)
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
            _, left = psutil.wait_procs(
                _processes_of(state_dir), timeout=10
            )  # a job's slurmstepd may still be on its way out
            kill_pids(p.pid for p in left)
        if left:  # down missed them (a CI run once left a whole cluster, and every cluster test after it failed)
            pytest.fail(
                f"the dev cluster in {state_dir} left running: " + ", ".join(f"{p.pid} {p.info['name']}" for p in left)
            )


def committed_before(ckpt_dir: Path, t: float) -> list[int]:
    """MaxText steps whose checkpoint Orbax had committed (its ``_CHECKPOINT_METADATA``) before ``t``."""
    from workbench.trainers.maxtext.output import durable_checkpoints

    steps = []
    for step, path in durable_checkpoints(ckpt_dir).items():
        meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
        if meta.get("commit_timestamp_nsecs") and meta["commit_timestamp_nsecs"] / 1e9 < t:
            steps.append(step)
    return steps


def _processes_of(state_dir: Path) -> list:
    """Live processes whose command line or environment names ``state_dir`` (every dev cluster daemon does)."""
    import psutil

    mark, found = str(state_dir), []
    for p in psutil.process_iter(["name", "cmdline", "environ", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
            continue
        if any(mark in a for a in p.info["cmdline"] or ()) or any(
            mark in v for v in (p.info["environ"] or {}).values()
        ):
            found.append(p)
    return found


def tcp_listeners(pids, nodes=()) -> list[tuple[str, str, int, str]]:
    """(where, address, port, process) of every TCP listener of ``pids`` and their children, on this host's
    network stack (where ``"head"``) and in the namespace of every dev cluster node in ``nodes`` (where its name)."""
    import psutil

    from workbench.devcluster import netns

    pids = set(pids)
    for pid in list(pids):
        try:
            pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    head = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=20, check=True).stdout
    stacks = {"head": netns.parse_ss(head.splitlines()), **{name: netns.listeners(name) for name in nodes}}
    return [
        (where, host, port, proc)
        for where, found in stacks.items()
        for host, port, proc in found
        if any(f"pid={pid}," in proc for pid in pids)
    ]


def slurmd_pids(info) -> dict[str, int]:
    """``info`` (``up()``'s result): node -> PID of its running slurmd (current: a test may have restarted one)."""
    from workbench import devcluster

    return {n: devcluster.slurmd_pid(info["slurm_conf"], n) for n in devcluster.NODES}


def assert_slurmds_listen_on_their_nodes(listeners, info) -> None:
    """Each slurmd listens at its port on its node's address (its NodeAddr) only, where that node's stack is."""
    network = info["network"]
    for node, pid in slurmd_pids(info).items():
        where = node if network["mode"] == "netns" else "head"
        found = {tuple(lst[:3]) for lst in listeners if f"pid={pid}," in lst[3]}
        assert found == {(where, network["nodes"][node], info["ports"][f"slurmd-{node}"])}, (node, found)


def slurm_prerequisites() -> list:
    """The marks of a module that runs on the local Slurm: Debian's slurm-wlm installed, and root (the dev
    cluster's slurmd runs jobs as root)."""
    import shutil

    from workbench import devcluster

    return [
        pytest.mark.skipif(
            any(shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}") for p in devcluster.REQUIRED_PROGRAMS),
            reason=f"Slurm is not installed; {devcluster.INSTALL_HINT}",
        ),
        pytest.mark.skipif(os.geteuid() != 0, reason="the dev cluster's slurmd runs jobs as root"),
    ]


def slurm_submitter(slurm_conf: str, config: str, stop_timeout: float):
    """A generator for a fixture: yields ``submit(overrides)`` (``wb.submit(config, overrides)``), then stops
    each run and removes what it left, by PID and job id, also on failure."""
    import workbench as wb
    from workbench.cluster.slurm import backend as slurm

    runs = []

    def _submit(overrides):
        run = wb.submit(config, overrides)
        runs.append(run)
        return run

    yield _submit
    for run in runs:
        try:
            run.stop(timeout=stop_timeout)
        finally:
            kill_pids(run.pids())
            job_ids = [str(e["job_id"]) for e in run.events_read if e["kind"] == "submit"]
            if job_ids:
                slurm.slurm_cmd(slurm_conf, "scancel", *job_ids)
                wait_until_dequeued(slurm_conf, job_ids)
            if run._controller is not None and run._controller.poll() is None:
                run._controller.kill()
                run._controller.wait()


def wait_until_dequeued(slurm_conf: str, job_ids: list[str], timeout: float = 60.0) -> None:
    """Wait until slurmctld lists none of ``job_ids`` (a cancelled job stays ``COMPLETING`` until its node's
    slurmd has ended its processes: a CI run's next test found one there); fail naming those still listed."""
    from workbench.cluster.slurm import backend as slurm

    deadline = time.monotonic() + timeout
    while listed := slurm.slurm_cmd(slurm_conf, "squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T").stdout.strip():
        if time.monotonic() > deadline:
            pytest.fail(f"Slurm jobs still queued {timeout:.0f} s after scancel: {listed}")
        time.sleep(0.2)
