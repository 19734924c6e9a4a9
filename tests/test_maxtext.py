"""MaxText checkpoint-restart against the real thing (``.venv-maxtext``), driven like a job.

Each attempt is the job's real entrypoint (``job_entrypoint``) in its own process.
One uninterrupted baseline, submitted with submitit's LocalExecutor; one run that
is killed (SIGKILL, attempt 0), preempted (SIGUSR2 to every process, as Slurm's
``--signal`` does, attempt 1) and finished (attempt 2), with a half-written
checkpoint planted before attempt 1. The chaos run's directory names the test process as its controller
(a ``start`` event), so each attempt leaves a standby for the next (``trainers/maxtext/standby.py``): attempts 1
and 2 are forked from one, and the standby left at the end is stopped by its PID.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

from workbench.cluster.procs import start_time
from workbench.events.reader import read_all
from workbench.events.writer import EventWriter
from workbench.spec.load import load_spec
from workbench.trainers.base import JobContext, job_entrypoint
from workbench.trainers.maxtext import command as maxtext_command
from workbench.trainers.maxtext import output as maxtext_output
from workbench.trainers.maxtext import standby as maxtext_standby

pytestmark = [
    pytest.mark.maxtext,
    pytest.mark.skipif(
        not maxtext_command.maxtext_python().exists(),
        reason=f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh",
    ),
]

STEPS = 200
PERIOD = 10
KILL_AT = 30
PREEMPT_AFTER = 20
START_TIMEOUT_S = 240
REPO = Path(__file__).resolve().parents[1]
ENTRY = "import pickle, sys; from workbench.trainers.base import job_entrypoint; job_entrypoint(pickle.load(open(sys.argv[1], 'rb')))"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def job_context(run_dir: Path, attempt: int) -> JobContext:
    spec = load_spec("maxtext-cpu-tiny", steps=STEPS, run_root=str(run_dir.parent)).to_dict()
    return JobContext(run_dir=str(run_dir), run_id=run_dir.name, spec=spec, replica=0, attempt=attempt)


class Attempt:
    """One job attempt in its own process; stopped by PID (and its MaxText child) on close."""

    def __init__(self, run_dir: Path, attempt: int) -> None:
        self.ctx = job_context(run_dir, attempt)
        run_dir.mkdir(parents=True, exist_ok=True)
        ctx_file = run_dir / f"ctx.attempt-{attempt}.pkl"
        ctx_file.write_bytes(pickle.dumps(self.ctx))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENTRY, str(ctx_file)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=open(run_dir / f"wrapper.attempt-{attempt}.err", "wb"),
        )

    def events(self, kind: str | None = None) -> list[dict]:
        own = [e for e in read_all(self.ctx.run_dir) if e.get("attempt") == self.ctx.attempt]
        return [e for e in own if kind is None or e["kind"] == kind]

    def phase(self, name: str) -> dict | None:
        return next((e for e in self.events("phase") if e["phase"] == name), None)

    def max_step(self) -> int:
        return max((e["step"] for e in self.events("step")), default=0)

    def exit_event(self) -> dict | None:
        return next(iter(self.events("exit")), None)

    def maxtext_pid(self) -> int | None:
        launched = self.phase("launched")
        return launched["maxtext_pid"] if launched else None

    def wait(self, timeout_s: float = START_TIMEOUT_S) -> int:
        return self.proc.wait(timeout=timeout_s)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        _kill_maxtext(self)


def _kill_maxtext(attempt) -> None:
    pid = attempt.maxtext_pid()
    if pid and _alive(pid):
        os.kill(pid, signal.SIGKILL)


class SubmititAttempt(Attempt):
    """An attempt submitted with submitit's LocalExecutor, as the local cluster does."""

    def __init__(self, run_dir: Path, attempt: int) -> None:
        self.ctx = job_context(run_dir, attempt)
        executor = submitit.LocalExecutor(folder=run_dir / "jobs")
        executor.update_parameters(timeout_min=10)
        self.job = executor.submit(job_entrypoint, self.ctx)

    def wait(self, timeout_s: float = START_TIMEOUT_S) -> str:
        wait_for(self.job.done, timeout_s, "the submitit job to end", poll_s=0.5)
        return self.job.state

    def close(self) -> None:
        if not self.job.done():
            self.job.cancel()
            wrapper = next(iter(self.events("start")), None)
            if wrapper and _alive(wrapper["pid"]):
                os.kill(wrapper["pid"], signal.SIGKILL)
        _kill_maxtext(self)


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("maxtext-runs")


@pytest.fixture(scope="module")
def baseline(run_root):
    job = SubmititAttempt(run_root / "baseline", 0)
    try:
        job.wait()
        yield job
    finally:
        job.close()


@pytest.fixture(scope="module")
def chaos(run_root):
    """attempt 0 killed at step >= KILL_AT, attempt 1 preempted, attempt 2 to the end."""
    run_dir = run_root / "chaos"
    jobs: list[Attempt] = []
    out: dict = {"jobs": jobs}
    run_dir.mkdir(parents=True, exist_ok=True)
    EventWriter(run_dir, "controller", run=run_dir.name, replica=None, attempt=0).emit("start", role="controller")
    try:
        a0 = Attempt(run_dir, 0)
        jobs.append(a0)
        wait_for(lambda: a0.max_step() >= KILL_AT, START_TIMEOUT_S, f"attempt 0 to reach step {KILL_AT}")
        os.kill(a0.proc.pid, signal.SIGKILL)
        a0.wait(30)
        out["killed_at"] = a0.max_step()
        out["orphan_gone"] = wait_for(lambda: not _alive(a0.maxtext_pid()), 30, "MaxText to die with its wrapper")

        ckpt_dir = maxtext_command.checkpoint_dir(run_dir, run_dir.name)
        latest = max(maxtext_output.durable_checkpoints(ckpt_dir))
        out["durable_at_kill"] = latest + 1  # event steps count from 1
        planted = latest + PERIOD
        half_written = ckpt_dir / f"{planted}.orbax-checkpoint-tmp"
        if not half_written.exists():  # else the kill itself landed mid-save and left the real thing
            shutil.copytree(ckpt_dir / str(latest), half_written)
        out["planted"] = planted

        a1 = Attempt(run_dir, 1)
        jobs.append(a1)
        restored = wait_for(lambda: a1.phase("restored"), START_TIMEOUT_S, "attempt 1 to restore")
        target = restored["from_step"] + PREEMPT_AFTER
        wait_for(lambda: a1.max_step() >= target, START_TIMEOUT_S, f"attempt 1 to reach step {target}")
        os.kill(a1.proc.pid, signal.SIGUSR2)
        os.kill(a1.maxtext_pid(), signal.SIGUSR2)
        out["preempted_at"] = a1.max_step()
        a1.wait(120)

        a2 = Attempt(run_dir, 2)
        jobs.append(a2)
        a2.wait()
        yield out
    finally:
        for job in jobs:
            job.close()
        _stop_standby(maxtext_standby.socket_path(run_dir, 0).with_suffix(".pid"))


def _stop_standby(pid_file: Path) -> None:
    try:
        pid, started = pid_file.read_text().split()
    except (OSError, ValueError):
        return
    if start_time(int(pid)) == float(started):
        os.kill(int(pid), signal.SIGKILL)


def test_uninterrupted_run_completes(baseline):
    end = baseline.exit_event()
    assert baseline.job.state == "FINISHED", baseline.job.stderr()
    assert baseline.job.result() is None
    assert end["reason"] == "completed" and end["step"] == STEPS
    assert baseline.max_step() == STEPS
    assert baseline.phase("restored") is None
    ckpts = baseline.events("checkpoint")
    assert all(c["durable"] and c["bytes"] > 0 and c["seconds"] >= 0 for c in ckpts)
    assert {c["step"] for c in ckpts} >= set(range(1, STEPS + 1, PERIOD))
    assert baseline.phase("first_step")["seconds"] > 0


def test_kill_resumes_from_last_durable_checkpoint(chaos):
    a0, a1, _ = chaos["jobs"]
    assert a0.exit_event() is None, "a SIGKILLed job cannot report an exit"
    assert chaos["orphan_gone"]
    from_step = a1.phase("restored")["from_step"]
    assert from_step == chaos["durable_at_kill"], "the newest save on disk when the job was killed"
    # Recorded before it is restored: by attempt 0, or late by attempt 1 when the kill came between
    # the save's commit and the wrapper's next look (its events run a few steps behind MaxText).
    recorded = [c for c in a0.events("checkpoint") + a1.events("checkpoint") if c["step"] == from_step]
    assert recorded and recorded[0]["durable"] and recorded[0]["t"] < a1.phase("restored")["t"]
    late = {c["step"] for c in a1.events("checkpoint") if c.get("late")}
    assert not late & {c["step"] for c in a0.events("checkpoint")}, "a save recorded twice"
    assert chaos["killed_at"] - from_step <= PERIOD, "steps lost exceed the checkpoint period"
    assert a1.phase("launched")["warm"] and a1.phase("imports_done")["warm"], a1.phase("launched")
    compiled = a1.phase("compiled")
    # From the persistent cache, which attempt 0 filled; a function attempt 0 never compiled (its kill came
    # before that save, say) is the one miss a restart may have.
    assert compiled["compile_cache_hits"] > compiled["compile_cache_misses"] <= 1, "the restart's compile: cached"


def test_a_save_without_its_event_is_recorded_late_once(baseline, tmp_path):
    """A save committed after a killed attempt's last look has no event; the next attempt records it
    (``late``) before MaxText restores it, and only it. On the baseline run's own Orbax directory."""
    from workbench.events.writer import EventWriter
    from workbench.trainers.maxtext.job import record_late_saves

    run_dir = Path(baseline.ctx.run_dir)
    ckpt_dir = maxtext_command.checkpoint_dir(run_dir, run_dir.name)
    on_disk = sorted(s + 1 for s in maxtext_output.durable_checkpoints(ckpt_dir))
    assert len(on_disk) >= 3
    other = tmp_path / "run"
    killed = EventWriter(other, "replica-0.attempt-0", run="r", replica=0, attempt=0)
    killed.emit("checkpoint", step=on_disk[0], durable=True)
    killed.emit("checkpoint", step=on_disk[-1], durable=False, state="started")
    following = EventWriter(other, "replica-0.attempt-1", run="r", replica=0, attempt=1)
    assert record_late_saves(following, other, ckpt_dir) == on_disk[1:]
    late = [e for e in read_all(other) if e.get("late")]
    assert [e["step"] for e in late] == on_disk[1:]
    assert all(e["durable"] and e["bytes"] > 0 and e["seconds"] > 0 and e["attempt"] == 1 for e in late)
    assert record_late_saves(following, other, ckpt_dir) == []


def test_half_written_checkpoint_is_never_restored(chaos):
    a0, a1, a2 = chaos["jobs"]
    planted = chaos["planted"] + 1
    assert a1.phase("restored")["from_step"] < planted
    assert any("orbax-checkpoint-tmp" in w["message"] for w in a1.events("warning"))
    rewritten = [c for c in a1.events("checkpoint") + a2.events("checkpoint") if c["step"] == planted]
    assert rewritten and rewritten[0]["durable"], "Orbax should replace the stale tmp dir with a real save"


def test_preemption_saves_the_step_reached(chaos):
    _, a1, a2 = chaos["jobs"]
    end = a1.exit_event()
    assert end["reason"] == "preempted", end
    assert a1.phase("stopping")["signal"] == "SIGUSR2"
    assert a1.proc.returncode != 0
    assert end["saved_step"] == end["step"] >= chaos["preempted_at"]
    assert end["step"] >= a1.max_step()
    assert end["saved_step"] in {c["step"] for c in a1.events("checkpoint")}
    assert a2.phase("restored")["from_step"] == end["saved_step"], "a planned stop must lose no step"


def test_resumed_run_matches_uninterrupted(chaos, baseline):
    _, _, a2 = chaos["jobs"]
    end = a2.exit_event()
    assert a2.proc.returncode == 0, end
    assert end["reason"] == "completed" and end["step"] == STEPS
    reference = {e["step"]: e["loss"] for e in baseline.events("step")}
    resumed = {e["step"]: e["loss"] for e in a2.events("step")}
    assert resumed, "attempt 2 trained no step"
    assert all(resumed[s] == pytest.approx(reference[s], rel=1e-6) for s in resumed)
    assert resumed[STEPS] == pytest.approx(reference[STEPS], rel=1e-6)
