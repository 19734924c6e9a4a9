"""What ended an attempt's process, in the controller's ``job`` event (issue #41): real runs, real deaths.

A group's trainer is signalled from outside, by the PID the fold names, as a crash or a kill from
elsewhere would: nothing the workbench injects (no ``fault`` event). The ``job`` event must say the
signal (or the exit code), the attempt's last step, the job's last lines and log files, and the group
is relaunched as usual. The kernel's OOM killer cannot be made to fire safely here (the cgroup v1 memory
controller takes a limit but charges nothing), so its evidence is a test double: the test writes the
line the OOM killer logs, in its real format, into the real kernel log (``/dev/kmsg``, as root) for the
PID it then SIGKILLs.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from pathlib import Path

import pytest

from workbench.cluster.local import submitit_local
from workbench.cluster.local.forkexecutor import ForkExecutor, ForkServer
from workbench.trainers import raise_hook

from .conftest import IN_CI, kill_pids, local_slurm, slurm_prerequisites, slurm_submitter

pytestmark = pytest.mark.slow

BASE = ["steps=100000", "faults=[]", "replicas=2", "min_replicas=1", "model.step_delay_s=0.05"]


def _live_pid(run, replica: int, attempt: int) -> int:
    """The group's process for ``attempt``, from the fold, once that attempt has committed steps."""
    run.wait_for(
        lambda r: any(
            e["kind"] == "step" and e.get("replica") == replica and e.get("attempt") == attempt and e.get("committed")
            for e in r.events_read
        ),
        timeout=240,
    )
    proc = run.run_state.replicas[replica].live_proc(attempt)
    assert proc is not None, run.run_state.replicas[replica]
    return proc.pid


def _job_event(run, replica: int, attempt: int, timeout: float = 60) -> dict:
    def ended(r) -> bool:
        return any(e["kind"] == "job" and e["replica"] == replica and e["attempt"] == attempt for e in r.events_read)

    run.wait_for(ended, timeout=timeout, poll=0.05)
    return next(
        e for e in run.events_read if e["kind"] == "job" and e["replica"] == replica and e["attempt"] == attempt
    )


def _kill(run, replica: int, attempt: int, sig: int, delays: list, before=None) -> dict:
    """Signal the attempt's process; its ``job`` event. Appends the time from the signal to it to ``delays``."""
    pid = _live_pid(run, replica, attempt)
    if before is not None:
        before(pid)
    t_kill = time.time()
    os.kill(pid, sig)
    job = _job_event(run, replica, attempt)
    delays.append(round(job["t"] - t_kill, 3))
    return job


def _report(where: str, delays: list) -> None:
    print(f"\n{where}: death -> job event {delays} s, median {statistics.median(delays):.3f} s")


def _last_step(run, replica: int, attempt: int) -> int:
    return max(
        e["step"]
        for e in run.events_read
        if e["kind"] == "step" and e.get("replica") == replica and e.get("attempt") == attempt
    )


def oom_killer_test_double(pid: int) -> None:
    """Test double of the kernel's OOM killer's message: its two lines, in the kernel's format, for ``pid``."""
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(
            f"<3>Out of memory: Killed process {pid} (python) total-vm:2162044kB, anon-rss:1048576kB, "
            "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:2460kB oom_score_adj:0\n"
        )
        kmsg.flush()
        kmsg.write(
            f"<6>oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
            f"task_memcg=/,task=python,pid={pid},uid=0\n"
        )


def _needs_kmsg() -> None:
    if not os.access("/dev/kmsg", os.W_OK):
        if IN_CI:
            pytest.fail("/dev/kmsg is not writable: the OOM killer's test double needs root")
        pytest.skip("/dev/kmsg is not writable: the OOM killer's test double needs root")


def _check_logs(run, job: dict) -> None:
    assert set(job["log"]) >= {"stdout", "stderr"}, job
    for rel in job["log"].values():
        assert (run.run_dir / rel).is_file() and not Path(rel).is_absolute(), rel
    assert 0 < len(job["last_lines"]) <= 20 and all(len(line) <= 300 for line in job["last_lines"])


def _raise_in(monkeypatch, replica: int, step: int) -> None:
    """The trainers' test hook: group ``replica`` raises ``RuntimeError`` at ``step`` of its attempt 0."""
    monkeypatch.setenv(raise_hook.AT_STEP, str(step))
    monkeypatch.setenv(raise_hook.REPLICA, str(replica))


def _check_raised(run, replica: int) -> dict:
    """The ``job`` event of a group whose trainer raised: exit code 1, the ``exit``'s own exception."""
    job = _job_event(run, replica, 0)
    exit_event = next(
        e for e in run.events_read if e["kind"] == "exit" and e.get("replica") == replica and e.get("attempt") == 0
    )
    assert (job["exit_code"], job["reason"], job["exception_source"]) == (1, "error", "exit"), job
    assert job["exception"] == exit_event["exception"] and job["exception"]["type"] == "RuntimeError"
    assert "signal" not in job
    return job


def test_segfault_oom_kill_and_exit_code_each_said_and_the_group_relaunched(start_run, monkeypatch):
    _needs_kmsg()
    _raise_in(monkeypatch, replica=0, step=40)
    run = start_run("demo", [*BASE, "max_restarts=10"])
    delays: list = []

    # An exception the trainer caught, told in its exit, then re-raised: the job exited 1. (First, and
    # back before the next death: a death of every group at once loses the run's state.)
    _check_raised(run, 0)
    _live_pid(run, 0, 1)

    # A segfault: the signal, the step it reached, where its logs are; no exit code, no OOM.
    segv = _kill(run, 1, 0, signal.SIGSEGV, delays)
    assert (segv["signal"], segv["clean"], segv["reason"]) == ("SIGSEGV", False, "died"), segv
    assert "exit_code" not in segv and "oom" not in segv and "exception" not in segv
    assert segv["step"] == _last_step(run, 1, 0)
    _check_logs(run, segv)
    restart = next(e for e in run.events_read if e["kind"] == "restart" and e["replica"] == 1)
    assert restart["attempt"] == 1 and restart["reason"] == "died"

    # The OOM killer (its message, for this PID only) and a SIGKILL without one.
    oom = _kill(run, 1, 1, signal.SIGKILL, delays, before=oom_killer_test_double)
    assert (oom["signal"], oom["oom"]) == ("SIGKILL", "kernel_log"), oom
    plain = _kill(run, 1, 2, signal.SIGKILL, delays)
    assert plain["signal"] == "SIGKILL" and "oom" not in plain, plain

    # An uncaught exception (^C's KeyboardInterrupt): the exit code, and the traceback read back from stderr.
    interrupted = _kill(run, 1, 3, signal.SIGINT, delays)
    assert interrupted["exit_code"] == 130 and "signal" not in interrupted, interrupted
    assert interrupted["exception"]["type"] == "KeyboardInterrupt" and interrupted["exception_source"] == "stderr"
    assert interrupted["exception"]["frames"], interrupted

    # Relaunched as usual after each: attempt 4 trains with its peer.
    _live_pid(run, 1, 4)
    assert not [e for e in run.events_read if e["kind"] == "fault"]
    assert run.stop()["state"] == "stopped"
    _report("local, fork server", delays)


def test_without_the_fork_server_a_segfault_and_an_exit_code_are_said_too(start_run, monkeypatch):
    monkeypatch.setenv("WORKBENCH_FORK_SERVER", "0")
    _raise_in(monkeypatch, replica=1, step=40)
    run = start_run("demo", BASE)
    delays: list = []
    _check_raised(run, 1)
    _live_pid(run, 1, 1)
    segv = _kill(run, 0, 0, signal.SIGSEGV, delays)
    assert segv["signal"] == "SIGSEGV" and "exit_code" not in segv, segv
    assert segv["step"] == _last_step(run, 0, 0)
    _check_logs(run, segv)
    _live_pid(run, 0, 1)
    assert run.stop()["state"] == "stopped"
    _report("local, submitit's LocalExecutor", delays)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


@pytest.fixture
def submit(slurm_cluster, run_root):
    yield from slurm_submitter(slurm_cluster["slurm_conf"], "demo", stop_timeout=30)


def exits_with_3() -> None:
    sys.exit(3)


def raises() -> None:
    raise ValueError("raised by the job")


def segfaults() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


JOBS = {exits_with_3: {"exit_code": 3}, raises: {"exit_code": 1}, segfaults: {"signal": "SIGSEGV"}}


def test_both_local_paths_keep_their_jobs_exit_code_or_signal(tmp_path):
    """The backend's record itself, for jobs that end each way: the fork server's children and submitit's tasks."""
    server = ForkServer("torchft-lite", log=tmp_path / "forkserver.log")
    server.start()
    jobs: dict = {}
    try:
        forked = ForkExecutor(tmp_path / "forked" / "%j", server)
        submitted = submitit_local.StatusLocalExecutor(folder=tmp_path / "submitit" / "%j")
        submitted.update_parameters(timeout_min=5)
        for fn in JOBS:
            jobs[fn] = (forked.submit(fn), submitted.submit(fn))
        for fn, (fork_job, submitit_job) in jobs.items():
            for job in (fork_job, submitit_job):
                deadline = time.monotonic() + 120
                while not job.done() and time.monotonic() < deadline:
                    time.sleep(0.02)
            assert fork_job.exit_status().fields() == JOBS[fn], fn.__name__
            assert submitit_local.exit_status(submitit_job).fields() == JOBS[fn], fn.__name__
        assert "ValueError: raised by the job" in jobs[raises][0].paths.stderr.read_text()
    finally:
        server.close()
        kill_pids([*server.forked, *(int(job.job_id) for _, job in jobs.values())])


class TestOnSlurm:
    pytestmark = [pytest.mark.slurm, *slurm_prerequisites()]

    def test_a_segfault_shows_slurms_state_and_the_signal(self, submit, slurm_cluster):
        run = submit(["cluster=slurm", *BASE])
        delays: list = []
        for attempt in (0, 1):
            segv = _kill(run, 1, attempt, signal.SIGSEGV, delays)
            assert segv["slurm_state"] == "FAILED" and segv["signal"] == "SIGSEGV", segv
            assert segv["node"] in slurm_cluster["nodes"] and segv["slurm_exit_code"], segv
            assert segv["step"] == _last_step(run, 1, attempt)
            assert segv["log"] and segv["last_lines"], segv
        _live_pid(run, 1, 2)
        assert run.stop()["state"] == "stopped"
        _report("Slurm", delays)


def test_an_oom_line_counts_only_for_its_pid_and_only_after_that_process_started():
    """The kernel log's evidence, read back from the real kernel log: a line logged right after the process
    started counts, though the kernel log's clock runs behind a start time's; another PID's line, or a line
    older than the process (an earlier process with the same PID), is no evidence."""
    import subprocess

    from workbench.cluster import exits
    from workbench.cluster.procs import start_time

    _needs_kmsg()
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = start_time(proc.pid)
        oom_killer_test_double(proc.pid)
        assert exits.oom_killed_in_kernel_log(proc.pid, since=started)
        assert not exits.oom_killed_in_kernel_log(proc.pid + 100_000, since=started)
        assert not exits.oom_killed_in_kernel_log(proc.pid, since=time.clock_gettime(time.CLOCK_BOOTTIME) + 5)
    finally:
        proc.kill()
        proc.wait()
