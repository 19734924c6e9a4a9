"""An exception raised inside a trainer's step is told in the trainer's own ``exit``: its type, its message and
the frame it came from; for a group of several processes also how each ended and which failed first.

The exception is raised by the trainers' test hook (``workbench/trainers/raise_hook.py``), set through the
environment the controller's jobs inherit from the test. It fires on attempt 0 only: a relaunch trains on.
Each run is real: the controller, submitit's local jobs, torchft's lighthouse, TorchTitan's ranks, MaxText.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.events.reader import read_all
from workbench.spec.load import load_spec
from workbench.trainers import raise_hook
from workbench.trainers.base import JobContext
from workbench.trainers.maxtext import command as maxtext_command
from workbench.trainers.process_group import ProcessGroup

REPO = Path(__file__).resolve().parents[1]
ENTRY = "import pickle, sys; from workbench.trainers.base import job_entrypoint; job_entrypoint(pickle.load(open(sys.argv[1], 'rb')))"


def _exits(run, replica: int, attempt: int) -> list[dict]:
    return [
        e
        for e in run.event_records()
        if e["kind"] == "exit" and e.get("replica") == replica and e.get("attempt") == attempt
    ]


def _frames(exception: dict) -> list[tuple[str, str]]:
    """(path inside the checkout, function) of each frame."""
    return [(os.path.relpath(f["file"], REPO), f["function"]) for f in exception["frames"]]


def _raise_at(monkeypatch, step: int, **where: int) -> str:
    monkeypatch.setenv(raise_hook.AT_STEP, str(step))
    for name, value in where.items():
        monkeypatch.setenv({"replica": raise_hook.REPLICA, "rank": raise_hook.RANK}[name], str(value))
    return raise_hook.MESSAGE.format(step=step, replica=where.get("replica", 0), rank=where.get("rank", 0), attempt=0)


@pytest.mark.slow
def test_torchft_lite_exit_tells_the_exception_of_a_step_and_the_group_is_relaunched(start_run, monkeypatch):
    _raise_at(monkeypatch, 5, replica=1)
    run = start_run("demo", ["steps=150", "faults=[]", "replicas=2", "min_replicas=1", "model.step_delay_s=0.05"])
    assert run.wait(timeout=300)["state"] == "completed", run.status()

    exits = _exits(run, 1, 0)
    assert len(exits) == 1, exits  # the trainer's, and none from the job's entry besides
    end = exits[0]
    assert end["reason"] == "error" and end["step"] >= 5, (
        end
    )  # the first step at or past 5 (a late joiner heals past it)
    message = raise_hook.MESSAGE.format(step=end["step"], replica=1, rank=0, attempt=0)
    assert end["exception"]["type"] == "RuntimeError" and end["exception"]["message"] == message, end
    assert end["error"] == f"RuntimeError: {message}"
    frames = _frames(end["exception"])
    assert frames[-1] == ("workbench/trainers/raise_hook.py", "maybe_raise"), frames
    assert ("workbench/trainers/lite/trainer.py", "run") in frames, frames
    restarts = [e for e in run.event_records() if e["kind"] == "restart" and e.get("replica") == 1]
    assert [(e["attempt"], e["reason"]) for e in restarts] == [(1, "error")], restarts
    assert [e["reason"] for e in _exits(run, 1, 1)] == ["completed"]
    assert [e["reason"] for e in _exits(run, 0, 0)] == ["completed"]  # the hook fired in group 1 only


@pytest.mark.slow
def test_an_exception_that_escapes_a_trainer_is_told_once_by_the_job_entry(tmp_path):
    """torchft-lite with a spec that lacks its ``model`` section: ``run`` raises KeyError, uncaught."""
    spec = load_spec("demo", run_root=str(tmp_path)).to_dict()
    del spec["model"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx_file = tmp_path / "ctx.pkl"
    ctx_file.write_bytes(pickle.dumps(JobContext(str(run_dir), "run", spec, replica=0, attempt=0)))
    proc = subprocess.run(
        [sys.executable, "-c", ENTRY, str(ctx_file)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "KeyError: 'model'" in proc.stderr, proc.stderr[-2000:]

    exits = [e for e in read_all(run_dir) if e["kind"] == "exit"]
    assert len(exits) == 1, exits
    end = exits[0]
    assert end["reason"] == "error" and end["step"] is None and end["error"] == "KeyError: 'model'", end
    assert end["exception"]["type"] == "KeyError"
    assert _frames(end["exception"])[-1] == ("workbench/trainers/lite/trainer.py", "run"), end["exception"]


def test_a_group_tells_how_each_process_ended_in_order_and_the_first_failed_s_traceback(tmp_path):
    """Real child processes: rank 1 raises, rank 0 would sleep on; the group kills rank 0 and says so."""
    group = ProcessGroup()
    try:
        group.start(0, [sys.executable, "-c", "import time; time.sleep(60)"], stderr_path=tmp_path / "rank-0.err")
        group.start(
            1,
            [
                sys.executable,
                "-c",
                "import sys; print('noise', file=sys.stderr)\ndef f():\n raise ValueError('boom')\nf()",
            ],
            stderr_path=tmp_path / "rank-1.err",
        )
        assert group.wait() == 1
        fields = group.exit_fields()
    finally:
        group.close()
    assert [(p["rank"], p.get("exit_code"), p.get("signal")) for p in fields["processes"]] == [
        (1, 1, None),
        (0, None, "SIGKILL"),
    ]
    assert fields["first_failed"] == 1
    exception = fields["exception"]
    assert (exception["type"], exception["message"], exception["rank"]) == ("ValueError", "boom", 1)
    assert [f["function"] for f in exception["frames"]] == ["<module>", "f"]
    assert "ValueError: boom" in (tmp_path / "rank-1.err").read_text()


@pytest.mark.slow
@pytest.mark.titan
@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="torchtitan is not installed")
def test_titan_two_rank_group_exit_names_the_rank_that_raised_first(start_run, monkeypatch):
    message = _raise_at(monkeypatch, 2, rank=1)
    run = start_run(
        "titan-cpu",
        {
            "steps": 4,
            "faults": [],
            "replicas": 1,
            "min_replicas": 1,
            "nproc_per_replica": 2,
            "relaunch": "off",
            "titan.overrides": {"training.seq_len": 128},
        },
    )
    assert run.wait(timeout=420)["state"] == "failed", run.status()

    exits = _exits(run, 0, 0)
    assert len(exits) == 1, exits
    end = exits[0]
    assert end["reason"] == "error" and end["first_failed"] == 1, end
    processes = end["processes"]
    assert [p["rank"] for p in processes] == [1, 0], processes
    assert processes[0]["exit_code"] == 1, processes
    assert processes[0]["t"] <= processes[1]["t"]
    assert end["exception"]["type"] == "RuntimeError" and end["exception"]["message"] == message, end
    assert end["exception"]["rank"] == 1 and end["error"] == f"RuntimeError: {message}"
    frames = _frames(end["exception"])
    assert frames[-1] == ("workbench/trainers/raise_hook.py", "maybe_raise"), frames
    assert ("workbench/trainers/titan/hooks.py", "train_step_hook") in frames, frames


@pytest.mark.slow
@pytest.mark.maxtext
@pytest.mark.skipif(
    not maxtext_command.maxtext_python().exists(),
    reason=f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh",
)
def test_maxtext_exit_tells_the_exception_its_training_process_died_of(start_run, monkeypatch):
    message = _raise_at(monkeypatch, 3)
    run = start_run("maxtext-cpu-tiny", {"steps": 6, "relaunch": "off"})
    assert run.wait(timeout=420)["state"] == "failed", run.status()

    exits = _exits(run, 0, 0)
    assert len(exits) == 1, exits
    end = exits[0]
    assert end["reason"] == "error" and end["returncode"] == 1, end
    assert [(p["rank"], p["exit_code"]) for p in end["processes"]] == [(0, 1)] and end["first_failed"] == 0, end
    assert end["exception"]["type"] == "RuntimeError" and end["exception"]["message"] == message, end
    assert end["error"] == f"RuntimeError: {message}"
    frames = _frames(end["exception"])
    assert frames[-1] == ("workbench/trainers/maxtext/launcher.py", "_raise_at_step"), frames
