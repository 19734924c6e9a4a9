"""Issue #41's matrix, the cells the other tests leave: what a user sees of a trainer killed from outside by
SIGSEGV and of an exception raised inside a trainer's step, on each trainer, locally and on the dev Slurm.

``workbench status`` (the CLI's text) must name the cause (SIGSEGV, or the exception's type and message)
and the step; ``workbench why`` and ``Run.ends()`` the exception's frame; on Slurm ``why`` and the status
JSON also sacct's state; and the group is relaunched as usual (its next attempt commits a step). The
SIGSEGV comes from outside the workbench, by PID: TorchTitan's rank 1 of a two-rank group, a child of the
group's job process (the fold's ``ReplicaView.proc``); MaxText's training process, the child its job's
wrapper launched (its ``launched`` phase names it, and it is that process's child). The exception comes from
the trainers' test hook (``workbench/trainers/raise_hook.py``); on Slurm it fires on attempt 1, after the
SIGSEGV of attempt 0, so one run gives both cells. The time from each death (the signal; the trainer's
``exit``) to the controller's ``job`` event is printed.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import time

import psutil
import pytest

from workbench.run.rank_pids import recorded_ranks
from workbench.state.fold import RunState
from workbench.trainers import raise_hook
from workbench.trainers.maxtext import command as maxtext_command

from .conftest import local_slurm, slurm_prerequisites, slurm_submitter, workbench_cli

# torchft-lite's 3000 steps take 150 s at the least: within Slurm's time limit, and long past the test's end.
LITE = ["steps=3000", "faults=[]", "replicas=2", "min_replicas=1", "model.step_delay_s=0.05"]
LITE_RAISE_AT = 150  # 7.5 s in (the hook fires at the first step at or past it)
TITAN = {
    "steps": 100000,
    "faults": [],
    "replicas": 1,
    "min_replicas": 1,
    "nproc_per_replica": 2,
    "on_state_loss": "restart",  # the one group's death loses the model's state: start it over, as a user would
    "titan.overrides": {"training.seq_len": 64},
}
MAXTEXT = {"steps": 100000, "max_restarts": 5, "maxtext.checkpoint_period": 100000}  # a relaunch starts at step 0
NEEDS_TITAN = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
NEEDS_MAXTEXT = pytest.mark.skipif(
    not maxtext_command.maxtext_python().exists(),
    reason=f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh",
)
ON_SLURM = [pytest.mark.slurm, *slurm_prerequisites()]
WHERE = ["local", pytest.param("slurm", marks=ON_SLURM)]
START_S = 300


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    with local_slurm(tmp_path_factory.mktemp("slurm")) as info:
        yield info


@pytest.fixture
def launch(request, start_run, run_root):
    """``launch(where, config, overrides)``: the run, locally or on the module's dev Slurm (stopped after)."""
    submitters = []

    def _launch(where: str, config: str, overrides):
        if where == "local":
            return start_run(config, overrides)
        cluster = request.getfixturevalue("slurm_cluster")
        submitters.append(slurm_submitter(cluster["slurm_conf"], config, stop_timeout=60))
        overrides = [*overrides, "cluster=slurm"] if isinstance(overrides, list) else {**overrides, "cluster": "slurm"}
        return next(submitters[-1])(overrides)

    yield _launch
    for submitter in submitters:
        next(submitter, None)  # stops its run and removes what it left, by PID and job id


def _raise_at(monkeypatch, step: int, attempt: int = 0, **where: int) -> None:
    monkeypatch.setenv(raise_hook.AT_STEP, str(step))
    monkeypatch.setenv(raise_hook.ATTEMPT, str(attempt))
    for name, value in where.items():
        monkeypatch.setenv({"replica": raise_hook.REPLICA, "rank": raise_hook.RANK}[name], str(value))


def _of(run, kind: str, replica: int, attempt: int) -> list[dict]:
    return [
        e for e in run.events_read if e["kind"] == kind and e.get("replica") == replica and e.get("attempt") == attempt
    ]


def _stepped(run, replica: int, attempt: int) -> None:
    """Wait until the attempt's process is alive and has committed a step."""

    def stepped(r) -> bool:
        assert r.state() not in ("completed", "failed", "stopped", "lost"), r.status()
        return r.run_state.replicas[replica].live_proc(attempt) is not None and any(
            e.get("committed") for e in _of(r, "step", replica, attempt)
        )

    run.wait_for(stepped, timeout=START_S)


def _job(run, replica: int, attempt: int) -> dict:
    run.wait_for(lambda r: _of(r, "job", replica, attempt), timeout=120, poll=0.05)
    return _of(run, "job", replica, attempt)[0]


def _last_step(run, replica: int, attempt: int) -> int:
    return max(e["step"] for e in _of(run, "step", replica, attempt))


def titan_rank(run, replica: int, attempt: int, rank: int) -> psutil.Process:
    """The rank's process: the child of the group's job process that the job recorded as that rank
    (``workbench.run.rank_pids``: a rank forked warm shows its job's environment in ``/proc``)."""
    job = psutil.Process(run.run_state.replicas[replica].live_proc(attempt).pid)
    run.wait_for(lambda r: rank in recorded_ranks(r.run_dir, replica, attempt).values(), timeout=60, poll=0.05)
    pid = next(p for p, r in recorded_ranks(run.run_dir, replica, attempt).items() if r == rank)
    found = [p for p in job.children(recursive=True) if p.pid == pid]
    assert len(found) == 1, (job, pid)
    return found[0]


def maxtext_child(run, replica: int, attempt: int) -> psutil.Process:
    """MaxText's training process: the one its job's wrapper launched (``launched``), that wrapper's child."""
    job = psutil.Process(run.run_state.replicas[replica].live_proc(attempt).pid)
    pid = next(e["maxtext_pid"] for e in _of(run, "phase", replica, attempt) if e["phase"] == "launched")
    assert pid in [p.pid for p in job.children()], (job, pid)
    return psutil.Process(pid)


def _segfault(run, replica: int, attempt: int, victim) -> tuple[dict, float]:
    """SIGSEGV to ``victim(run, replica, attempt)`` once the attempt steps; its ``job`` event, and the seconds
    from the signal to it."""
    _stepped(run, replica, attempt)
    proc = victim(run, replica, attempt)
    t_kill = time.time()
    proc.send_signal(signal.SIGSEGV)
    job = _job(run, replica, attempt)
    return job, job["t"] - t_kill


def _status(run) -> tuple[str, dict]:
    text, js = workbench_cli("status", str(run.run_dir)), workbench_cli("status", str(run.run_dir), "--json")
    assert text.returncode == 0 and js.returncode == 0, (text.stderr, js.stderr)
    return text.stdout, json.loads(js.stdout)


def _why(run, replica: int, attempt: int) -> str:
    out = workbench_cli("why", str(run.run_dir), "--replica", str(replica), "--attempt", str(attempt), "--lines", "3")
    assert out.returncode == 0, out.stderr
    return out.stdout


def _check_slurm(where: str, run, job: dict, replica: int, attempt: int) -> None:
    """On Slurm, sacct's state is in the ``job`` event, in ``why`` and in the status JSON's last end."""
    if where != "slurm":
        assert "slurm_state" not in job, job
        return
    assert job["slurm_state"] == "FAILED", job
    assert f"slurm FAILED, slurm exit code {job['slurm_exit_code']}, node {job['node']}" in _why(run, replica, attempt)
    assert _status(run)[1]["replicas"][str(replica)]["last_end"]["slurm_state"] == "FAILED"


def _check_exception(run, replica: int, attempt: int, summary_head: str, frame: tuple[str, str]) -> float:
    """The exception's end as status, ``why`` and ``Run.ends()`` show it; the seconds from its exit to its job."""
    job = _job(run, replica, attempt)
    exit_event = _of(run, "exit", replica, attempt)[0]
    path, function = frame
    status = _status(run)[0]
    line = f"  last end: attempt {attempt}, {summary_head} ({path}:"
    assert line in status and status.split(line, 1)[1].split("\n", 1)[0].endswith(f" in {function})"), status
    why = _why(run, replica, attempt)
    assert why.startswith(f"replica {replica} attempt {attempt}: {summary_head} ({path}:"), why
    assert re.search(rf'/workbench/{re.escape(path)}", line \d+, in {function}\n', why), why
    ends = run.ends().set_index(["replica", "attempt"])
    assert ends.loc[(replica, attempt), "cause"] == "exception"
    assert re.fullmatch(rf"{re.escape(path)}:\d+ in {function}", ends.loc[(replica, attempt), "where"])
    return job["t"] - exit_event["t"]


# -- torchft-lite: an exception on Slurm --------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("where", [pytest.param("slurm", marks=ON_SLURM)])
def test_lite_exception_on_slurm_is_told_with_its_frame_and_slurms_state(where, launch, monkeypatch):
    _raise_at(monkeypatch, LITE_RAISE_AT, replica=1)
    run = launch(where, "demo", LITE)
    _stepped(run, 1, 1)  # relaunched as usual
    step = _of(run, "exit", 1, 0)[0]["step"]  # the first step at or past LITE_RAISE_AT
    assert step >= LITE_RAISE_AT
    message = raise_hook.MESSAGE.format(step=step, replica=1, rank=0, attempt=0)
    head = f"RuntimeError: {message} at step {step}"
    delay = _check_exception(run, 1, 0, head, ("trainers/raise_hook.py", "maybe_raise"))
    _check_slurm(where, run, _job(run, 1, 0), 1, 0)
    print(f"\ntorchft-lite, {where}: exception -> job event {delay:.2f} s")
    assert run.stop()["state"] == "stopped"


# -- TorchTitan, a rank of a two-rank group -----------------------------------------------------------------
@pytest.mark.slow
@NEEDS_TITAN
@pytest.mark.titan
@pytest.mark.parametrize("where", WHERE)
def test_titan_rank_segfault_and_exception_name_the_rank_that_failed_first(where, launch, monkeypatch):
    """Rank 1's SIGSEGV ends attempt 0; on Slurm rank 1 then raises at step 2 of attempt 1."""
    if where == "slurm":
        _raise_at(monkeypatch, 2, attempt=1, rank=1)
    run = launch(where, "titan-cpu", {**TITAN, **({"slurm.cpus_per_task": 2} if where == "slurm" else {})})
    job, delay = _segfault(run, 0, 0, lambda r, g, a: titan_rank(r, g, a, rank=1))
    step = _last_step(run, 0, 0)
    exit_event = _of(run, "exit", 0, 0)[0]
    assert exit_event["first_failed"] == 1, exit_event
    assert [(p["rank"], p.get("signal")) for p in exit_event["processes"]] == [(1, "SIGSEGV"), (0, "SIGKILL")]
    assert job["step"] == step, job
    summary = f"rank 1 failed first: SIGSEGV at step {step} (not injected)"
    assert f"  last end: attempt 0, {summary}" in _status(run)[0]  # before attempt 1 could end
    assert _why(run, 0, 0).startswith(f"replica 0 attempt 0: {summary}  [unplanned: SIGSEGV]")
    _check_slurm(where, run, job, 0, 0)
    _stepped(run, 0, 1)
    print(f"\nTorchTitan rank 1, {where}: SIGSEGV -> job event {delay:.2f} s")
    if where == "slurm":
        message = raise_hook.MESSAGE.format(step=2, replica=0, rank=1, attempt=1)
        head = f"rank 1 failed first: RuntimeError: {message} at step 2"
        delay = _check_exception(run, 0, 1, head, ("trainers/raise_hook.py", "maybe_raise"))
        _check_slurm(where, run, _job(run, 0, 1), 0, 1)
        _stepped(run, 0, 2)
        print(f"TorchTitan rank 1, {where}: exception -> job event {delay:.2f} s")
    assert run.stop(timeout=60)["state"] == "stopped"


# -- MaxText, its training process --------------------------------------------------------------------------
@pytest.mark.slow
@NEEDS_MAXTEXT
@pytest.mark.maxtext
@pytest.mark.parametrize("where", WHERE)
def test_maxtext_training_process_segfault_and_exception_are_told(where, launch, monkeypatch):
    """MaxText's process gets SIGSEGV on attempt 0; on Slurm it then raises at step 5 of attempt 1."""
    if where == "slurm":
        _raise_at(monkeypatch, 5, attempt=1)
    run = launch(where, "maxtext-cpu-tiny", MAXTEXT)
    job, delay = _segfault(run, 0, 0, maxtext_child)
    exit_event = _of(run, "exit", 0, 0)[0]
    assert exit_event["processes"][0]["signal"] == "SIGSEGV" and exit_event["returncode"] == -signal.SIGSEGV
    step = _last_step(run, 0, 0)
    assert exit_event["step"] == step, exit_event
    summary = f"rank 0 failed first: SIGSEGV at step {step} (not injected)"
    assert f"  last end: attempt 0, {summary}" in _status(run)[0]  # before attempt 1 could end
    assert _why(run, 0, 0).startswith(f"replica 0 attempt 0: {summary}  [unplanned: SIGSEGV]")
    _check_slurm(where, run, job, 0, 0)
    _stepped(run, 0, 1)
    print(f"\nMaxText, {where}: SIGSEGV -> job event {delay:.2f} s")
    if where == "slurm":
        message = raise_hook.MESSAGE.format(step=5, replica=0, rank=0, attempt=1)
        head = f"rank 0 failed first: RuntimeError: {message} at step 5"
        delay = _check_exception(run, 0, 1, head, ("trainers/maxtext/launcher.py", "_raise_at_step"))
        _check_slurm(where, run, _job(run, 0, 1), 0, 1)
        _stepped(run, 0, 2)
        print(f"MaxText, {where}: exception -> job event {delay:.2f} s")
    assert run.stop(timeout=60)["state"] == "stopped"


# -- the fold: a group's first failed rank --------------------------------------------------------------------
def _group_end(processes: list[dict], exception: dict) -> object:
    state = RunState(1, 100)
    state.apply(
        [
            {"kind": "start", "t": 1, "role": "replica", "replica": 0, "attempt": 0},
            {
                "kind": "exit",
                "t": 2,
                "replica": 0,
                "attempt": 0,
                "reason": "error",
                "step": 3,
                "processes": processes,
                "first_failed": processes[0]["rank"],
                "exception": exception,
            },
        ]
    )
    return state.replicas[0].last_end


def test_a_rank_that_raised_first_is_told_by_its_exception_and_one_a_signal_killed_by_the_signal():
    frame = {"file": "/src/workbench/trainers/titan/hooks.py", "line": 9, "function": "train_step_hook"}
    raised = {"type": "ValueError", "message": "bad", "frames": [frame], "rank": 1}
    end = _group_end([{"rank": 1, "exit_code": 1}, {"rank": 0, "signal": "SIGKILL"}], raised)
    assert (end.summary(), end.cause()) == (
        "rank 1 failed first: ValueError: bad at step 3 (trainers/titan/hooks.py:9 in train_step_hook)",
        "exception",
    )
    # A peer's exception (rank 0's, after rank 1 died of a signal) is no cause, nor text on a killed rank's stderr.
    for exception in ({**raised, "rank": 0}, raised):
        end = _group_end([{"rank": 1, "signal": "SIGSEGV"}, {"rank": 0, "exit_code": 1}], exception)
        assert (end.summary(), end.cause()) == ("rank 1 failed first: SIGSEGV at step 3 (not injected)", "SIGSEGV")
