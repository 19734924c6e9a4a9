"""A process proves it is the run's before the workbench signals it (issue #42, item 1), and ``workbench stop``
names every process it did not stop (item 3).

A PID and its start time are public (``/proc/PID/stat``), so a line in a run's event log can name any process
on the machine. Each test here writes such a line by hand, naming a real process of its own (a ``sleep``) with
the right PID and start time, but without the run's marker in its environment, and checks that every path
that signals refuses it, says so, and still signals the run's own processes (a second ``sleep`` started with
the marker), so that each test can fail both ways.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from workbench.cluster.procs import HOST, RUN_MARKER, Marker, Proc, start_time
from workbench.errors import FaultError
from workbench.run import rundir
from workbench.run.handle import attach
from workbench.spec.load import load_spec

from .conftest import kill_pids, workbench_cli


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


@contextmanager
def processes(*envs):
    """One ``sleep`` per entry of ``envs`` (extra environment; None: none of the workbench's markers), each
    killed by PID at the end, also on failure."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_") or not k.endswith("_MARKER")}
    started = []
    try:
        for extra in envs:
            started.append(subprocess.Popen(["sleep", "300"], env={**base, **(extra or {})}))
        for p in started:
            _wait(lambda p=p: start_time(p.pid) is not None, 10, f"sleep {p.pid} to start")
        yield started
    finally:
        kill_pids(p.pid for p in started)
        for p in started:
            p.wait()


def running(p: subprocess.Popen) -> bool:
    """Alive and not stopped (SIGSTOP)."""
    return p.poll() is None and psutil.Process(p.pid).status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)


def identity(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "host": HOST, "pid_start": start_time(p.pid)}


def forge(directory: Path, *events: dict) -> None:
    """Append ``events`` to a writer file of the run's (or sweep's) event log, as anyone who can write it could."""
    with open(directory / "events" / "forged.jsonl", "a") as f:
        for e in events:
            f.write(json.dumps({"t": time.time(), **e}) + "\n")


def fake_run(tmp_path: Path, **overrides) -> Path:
    """A run directory as ``submit`` makes it (run.json, the process marker), with no controller started."""
    spec = load_spec("demo", {"faults": [], "replicas": 2, "min_replicas": 1, **overrides})
    return rundir.create(tmp_path / "runs", "20250101-000000-identity-abcdef", spec.to_dict())


def test_a_forged_start_line_gets_no_signal_from_faults_or_stop_and_stop_names_it(tmp_path):
    run_dir = fake_run(tmp_path)
    marker = Marker.of(run_dir)
    assert marker is not None and stat_mode(run_dir / "process-marker") == 0o600
    with processes(None, marker.env(), None) as (stranger, own, stranger_helper):
        forge(
            run_dir,
            {"kind": "start", "replica": 0, "attempt": 0, **identity(stranger)},
            {"kind": "start", "replica": 1, "attempt": 0, **identity(own)},
            {
                "kind": "fault",
                "action": "straggler",
                "target": 1,
                "origin": "api",
                "undo_helper": [stranger_helper.pid, HOST, start_time(stranger_helper.pid)],
            },
        )
        run = attach(run_dir)
        run.refresh()
        assert run.run_state.replicas[0].live_proc().pid == stranger.pid
        assert run.run_state.host_faults, "the forged fault's undo helper is not in the fold"

        for how in ("kill", "hang", "preempt"):
            with pytest.raises(FaultError, match=rf"pid {stranger.pid} \(sleep\) does not carry the run's marker"):
                run.kill(replica=0, how=how, seconds=5)
        cli = workbench_cli("kill", str(run_dir), "--replica", "0", timeout=120)
        assert cli.returncode != 0 and "not signalled" in cli.stderr, (cli.returncode, cli.stderr)
        assert running(stranger)

        stop = workbench_cli("stop", str(run_dir), timeout=120)
        assert stop.returncode == 1, (stop.stdout, stop.stderr)
        assert stop.stdout.strip() == "stopped"
        assert f"not stopped: pid {stranger.pid} (sleep) does not carry the run's marker" in stop.stderr
        assert f"not stopped: pid {stranger_helper.pid} (sleep) does not carry" in stop.stderr
        _wait(lambda: own.poll() is not None, 10, "the run's own process to be killed")
        assert own.returncode == -signal.SIGKILL
        assert running(stranger) and running(stranger_helper)
        run.refresh()
        (end,) = [e for e in run.events_read if e["kind"] == "run_end"]
        assert any(f"pid {stranger.pid} (sleep)" in line for line in end["not_signalled"]), end


def test_a_forged_controller_line_is_never_sent_the_stop(tmp_path):
    run_dir = fake_run(tmp_path)
    with processes(None) as (stranger,):
        forge(run_dir, {"kind": "start", "role": "controller", **identity(stranger)})
        result = attach(run_dir).stop(timeout=5)
        assert result["state"] == "stopped"
        assert [line.split(" (")[0] for line in result["not_stopped"]] == [f"pid {stranger.pid}"]
        assert running(stranger)


def test_a_run_directory_without_a_marker_signals_nothing_and_says_why(tmp_path):
    """An older workbench's run: nothing proves a process is its, so stop signals nothing and ends nothing."""
    run_dir = fake_run(tmp_path)
    old_value = Marker.of(run_dir).value
    (run_dir / "process-marker").unlink()
    with processes({RUN_MARKER: old_value}) as (own,):
        forge(run_dir, {"kind": "start", "role": "controller", **identity(own)})
        stop = workbench_cli("stop", str(run_dir), timeout=120)
        assert stop.returncode == 1 and "an older workbench made it" in stop.stderr, stop.stderr
        assert running(own)
        with pytest.raises(FaultError, match="no process marker"):
            forge(run_dir, {"kind": "start", "replica": 0, "attempt": 0, **identity(own)})
            attach(run_dir).kill(replica=0)
        assert running(own)
        assert not any(e["kind"] == "run_end" for e in attach(run_dir).event_records())


def test_the_marker_proves_the_owner_and_the_secret_not_a_claim(tmp_path):
    run_dir = fake_run(tmp_path)
    marker = Marker.of(run_dir)
    assert marker.uid == run_dir.stat().st_uid
    claims = {RUN_MARKER: "0" * len(marker.value)}  # the variable, without the secret
    with processes(marker.env(), claims) as (own, claimant):
        assert Proc(**_as_proc(own)).why_not_ours(marker) is None
        assert "does not carry the run's marker" in Proc(**_as_proc(claimant)).why_not_ours(marker)
        other_owner = Marker(marker.var, marker.value, marker.uid + 1)
        assert "not to the owner of the run" in Proc(**_as_proc(own)).why_not_ours(other_owner)
        assert "no process marker" in Proc(**_as_proc(own)).why_not_ours(None)
        assert not Proc(**_as_proc(claimant)).signal(signal.SIGKILL, marker)
        assert running(claimant)


def test_the_undo_helper_continues_only_the_runs_own_processes(tmp_path):
    """The detached helper that ends a hang: a forged entry in its list is never sent SIGCONT."""
    from workbench.faults import undo

    run_dir = fake_run(tmp_path)
    marker = Marker.of(run_dir)
    with processes(marker.env(), None) as (own, stranger):
        for p in (own, stranger):
            os.kill(p.pid, signal.SIGSTOP)
            _wait(lambda p=p: not running(p), 10, "SIGSTOP to land")
        helper = undo.later(
            run_dir,
            "hang",
            0.2,
            signals=[[*Proc(**_as_proc(p)).as_record(), int(signal.SIGCONT)] for p in (own, stranger)],
            fields={"target": 0},
        )
        assert Proc(*helper).why_not_ours(marker) is None  # the helper is the run's: a stop mid-fault may end it
        psutil.Process(helper[0]).wait(timeout=60)
        assert running(own)
        assert not running(stranger) and stranger.poll() is None
        os.kill(stranger.pid, signal.SIGCONT)


def test_sweep_stop_signals_only_a_controller_that_proves_it_is_the_sweeps(tmp_path):
    from workbench.experiments.sweep import sweepdir
    from workbench.experiments.sweep.handle import attach_sweep

    base = load_spec("demo", {"faults": [], "run_root": str(tmp_path / "runs")})
    stranger_dir = sweepdir.create(base, [{"steps": 10}], 1)
    own_dir = sweepdir.create(base, [{"steps": 10}], 1)
    with processes(None, Marker.of(own_dir).env()) as (stranger, own):
        for sweep_dir, p in ((stranger_dir, stranger), (own_dir, own)):
            forge(sweep_dir, {"kind": "start", "role": "sweep-controller", "sweep": sweep_dir.name, **identity(p)})
            attach_sweep(sweep_dir).stop(timeout=1)
        assert running(stranger)
        _wait(lambda: own.poll() is not None, 10, "the sweep's own controller to get SIGTERM")
        assert own.returncode == -signal.SIGTERM
        events = attach_sweep(stranger_dir).events()
        warnings = list(events.loc[events["kind"] == "warning", "message"])
        assert any(f"pid {stranger.pid} (sleep) does not carry" in w for w in warnings), warnings
        assert attach_sweep(stranger_dir).state() == "stopped"


def test_cluster_down_and_slurmd_kill_signal_only_daemons_that_carry_the_clusters_marker(tmp_path, monkeypatch):
    """The dev cluster's state file names its daemons by PID and start time; ``down`` and the ``slurmd_kill``
    fault signal one only if it also carries the state directory's marker."""
    from workbench import devcluster
    from workbench.cluster.slurm import statedir
    from workbench.devcluster import lifecycle
    from workbench.devcluster.layout import DevClusterError, Layout, write_state

    layout = Layout(tmp_path / "slurm")
    layout.root.mkdir()
    marker = Marker.create(layout.root, statedir.DAEMON_MARKER)
    monkeypatch.setattr(lifecycle, "remove_network", lambda: [])  # the machine's namespaces are not this test's
    with processes(None, marker.env()) as (stranger, own):
        daemons = {
            f"slurmd-{node}": {"pid": p.pid, "started": start_time(p.pid), "argv": ["slurmd", "-N", node]}
            for node, p in (("n1", stranger), ("n2", own))
        }
        write_state(layout, {"daemons": daemons, statedir.RESTART_SLURMD: ["true"]})
        conf = str(layout.root / "etc" / "slurm.conf")
        with pytest.raises(LookupError, match=rf"pid {stranger.pid} \(sleep\) does not carry"):
            statedir.recorded_slurmd(conf, "n1")
        assert statedir.recorded_slurmd(conf, "n2")[0].pid == own.pid

        with pytest.raises(DevClusterError, match=rf"stopped: slurmd-n2; not stopped: slurmd-n1: pid {stranger.pid}"):
            devcluster.down(layout.root)
        assert running(stranger)
        _wait(lambda: own.poll() is not None, 25, "the cluster's own daemon to stop")
        assert list(json.loads(layout.state_file.read_text())["daemons"]) == ["slurmd-n1"]


def _as_proc(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "host": HOST, "started": start_time(p.pid)}


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.mark.slow
def test_a_real_runs_processes_carry_the_marker_and_its_shutdown_refuses_a_forged_one(start_run, run_root):
    """Every process a run starts (controller, lighthouse, fork server, jobs) proves it is the run's, so the
    controller's shutdown stops them; a forged line for a group's attempt is refused and named."""
    run = start_run(
        "demo", {"faults": [], "replicas": 2, "min_replicas": 1, "steps": 100000, "model.step_delay_s": 0.02}
    )
    run.wait_for_step(3, timeout=180)
    marker = run.cluster.marker
    ctl = run.run_state.controller
    tree = [ctl, *ctl.descendants()]
    assert len(tree) >= 4  # the controller, the lighthouse, the fork server, two groups
    for p in [*tree, *run.run_state.live_processes()]:
        assert p.why_not_ours(marker) is None, p
    with processes(None) as (stranger,):
        forge(run.run_dir, {"kind": "start", "replica": 0, "attempt": 0, "run": run.id, **identity(stranger)})
        _wait(lambda: run.refresh() or run.run_state.replicas[0].live_proc().pid == stranger.pid, 10, "the fold")
        stop = workbench_cli("stop", str(run.run_dir), timeout=120)
        assert stop.returncode == 1 and stop.stdout.strip() == "stopped", (stop.stdout, stop.stderr)
        named = [line for line in stop.stderr.splitlines() if "not stopped:" in line]
        assert len(named) == 1 and f"pid {stranger.pid} (sleep)" in named[0], stop.stderr
        _wait(lambda: not any(p.alive() for p in tree), 30, "every process of the run to exit")
        assert running(stranger)
        warnings = [e["message"] for e in run.event_records() if e["kind"] == "warning"]
        assert any(f"replica 0, attempt 0: pid {stranger.pid} (sleep)" in w for w in warnings), warnings
