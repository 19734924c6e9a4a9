"""Why each attempt ended (``workbench.state.causes``), folded from hand-written event lists, and what
``workbench status``, ``workbench why``, ``Run.ends()`` and the Prometheus exporter show of it on a run
directory written by a real EventWriter. Nothing here starts a trainer or a job."""

from __future__ import annotations

import json
import re
import signal
import urllib.request
from typing import Callable

import pytest

from workbench import analysis
from workbench.apps import exporter as wb_exporter
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.run.handle import attach
from workbench.spec.load import load_spec
from workbench.state.fold import RunState
from workbench.trainers import raise_hook

from .conftest import workbench_cli

TRAINER_FRAME = {"file": "/src/workbench/trainers/lite/trainer.py", "line": 123, "function": "step"}
TORCH_FRAME = {"file": "/venv/lib/site-packages/torch/nn/modules/module.py", "line": 1736, "function": "_call_impl"}


def ev(kind: str, t: float, **fields) -> dict:
    return {"kind": kind, "t": t, **fields}


def start(t: float, replica: int, attempt: int = 0, node: str = "n1") -> dict:
    return ev("start", t, role="replica", replica=replica, attempt=attempt, node=node)


def step(t: float, replica: int, s: int, attempt: int = 0) -> dict:
    return ev("step", t, replica=replica, attempt=attempt, step=s, committed=True, participating=True)


def job(t: float, replica: int, attempt: int = 0, reason: str = "died", **fields) -> dict:
    return ev(
        "job",
        t,
        replica=replica,
        attempt=attempt,
        job_id=f"{replica}{attempt}",
        state="ended",
        clean=reason == "completed",
        reason=reason,
        **fields,
    )


def fold(events: list[dict], groups: int = 3, one_job: bool = False) -> RunState:
    state = RunState(groups, 100)
    state.ends.one_job = one_job
    state.apply(events)
    return state


def only_end(events: list[dict], **kw):
    ends = list(fold(events, **kw).ends)
    assert len(ends) == 1, [e.as_dict() for e in ends]
    return ends[0]


# -- each cause ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "job_fields, summary, cause",
    [
        ({"signal": "SIGSEGV", "step": 41}, "SIGSEGV at step 41 (not injected)", "SIGSEGV"),
        ({"signal": "SIGKILL", "oom": "kernel_log", "step": 12}, "killed by the kernel's OOM killer at step 12", "oom"),
        ({"exit_code": 3, "step": 4}, "exit code 3 at step 4", "exit_code"),
        (
            {"slurm_state": "NODE_FAIL", "node": "node2", "slurm_exit_code": "0:0", "step": 30},
            "Slurm NODE_FAIL on node2 at step 30",
            "slurm:NODE_FAIL",
        ),
        (
            {"slurm_state": "CANCELLED by 0", "signal": "SIGTERM", "step": 9},
            "Slurm CANCELLED by 0 at step 9",
            "slurm:CANCELLED",
        ),
        ({"slurm_state": "FAILED", "exit_code": 1, "step": 2}, "exit code 1 at step 2", "exit_code"),
        ({"step": 5}, "died at step 5 (no exit, no exit status recorded)", "unknown"),
    ],
)
def test_what_the_job_event_says_is_the_cause_of_an_end_no_one_injected(job_fields, summary, cause):
    end = only_end([start(1, 1), step(2, 1, 3), job(3, 1, **job_fields)])
    assert (end.summary(), end.cause(), end.planned, end.injected, end.unexplained) == (
        summary,
        cause,
        False,
        None,
        True,
    )


def test_an_exception_the_trainer_caught_names_its_frame_in_the_workbench_not_the_library_s():
    exc = {"type": "RuntimeError", "message": "boom", "frames": [TRAINER_FRAME, TORCH_FRAME]}
    end = only_end(
        [
            start(1, 0),
            ev("exit", 2, replica=0, attempt=0, reason="error", step=7, error="RuntimeError: boom", exception=exc),
            job(2.1, 0, reason="error", exit_code=1, exception=exc, exception_source="exit", step=7),
        ]
    )
    assert end.summary() == "RuntimeError: boom at step 7 (trainers/lite/trainer.py:123 in step)"
    assert (end.cause(), end.exception_source, end.exit_code) == ("exception", "exit", 1)
    assert end.t == 2  # the exit's time: when it ended, not when the controller noticed
    assert end.as_dict()["exception"]["frames"][-1]["function"] == "_call_impl"


def test_an_exception_read_back_from_stderr_counts_when_the_trainer_wrote_no_exit():
    exc = {"type": "ValueError", "message": "bad shape", "frames": [TORCH_FRAME]}
    end = only_end([start(1, 0), job(2, 0, exit_code=1, exception=exc, exception_source="stderr", step=3)])
    assert end.summary() == "ValueError: bad shape at step 3 (torch/nn/modules/module.py:1736 in _call_impl)"
    assert end.exception_source == "stderr"


def test_the_rank_that_failed_first_is_the_cause_of_a_group_s_end():
    processes = [
        {"rank": 1, "signal": "SIGKILL", "t": 2.0},
        {"rank": 0, "exit_code": 1, "t": 2.1},
        {"rank": 2, "exit_code": 1, "t": 2.1},
    ]
    end = only_end(
        [
            start(1, 0),
            ev("exit", 2.2, replica=0, attempt=0, reason="error", step=8, processes=processes, first_failed=1),
            job(2.3, 0, reason="error", exit_code=1, first_failed=1, step=8),
        ]
    )
    assert (end.summary(), end.cause()) == ("rank 1 failed first: SIGKILL at step 8 (not injected)", "SIGKILL")


@pytest.mark.parametrize(
    "exit_reason, job_fields, summary",
    [
        ("completed", {}, "completed at step 100"),
        ("stopped", {"signal": "SIGTERM"}, "stopped at step 100"),
        ("preempted", {"slurm_state": "PREEMPTED"}, "preempted at step 100"),
    ],
)
def test_completed_stopped_and_a_scheduler_s_preemption_are_planned(exit_reason, job_fields, summary):
    end = only_end(
        [
            start(1, 0),
            ev("exit", 2, replica=0, attempt=0, reason=exit_reason, step=100),
            job(3, 0, exit_reason, **job_fields),
        ]
    )
    assert (end.planned, end.unexplained, end.summary(), end.cause()) == (True, False, summary, exit_reason)


def test_a_job_slurm_preempted_without_an_exit_is_planned():
    end = only_end([start(1, 0), job(3, 0, slurm_state="PREEMPTED", signal="SIGTERM", step=5)])
    assert (end.planned, end.cause(), end.summary()) == (True, "preempted", "preempted at step 5")


# -- injected against unplanned ----------------------------------------------------------------------------
def test_a_dashboard_kill_is_injected_and_its_sigkill_is_no_death_to_explain():
    events = [
        start(1, 1),
        step(2, 1, 30),
        ev("fault", 3, action="kill", origin="button", target=1, attempt=0, pid=99),
        job(3.2, 1, signal="SIGKILL", step=30),
    ]
    end = only_end(events)
    assert (end.summary(), end.cause(), end.planned, end.unexplained) == (
        "kill from the dashboard at step 30",
        "injected:kill",
        False,
        False,
    )
    assert end.signal == "SIGKILL" and end.t == 3  # the job's facts are kept; the fault's time is the end's
    # The same SIGKILL with no fault is a death no one explains.
    bare = only_end([e for e in events if e["kind"] != "fault"])
    assert (bare.summary(), bare.cause(), bare.unexplained) == ("SIGKILL at step 30 (not injected)", "SIGKILL", True)


def test_a_fault_that_does_not_end_the_process_explains_no_end():
    end = only_end(
        [
            start(1, 1),
            step(2, 1, 4),
            ev("fault", 3, action="hang", origin="cli", target=1, attempt=0, seconds=5),
            job(9, 1, signal="SIGSEGV", step=4),
        ]
    )
    assert (end.injected, end.summary()) == (None, "SIGSEGV at step 4 (not injected)")


def test_a_process_that_outlived_a_fault_meant_to_end_it_and_completed_ended_by_completing():
    """Seen on the dev cluster: a 5 s ``slurmd_kill`` leaves running steps alone; the job completed at step 300
    and its end was told as that fault. A process that completed was not ended by it."""
    events = [
        start(1, 1, node="n3"),
        ev("fault", 2, action="slurmd_kill", origin="schedule", target=1, attempt=0, node="n3", seconds=5),
        ev("fault", 7, action="resume", origin="schedule", target="n3", resumed="slurmd_kill", node="n3"),
        step(50, 1, 300),
        ev("exit", 51, replica=1, attempt=0, reason="completed", step=300),
        job(52, 1, reason="completed", slurm_state="COMPLETED", step=300),
    ]
    (end,) = fold(events).ends
    assert (end.injected, end.planned, end.cause(), end.summary()) == (None, True, "completed", "completed at step 300")
    (row,) = analysis.recovery_timeline(events).to_dict("records")
    assert (row["action"], row["cause"], row["end"]) == ("slurmd_kill", None, None), row


def test_a_fault_on_an_earlier_attempt_does_not_explain_the_next_one_s_death():
    state = fold(
        [
            start(1, 1),
            ev("fault", 2, action="kill", origin="schedule", target=1, attempt=0),
            job(2.1, 1, signal="SIGKILL"),
            ev("restart", 2.2, replica=1, attempt=1, reason="died", from_step=3),
            start(3, 1, attempt=1),
            step(4, 1, 6, attempt=1),
            job(5, 1, attempt=1, signal="SIGKILL", step=6),
        ]
    )
    first, second = state.ends
    assert (first.attempt, first.cause(), second.attempt, second.cause()) == (0, "injected:kill", 1, "SIGKILL")
    assert state.replicas[1].last_end is second and second.summary() == "SIGKILL at step 6 (not injected)"


def test_a_node_fault_is_the_injected_end_of_every_group_on_that_node():
    state = fold(
        [
            start(1, 0, node="n1"),
            start(1, 1, node="n2"),
            start(1, 2, node="n2"),
            step(2, 2, 12),
            ev("fault", 3, action="node_down", origin="schedule", target=1, attempt=0, node="n2", seconds=10),
            job(4, 1, slurm_state="NODE_FAIL", node="n2"),
            job(4, 2, slurm_state="NODE_FAIL", node="n2", step=12),
            job(5, 0, signal="SIGABRT", step=12),
        ]
    )
    by = {c.replica: c for c in state.ends}
    assert by[1].summary() == "node_down from the schedule"
    assert by[2].summary() == "node_down of node n2 from the schedule at step 12"
    assert (by[2].cause(), by[2].slurm_state) == ("injected:node_down", "NODE_FAIL")
    assert (by[0].cause(), by[0].unexplained) == ("SIGABRT", True)  # on n1: the node fault is no alibi


def test_an_injected_preempt_is_injected_not_a_scheduler_s_preemption():
    end = only_end(
        [
            start(1, 0),
            ev("exit", 2.9, replica=0, attempt=0, reason="preempted", step=5),  # written before the fault's line
            ev("fault", 3, action="preempt", origin="api", target=0, attempt=0),
            job(3.5, 0, reason="preempted", exit_code=0, step=5),
        ]
    )
    assert (end.planned, end.cause(), end.summary()) == (False, "injected:preempt", "preempt from the API at step 5")


def test_a_one_job_trainer_s_ranks_end_with_the_rank_a_fault_killed():
    """ddp-restart: one job for every rank; a kill of rank 1 ends the job (the slot is replica 0) and rank 2."""
    events = [
        start(1, 0),
        start(1, 1),
        start(1, 2),
        ev("fault", 2, action="kill", origin="cli", target=1, attempt=0),
        ev("exit", 2.05, replica=2, attempt=0, reason="error", step=4, error="RuntimeError: Connection closed by peer"),
        job(2.1, 0, signal="SIGKILL", step=4),
    ]
    state = fold(events, one_job=True)
    assert {c.replica: c.cause() for c in state.ends} == {0: "injected:kill", 1: "injected:kill", 2: "injected:kill"}
    assert state.replicas[0].last_end.summary() == "kill of replica 1 from the CLI at step 4"
    # Told nothing of one job (an elastic trainer's groups), the other groups' ends are their own.
    alone = {c.replica: c.cause() for c in fold(events).ends}
    assert alone == {0: "SIGKILL", 1: "injected:kill", 2: "exception"}


# -- the fold is incremental -------------------------------------------------------------------------------
def _story() -> list[dict]:
    exc = {"type": "RuntimeError", "message": "boom", "frames": [TRAINER_FRAME]}
    return [
        start(1, 0),
        start(1, 1),
        start(1, 2),
        step(2, 0, 10),
        step(2, 1, 10),
        ev("fault", 3, action="kill", origin="button", target=1, attempt=0),
        job(3.2, 1, signal="SIGKILL", step=10),
        ev("restart", 3.3, replica=1, attempt=1, reason="died", from_step=10),
        start(4, 1, attempt=1),
        ev("exit", 5, replica=0, attempt=0, reason="error", step=11, error="RuntimeError: boom", exception=exc),
        job(5.1, 0, reason="error", exit_code=1, exception=exc, exception_source="exit", step=11),
        step(6, 1, 12, attempt=1),
        job(7, 1, attempt=1, oom="memory_cgroup", signal="SIGKILL", step=12),
        ev("exit", 8, replica=2, attempt=0, reason="completed", step=20),
        job(8.1, 2, reason="completed", exit_code=0, step=20),
    ]


def _records(state: RunState) -> list[dict]:
    return [c.as_dict() for c in state.ends]


@pytest.mark.parametrize("piece", [1, 2, 3, 5])
def test_folding_in_pieces_gives_what_folding_at_once_gives(piece):
    events = _story()
    whole = fold(events)
    state = RunState(3, 100)
    for i in range(0, len(events), piece):
        state.apply(events[i : i + piece])
    assert _records(state) == _records(whole)
    assert [c.summary() for c in whole.ends] == [
        "kill from the dashboard at step 10",
        "RuntimeError: boom at step 11 (trainers/lite/trainer.py:123 in step)",
        "killed by the kernel's OOM killer at step 12",
        "completed at step 20",
    ]
    assert [v.last_end.attempt for _, v in sorted(whole.replicas.items())] == [0, 1, 0]


def test_a_fault_read_after_its_job_in_a_later_poll_still_explains_the_end():
    """The controller can see the job gone before the injector's ``fault`` line is written (another file)."""
    events = _story()
    fault = next(e for e in events if e["kind"] == "fault")
    late = RunState(3, 100)
    late.apply([e for e in events if e is not fault])
    late.apply([fault])
    assert _records(late) == _records(fold(events))


def test_malformed_end_fields_are_dropped_not_fatal():
    end = only_end(
        [
            start(1, 0),
            job(
                2,
                0,
                signal="not a signal",
                exit_code="1",
                exception={"type": 3},
                processes="rank 1",
                first_failed="1",
                last_lines=[1, 2],
                log=["../../etc/passwd"],
                step=4,
            ),
        ]
    )
    assert (end.signal, end.exit_code, end.exception, end.first_failed) == (None, None, None, None)
    assert end.summary() == "died at step 4 (no exit, no exit status recorded)"


# -- a run directory: status, why, Run.ends(), the exporter -------------------------------------------------
@pytest.fixture
def crashed_run(tmp_path):
    """Three groups: 1 killed from the dashboard, 0 dead of a RuntimeError (its stderr in jobs/), 2 of SIGSEGV."""
    spec = load_spec("demo", ["replicas=3", "faults=[]"], run_root=str(tmp_path)).to_dict()
    run_dir = rundir.create(tmp_path, "r1", spec)
    jobs = run_dir / "jobs"
    jobs.mkdir(exist_ok=True)
    stderr = ["step 11 ok"] * 30 + [
        "Traceback (most recent call last):",
        '  File "/src/workbench/trainers/lite/trainer.py", line 123, in step',
        "RuntimeError: boom",
    ]
    (jobs / "00_0_log.err").write_text("\n".join(stderr) + "\n")
    ctl = EventWriter(run_dir, "controller", run="r1")
    writers = {r: EventWriter(run_dir, f"replica-{r}.attempt-0", run="r1", replica=r, attempt=0) for r in range(3)}
    for w in writers.values():
        w.emit("start", role="replica", trainer="torchft-lite", node="n1")
        w.emit("step", step=10, loss=1.0, committed=True, participating=True)
    EventWriter(run_dir, "control-1", run="r1").emit("fault", action="kill", origin="button", target=1, attempt=0)
    ctl.emit("job", replica=1, attempt=0, job_id="10", state="ended", clean=False, reason="died", signal="SIGKILL")
    exc = {"type": "RuntimeError", "message": "boom", "frames": [TRAINER_FRAME]}
    writers[0].emit("exit", reason="error", step=11, error="RuntimeError: boom", exception=exc)
    ctl.emit(
        "job",
        replica=0,
        attempt=0,
        job_id="00",
        state="ended",
        clean=False,
        reason="error",
        exit_code=1,
        step=11,
        exception=exc,
        exception_source="exit",
        last_lines=stderr[-3:],
        log={"stderr": "jobs/00_0_log.err", "stdout": "../outside.out"},
    )
    ctl.emit(
        "job", replica=2, attempt=0, job_id="20", state="ended", clean=False, reason="died", signal="SIGSEGV", step=10
    )
    return run_dir


def test_status_names_each_group_s_last_unplanned_end(crashed_run):
    out = workbench_cli("status", str(crashed_run))
    assert out.returncode == 0, out.stderr
    lines = {ln.split(":")[0].strip(): ln for ln in out.stdout.splitlines() if ln.startswith("  replica ")}
    assert lines["replica 0"].endswith(
        "last end: attempt 0, RuntimeError: boom at step 11 (trainers/lite/trainer.py:123 in step)"
    )
    assert lines["replica 1"].endswith("last end: attempt 0, kill from the dashboard at step 10")
    assert lines["replica 2"].endswith("last end: attempt 0, SIGSEGV at step 10 (not injected)")
    st = json.loads(workbench_cli("status", str(crashed_run), "--json").stdout)
    assert st["replicas"]["2"]["last_end"]["cause"] == "SIGSEGV"
    by = {(e["replica"], e["attempt"]): e for e in st["ends"]}
    assert by[(0, 0)]["exception"]["frames"] == [TRAINER_FRAME] and by[(0, 0)]["exit_code"] == 1
    assert by[(1, 0)]["injected"]["origin"] == "button" and by[(1, 0)]["signal"] == "SIGKILL"


def test_why_prints_every_end_with_its_frames_and_the_job_s_last_lines(crashed_run):
    out = workbench_cli("why", str(crashed_run), "--lines", "3")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "replica 1 attempt 0: kill from the dashboard at step 10  [injected]" in text
    assert "replica 2 attempt 0: SIGSEGV at step 10 (not injected)  [unplanned: SIGSEGV]" in text
    assert '    File "/src/workbench/trainers/lite/trainer.py", line 123, in step' in text
    assert "  last 3 lines of jobs/00_0_log.err:\n    Traceback (most recent call last):\n" in text
    assert "    step 11 ok" not in text  # only the last --lines lines
    assert "  log ../outside.out: outside the run directory, not read" in text
    one = workbench_cli("why", str(crashed_run), "--replica", "2")
    assert (
        one.returncode == 0 and one.stdout.startswith("replica 2 attempt 0: SIGSEGV") and "replica 0" not in one.stdout
    )
    none = workbench_cli("why", str(crashed_run), "--replica", "2", "--attempt", "4")
    assert (none.returncode, none.stdout) == (0, "r1: no ended attempt replica 2 attempt 4\n")


def test_why_refuses_bad_input_in_one_line(crashed_run):
    for args, message in (
        (["--lines", "-1"], "workbench why: --lines: -1; allowed: 0-1000"),
        (["--replica", "7"], "workbench why: --replica: 7; allowed: 0..2"),
    ):
        out = workbench_cli("why", str(crashed_run), *args)
        assert (out.returncode, out.stderr.splitlines()) == (2, [message]), args


def test_run_ends_is_one_row_per_ended_attempt(crashed_run):
    df = attach(crashed_run).ends()
    assert df[["replica", "cause", "planned"]].values.tolist() == [
        [1, "injected:kill", False],
        [0, "exception", False],
        [2, "SIGSEGV", False],
    ]
    assert df.loc[df["replica"] == 0, "where"].item() == "trainers/lite/trainer.py:123 in step"


def test_the_exporter_counts_ends_by_cause_and_says_each_group_s_last(crashed_run):
    collector = wb_exporter.RunCollector(attach(crashed_run))
    server, thread = wb_exporter.serve(collector, 0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30) as r:
            body = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    ends = sorted(ln for ln in body.splitlines() if ln.startswith("workbench_attempt_ends_total{"))
    assert ends == [
        'workbench_attempt_ends_total{cause="SIGSEGV",replica="2",run="r1"} 1.0',
        'workbench_attempt_ends_total{cause="exception",replica="0",run="r1"} 1.0',
        'workbench_attempt_ends_total{cause="injected:kill",replica="1",run="r1"} 1.0',
    ]
    last = [ln for ln in body.splitlines() if ln.startswith("workbench_replica_last_end{") and 'replica="2"' in ln]
    assert len(last) == 1 and 'cause="SIGSEGV"' in last[0] and 'summary="SIGSEGV at step 10 (not injected)"' in last[0]


# -- the recovery timeline ---------------------------------------------------------------------------------
def test_the_recovery_timeline_has_a_row_per_unplanned_end_with_its_phases():
    exc = {"type": "RuntimeError", "message": "boom", "frames": [TRAINER_FRAME]}
    b = 1000.0
    events = [ev("start", b, role="controller", trainer="torchft-lite")]
    events += [start(b + 0.5, r) for r in range(3)]
    events += [step(b + s, r, s) for s in range(1, 6) for r in range(3)]
    events += [
        ev("exit", b + 5.5, replica=2, attempt=0, reason="error", step=5, error="RuntimeError: boom", exception=exc),
        job(b + 5.75, 2, reason="error", exit_code=1, exception=exc, exception_source="exit", step=5),
        ev("restart", b + 6, replica=2, attempt=1, reason="error", from_step=5),
        start(b + 6.5, 2, attempt=1),
        ev("phase", b + 7, replica=2, attempt=1, phase="imports_done"),
        ev("heal", b + 7.5, replica=2, attempt=1, step=7, seconds=0.25),
    ]
    events += [step(b + s, r, s) for s in range(6, 10) for r in range(2)]
    events += [step(b + s, 2, s, attempt=1) for s in range(8, 10)]
    events += [
        ev("fault", b + 9.5, action="kill", origin="schedule", target=1, attempt=0),
        job(b + 9.75, 1, signal="SIGKILL", step=9),
        ev("restart", b + 10, replica=1, attempt=1, reason="died", from_step=9),
        start(b + 10.5, 1, attempt=1),
        ev("heal", b + 11, replica=1, attempt=1, step=11, seconds=0.25),
    ]
    events += [step(b + s, 0, s) for s in range(10, 13)] + [step(b + s, 2, s, attempt=1) for s in range(10, 13)]
    events.append(step(b + 11.5, 1, 11, attempt=1))
    timeline = analysis.recovery_timeline(events)
    got = timeline[["action", "target", "cause", "end", "noticed", "restarted", "replacement_started"]]
    assert got.values.tolist() == [
        [
            "unplanned",
            2,
            "exception",
            "RuntimeError: boom at step 5 (trainers/lite/trainer.py:123 in step)",
            0.25,
            0.5,
            1.0,
        ],
        ["kill", 1, "injected:kill", "kill from the schedule at step 9", 0.25, 0.5, 1.0],
    ]
    assert timeline["heal_done"].tolist() == [2.0, 1.5]
    assert timeline["participating"].tolist() == [2.5, 2.0]
    assert analysis.ends_process(timeline).tolist() == [False, True]  # an unplanned end is no kill
    assert analysis.summary(events, load_spec("demo", ["replicas=3"]), timeline)["kill_to_rejoin_s"] == 2.0


def test_the_report_has_a_table_of_the_ends_with_their_causes(crashed_run):
    from workbench.apps.report import write_report

    page = write_report(crashed_run).read_text()
    table = page.split("<h2>Attempt ends</h2>", 1)[1].split("</table>", 1)[0]
    rows = table.split("<tr>")[1:]  # the header row has a style
    assert len(rows) == 3
    assert "<td>kill from the dashboard at step 10</td>" in rows[0]
    assert "<td>RuntimeError: boom at step 11 (trainers/lite/trainer.py:123 in step)</td>" in rows[1]
    assert "<td>SIGSEGV</td>" in rows[2] and "<td>SIGSEGV at step 10 (not injected)</td>" in rows[2]
    assert "None" not in table


# -- one real run ------------------------------------------------------------------------------------------
def _stepped(replica: int, attempt: int) -> Callable:
    """The attempt committed a step with its peers (healed, for a relaunch) and its process is alive."""

    def done(r) -> bool:
        return r.run_state.replicas[replica].live_proc(attempt) is not None and any(
            e["kind"] == "step"
            and e.get("replica") == replica
            and e.get("attempt") == attempt
            and e.get("committed")
            and e.get("participating", True)
            for e in r.events_read
        )

    return done


@pytest.mark.slow
def test_a_real_run_tells_an_exception_an_injected_kill_and_a_segfault_apart(start_run, monkeypatch):
    """torchft-lite, 3 groups: group 1 raises at step 5 (the trainers' test hook), group 2 is killed with
    ``workbench kill`` and group 0 gets a SIGSEGV from outside the workbench; each is relaunched."""
    monkeypatch.setenv(raise_hook.AT_STEP, "5")
    monkeypatch.setenv(raise_hook.REPLICA, "1")
    run = start_run("demo", ["steps=100000", "faults=[]", "replicas=3", "min_replicas=1", "model.step_delay_s=0.05"])
    run.wait_for(_stepped(1, 1), timeout=300)
    run.wait_for(_stepped(2, 0), timeout=60)
    kill = workbench_cli("kill", str(run.run_dir), "--replica", "2")
    assert kill.returncode == 0, kill.stderr
    run.wait_for(_stepped(2, 1), timeout=120)
    proc = run.run_state.replicas[0].live_proc(0)
    assert proc is not None and proc.signal(signal.SIGSEGV, run.cluster.marker)
    run.wait_for(_stepped(0, 1), timeout=120)

    ends = run.ends().set_index(["replica", "attempt"])
    assert ends.loc[(1, 0), "cause"] == "exception"
    assert re.fullmatch(r"trainers/raise_hook\.py:\d+ in maybe_raise", ends.loc[(1, 0), "where"])
    assert ends.loc[(2, 0), ["cause", "origin"]].tolist() == ["injected:kill", "cli"]
    assert ends.loc[(0, 0), "cause"] == "SIGSEGV" and ends.loc[(0, 0), "summary"].startswith("SIGSEGV at step ")
    assert not ends["planned"].any()

    status = workbench_cli("status", str(run.run_dir)).stdout
    assert "(not injected)" in status and "kill from the CLI at step " in status, status
    why = workbench_cli("why", str(run.run_dir), "--replica", "1", "--attempt", "0", "--lines", "5")
    assert why.returncode == 0, why.stderr
    (raised,) = [e for e in run.events_read if e["kind"] == "exit" and (e["replica"], e["attempt"]) == (1, 0)]
    step = raised["step"]  # the first step at or past 5: a group that joined late heals past step 5
    message = raise_hook.MESSAGE.format(step=step, replica=1, rank=0, attempt=0)
    assert why.stdout.startswith(f"replica 1 attempt 0: RuntimeError: {message} at step {step}"), why.stdout
    assert re.search(r'/workbench/trainers/raise_hook\.py", line \d+, in maybe_raise\n', why.stdout), why.stdout
    assert "  last 5 lines of jobs/" in why.stdout, why.stdout

    timeline = analysis.recovery_timeline(run.event_records()).set_index(["action", "target"])
    assert timeline.loc[("unplanned", 1), "cause"] == "exception"
    assert timeline.loc[("unplanned", 0), "cause"] == "SIGSEGV"
    assert timeline.loc[("kill", 2), "cause"] == "injected:kill"
    for row in timeline.itertuples():  # death -> the job seen gone -> restart -> the next attempt started
        assert row.noticed <= row.restarted <= row.replacement_started, row
    assert (timeline.loc[[("unplanned", 1), ("unplanned", 0)], "noticed"] >= 0).all()  # its exit, or the job itself
    assert run.stop()["state"] == "stopped"
