"""A run whose run root stops taking writes ends, and says why (#42 item 3).

The run root is a small tmpfs the test mounts (root only), and a file fills it while a run trains.
The controller's event log then takes nothing; past the spec's ``unwritable_timeout_s`` the controller
stops every group and ends the run ``failed``, ``run_root_unwritable``, with from when and why. Once
the disk has room while it is still trying, that ``run_end`` is in the log; if the disk never has room,
the controller exits non-zero and its trace (``run_end.unwritten``, a name, which a full disk takes)
lets ``Run.controller_gone`` and ``workbench status`` say why the run is lost, also after the disk is
freed. Before (3aa52e1) the controller's writer stopped for good at its first error and nothing
watched it: the run trained on, unrecorded, with no end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import workbench as wb
from workbench.cluster.procs import alive
from workbench.faults.inject import control_writer
from workbench.run import unwritten_end

from .conftest import kill_pids, workbench_cli

BOUND_S = 5.0  # the spec's unwritable_timeout_s for these runs
# Until the controller's own writes fail: a full tmpfs still takes appends into the last page (4 KiB) a file
# already has, which the controller's node_health (a line of ~250 bytes every 2 s) fills in at most ~35 s.
NOTICE_S = 45.0
# From the decision to run_end: the shutdown SIGTERMs every group and waits up to 10 s, SIGKILLs what is left,
# stops the lighthouse and the fork server (up to 5 s); room for a loaded two-core machine on top.
SHUTDOWN_S = 30.0
SPEC = {
    "steps": 20_000,  # never reached: about 1000 s at step_delay_s
    "replicas": 2,
    "faults": [],
    "model.step_delay_s": 0.05,
    "unwritable_timeout_s": BOUND_S,
}


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


@pytest.fixture
def small_run_root(run_root):
    """The run root on a 32 MiB tmpfs; unmounted at the end, after every process using it is stopped by PID."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs as the run root needs root")
    run_root.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", str(run_root)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs as the run root: {done.stderr.strip()}")
    try:
        yield run_root
    finally:
        left = _users_of(run_root)  # start_run's teardown stopped the runs; this is what they left, if any
        kill_pids(p.pid for p in left)
        psutil.wait_procs(left, timeout=10)
        for run_dir in run_root.iterdir():  # the stop of a lost run wrote its run_end through this process's writer
            if (run_dir / "run.json").exists():
                control_writer(run_dir).close()
        if subprocess.run(["umount", str(run_root)]).returncode != 0:
            subprocess.run(["umount", "-l", str(run_root)])
            pytest.fail(f"{run_root} was still in use at the end; unmounted lazily")


def _users_of(root: Path) -> list[psutil.Process]:
    """The processes (not this one) with their cwd or an open file under ``root``."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.pid != os.getpid() and (
                p.cwd().startswith(str(root)) or any(f.path.startswith(str(root)) for f in p.open_files())
            ):
                found.append(p)
    return found


def _fill(root: Path) -> Path:
    """A file that takes every free block of ``root``'s file system."""
    path = root / "filler"
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return path


def _training(run) -> list:
    """The groups' current processes, once each has committed a few steps."""
    run.wait_for_step(5, timeout=180)
    procs = [v.live_proc() for v in run.run_state.replicas.values()]
    assert all(p is not None and alive(p.pid) for p in procs), run.status()
    return procs


@pytest.mark.slow
def test_a_run_root_that_stays_full_ends_the_run_and_the_end_says_why_once_there_is_room(small_run_root, start_run):
    run = start_run("demo", SPEC)
    procs = _training(run)
    t_full = time.time()
    filler = _fill(small_run_root)
    trace = run.run_dir / unwritten_end.NAME
    try:
        # The controller stops the groups, fails to write its run_end, leaves its trace and keeps trying.
        _wait(trace.is_symlink, NOTICE_S + BOUND_S + SHUTDOWN_S, "the controller's trace of an unwritten run_end")
        assert not any(alive(p.pid) for p in procs)
        assert run._controller.poll() is None
    finally:
        filler.unlink()  # room again while the controller still tries its run_end
    run.wait_for(lambda r: r.run_state.run_end is not None, timeout=BOUND_S + SHUTDOWN_S)
    assert run._controller.wait(timeout=SHUTDOWN_S) == 1

    end = run.run_state.run_end
    assert (end["state"], end["reason"]) == ("failed", "run_root_unwritable"), end
    assert end["since"] >= t_full and "No space left on device" in end["error"], end
    assert end["t"] - end["since"] <= BOUND_S + SHUTDOWN_S, end  # ended within the bound (plus the shutdown)
    assert end["steps"] < SPEC["steps"]
    assert run.state() == "failed"
    reason = run.status()["reason"]
    assert reason.startswith("run_root_unwritable: the run root took no write from ") and "No space left" in reason
    # The controller's log says the gap: what it could not write at the time is in it now, late.
    gaps = [e for e in run.event_records() if e["kind"] == "write_gap" and e["pid"] == end["pid"]]
    assert gaps and gaps[0]["since"] == end["since"], gaps
    assert not trace.is_symlink()  # its run_end went in: the trace is gone
    out = workbench_cli("status", str(run.run_dir))
    assert "ended: run_root_unwritable: the run root took no write from" in out.stdout, out


@pytest.mark.slow
def test_a_run_root_that_never_takes_a_write_again_leaves_the_end_where_status_finds_it(small_run_root, start_run):
    run = start_run("demo", SPEC)
    procs = _training(run)
    filler = _fill(small_run_root)
    try:
        # The controller stops the groups, tries its run_end for as long again, and exits non-zero.
        assert run._controller.wait(timeout=NOTICE_S + 2 * BOUND_S + SHUTDOWN_S) == 1
        assert not any(alive(p.pid) for p in procs)
        run.refresh()
        assert run.run_state.run_end is None  # nothing of the end is in the log
        attached = wb.attach(run.run_dir)  # what `workbench status` and a new kernel see
        assert attached.state() == "lost"
        gone = attached.controller_gone()
        assert "it ended the run failed (run_root_unwritable) but could not write run_end" in gone, gone
        assert "ENOSPC: No space left on device" in gone, gone
    finally:
        filler.unlink()
    # Room again, the controller gone: the trace still says what happened.
    out = workbench_cli("status", str(run.run_dir))
    assert "it ended the run failed (run_root_unwritable) but could not write run_end" in out.stdout, out


def test_the_trace_says_the_end_in_a_name_short_enough_for_the_inode(tmp_path):
    """The trace's target fits ext4's inline symlink (59 bytes), so a full disk takes it; the reader words it."""
    since = time.time()
    assert unwritten_end.leave(tmp_path, "failed", "run_root_unwritable", since, "OSError: [Errno 28] No space left")
    assert len(os.readlink(tmp_path / unwritten_end.NAME)) <= unwritten_end.MAX_TARGET
    said = unwritten_end.read(tmp_path)
    assert said == (
        "it ended the run failed (run_root_unwritable) but could not write run_end: the run root took no write from "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(int(since)))} (ENOSPC: No space left on device)"
    )
    assert unwritten_end.leave(tmp_path, "stopped", "stop requested", since, "OSError: [Errno 122] Disk quota exceeded")
    assert unwritten_end.read(tmp_path).startswith("it ended the run stopped but could not write run_end: ")
    assert "EDQUOT: Disk quota exceeded" in unwritten_end.read(tmp_path)
    unwritten_end.clear(tmp_path)
    assert unwritten_end.read(tmp_path) is None
