"""Sweeps, comparison and replay, on the local executor with real runs.

One sweep of three tiny single-group runs (one of them made to fail at run
time: a scheduled SIGKILL with ``relaunch: off``) is shared by the tests that
read it; its failing point is then replayed. Every sweep, run and process a
test starts is stopped by PID in the fixtures' finalizers, also on failure.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

import workbench as wb
from workbench.analysis import compare, compare_figures
from workbench.experiments.sweep import SWEEPS_DIR, expand_points, list_sweeps
from workbench.run.replay import replay_spec
from workbench.widgets.comparison import ComparisonWidget, active_comparisons
from workbench.widgets.plot import PLOTLY_MIME

from .conftest import kill_pids, workbench_cli

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
HB = "lighthouse.heartbeat_timeout_ms"
BASE = {"replicas": 1, "min_replicas": 1, "steps": 30, "faults": [], "model.step_delay_s": 0.05}
KILL_AT = 10
FAILING = {"model.lr": 1e-2, "relaunch": "off", "faults": [{"action": "kill", "target": 0, "at_step": KILL_AT}]}
POINTS = [{"model.lr": 1e-3}, {"model.lr": 3e-3}, FAILING]


def _stop_everything(things) -> None:
    for thing in things:
        try:
            thing.stop(timeout=60) if isinstance(thing, wb.Sweep) else thing.stop(timeout=20)
        finally:
            kill_pids(thing.pids())
            proc = thing._controller
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def tracked(run_root):
    """A list to put every Sweep and Run a test starts into; all are stopped, then killed by PID."""
    things: list = []
    yield things
    _stop_everything(things)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    """The shared 3-point sweep, run to the end (module scope: its runs are the expensive part)."""
    root = tmp_path_factory.mktemp("sweep") / "runs"
    things: list = []
    try:
        sw = wb.sweep("demo", {**BASE, "name": "sw", "run_root": str(root)}, points=POINTS, max_parallel=2)
        things.append(sw)
        sw.wait(timeout=400)
        yield sw, things
    finally:
        _stop_everything(things)


# -- points and validation (nothing runs) ----------------------------------------


def test_grid_points_and_random_expand_to_points():
    grid = expand_points(grid={HB: [500, 1000], "seed": [1, 2, 3]})
    assert grid[:3] == [{HB: 500, "seed": 1}, {HB: 500, "seed": 2}, {HB: 500, "seed": 3}] and len(grid) == 6
    assert expand_points(points=[{"seed": 1}, {"seed": 2, "steps": 5}]) == [{"seed": 1}, {"seed": 2, "steps": 5}]
    drawn = expand_points(random={HB: [500, 1000, 5000], "seed": [0, 1]}, n=8, seed=3)
    assert len(drawn) == 8 and all(p[HB] in (500, 1000, 5000) and p["seed"] in (0, 1) for p in drawn)
    assert drawn == expand_points(random={HB: [500, 1000, 5000], "seed": [0, 1]}, n=8, seed=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(grid={"lighthouse.heartbeat_timeot_ms": [500, 1000]}),
            "lighthouse.heartbeat_timeot_ms: unknown key; allowed:",
        ),
        (dict(grid={HB: []}), f"grid {HB}: empty list"),
        (dict(grid={HB: [500, "fast"]}), f"grid {HB}='fast': invalid spec: {HB}: Input should be a valid integer"),
        (dict(grid={HB: 500}), f"grid {HB}: expected a list of values, got int 500"),
        (dict(grid={HB: [10]}), f"grid {HB}=10: invalid spec: {HB}: Input should be greater than or equal to 50"),
        (dict(grid={"min_replicas": [1, 5]}), "min_replicas (5) must be <= replicas (3)"),
        (
            dict(points=[{"seed": 1}, {"faults": [{"action": "kill", "target": 7, "at_step": 5}]}]),
            (
                "sweep point 1 (faults=[{'action': 'kill', 'target': 7, 'at_step': 5}]): invalid spec:",
                "faults[0].target (7) must be < replicas (3)",
            ),
        ),
        (dict(points=[]), "points: expected a non-empty list"),
        (dict(grid={HB: [500]}, points=[{"seed": 1}]), "give exactly one of grid, points, random (got grid, points)"),
        (dict(random={HB: [500, 1000]}), "n: a random sweep needs n"),
        (dict(grid={HB: [500]}, max_parallel=0), "max_parallel: expected an integer >= 1, got 0"),
        (dict(grid={HB: [500]}, lock="heavy.lock", lock_turn_s=-1), "lock_turn_s: expected seconds from 0 to 3600"),
    ],
)
def test_bad_sweeps_give_a_clear_error_and_create_nothing(run_root, kwargs, message):
    with pytest.raises(wb.SpecError) as err:
        wb.sweep("demo", **kwargs)
    for part in (message,) if isinstance(message, str) else message:
        assert part in str(err.value)
    assert not run_root.exists()


def test_cli_sweep_rejects_a_bad_value_before_submitting(run_root):
    out = workbench_cli("sweep", "demo", f"{HB}=500,fast", "steps=20", env={"WORKBENCH_RUN_ROOT": str(run_root)})
    assert out.returncode == 2
    assert f"grid {HB}='fast'" in out.stderr and "valid integer" in out.stderr
    assert not run_root.exists()


# -- a real sweep --------------------------------------------------------------------


def test_sweep_runs_every_point_and_reports_the_failing_one(finished_sweep):
    sw, _ = finished_sweep
    assert sw.state() == "completed"
    status = sw.status()
    assert list(status["point"]) == [0, 1, 2]
    assert list(status["model.lr"]) == [1e-3, 3e-3, 1e-2]
    assert list(status["state"]) == ["completed", "completed", "failed"]

    index = sw.index()
    assert list(index["point"]) == [0, 1, 2] and index["run_dir"].map(lambda d: Path(d).is_dir()).all()
    for i, row in index.iterrows():
        spec = json.loads((Path(row["run_dir"]) / "run.json").read_text())["spec"]
        assert spec["name"] == f"sw-p{i}" and spec["model"]["lr"] == POINTS[i]["model.lr"]
        assert spec["replicas"] == 1 and spec["model"]["step_delay_s"] == 0.05
    failing = json.loads((Path(index["run_dir"][2]) / "run.json").read_text())["spec"]
    assert failing["relaunch"] == "off" and failing["faults"][0]["at_step"] == KILL_AT

    table = sw.table()
    assert len(table) == 3 and list(table["model.lr"]) == [1e-3, 3e-3, 1e-2]
    assert list(table["relaunch"].fillna("")) == ["", "", "off"]
    assert list(table["state"]) == ["completed", "completed", "failed"]
    assert list(table["steps"][:2]) == [30, 30] and table["steps"][2] < 30
    assert table["final_loss"].notna().all() and (table["steps_per_s"] > 0).all()
    assert list(table["faults_injected"]) == [0, 0, 1]

    # At most max_parallel=2 runs were unfinished at any time: from submit to run_end, by the events.
    spans = []
    for run in sw.runs().values():
        ev = run.events()
        spans.append((ev["t"].min(), ev[ev["kind"] == "run_end"]["t"].max()))
    for t, _ in spans:
        assert sum(1 for a, b in spans if a <= t < b) <= 2

    # A new kernel sees the same, and the CLI lists runs and the sweep.
    again = wb.attach_sweep(sw.sweep_dir)
    assert again.status()[["point", "state", "run_dir"]].equals(status[["point", "state", "run_dir"]])
    root = sw.sweep_dir.parent.parent
    assert sw.sweep_dir.parent.name == SWEEPS_DIR and list_sweeps(root) == [sw.sweep_dir]
    ls = workbench_cli("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    assert f"sweep {sw.id}: completed  3 points over model.lr,relaunch,faults  completed=2 failed=1" in ls.stdout
    assert all(Path(d).name in ls.stdout for d in index["run_dir"])


def test_comparison_view_of_the_sweep(finished_sweep):
    sw, _ = finished_sweep
    view = ComparisonWidget(sw, start=False)
    assert view.color_by == "model.lr" and len(view.table) == 3
    assert [t.name for t in view.figure.data] == [
        "p0: lr=0.001",
        "p1: lr=0.003",
        "p2: lr=0.01, relaunch=off, faults=" + str(FAILING["faults"]),
    ]
    assert len(view.figure.data[0].x) == 30 and len(set(t.line.color for t in view.figure.data)) == 3
    assert view.table_panel.value.count("<tr data-state='failed'>") == 1
    assert not view.running and view.ended()
    shown = view.plot_output.outputs[0]["data"][PLOTLY_MIME]["data"]  # what the browser is sent
    assert [t["name"] for t in shown] == [t.name for t in view.figure.data]
    x = shown[0]["x"]  # plotly's typed-array encoding
    assert list(np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"])) == list(view.figure.data[0].x)
    figs = compare_figures.sweep_report_figures(sw)
    assert len(figs) == 3  # loss, figures by model.lr, parallel coordinates (3 swept keys)
    assert sum(1 for t in figs[0].data if t.mode == "lines") == 3
    assert any(t.mode == "markers" for t in figs[0].data)  # the scheduled kill, on the curve


def test_live_comparison_of_an_ended_sweep_draws_it_and_stops_polling(finished_sweep):
    sw, _ = finished_sweep
    view = ComparisonWidget(sw)
    for thread in [t for t in threading.enumerate() if t.name == "wb-comparison"]:
        thread.join(timeout=60)
    assert not view.running and active_comparisons() == {}
    assert "not polling" in view.header.value
    assert len(view.plot_output.outputs[0]["data"][PLOTLY_MIME]["data"]) == 3


def test_replay_repeats_the_spec_and_the_faults(finished_sweep, tracked):
    sw, _ = finished_sweep
    original = sw.runs()[2]
    replay = wb.replay(original.run_dir)
    tracked.append(replay)
    replay.wait(timeout=240)
    assert replay.id != original.id and replay.spec.name == "sw-p2-replay"
    assert {**replay.spec.to_dict(), "name": None} == {**original.spec.to_dict(), "name": None}
    assert json.loads((replay.run_dir / "replay.json").read_text())["of"]["run_id"] == original.id
    assert replay.state() == original.state() == "failed"

    before, after = compare.fault_steps(original), compare.fault_steps(replay)
    assert (
        list(before[["action", "target", "origin"]].itertuples(index=False))
        == list(after[["action", "target", "origin"]].itertuples(index=False))
        == [("kill", 0, "schedule")]
    )
    assert (before["step"] >= KILL_AT).all() and (after["step"] >= KILL_AT).all()
    assert (abs(before["step"] - after["step"]) <= 2).all(), (before, after)

    both = compare_figures.replay_comparison(original, replay)
    assert list(both["table"]["label"]) == ["original", "replay"]
    assert list(both["faults"]["original.step"]) == list(before["step"])
    cli = workbench_cli("ls", str(sw.sweep_dir.parent.parent))
    assert replay.id in cli.stdout


def test_stop_ends_the_running_point_and_skips_the_rest(tracked, run_root):
    # One group, killed: its model state is lost; ``restart`` lets the point go on until the sweep is stopped.
    sw = wb.sweep("demo", {**BASE, "steps": 100000, "on_state_loss": "restart"}, grid={"seed": [1, 2]})
    tracked.append(sw)
    assert sw.max_parallel == 1
    run = sw.wait_for_point(0, timeout=60)
    run.wait_for_step(5, timeout=180)
    # A kill by hand is not in the spec; a replay schedules it at the step it hit.
    run.kill(replica=0)
    (hit,) = compare.fault_steps(run)["step"]
    spec, added = replay_spec(run)
    assert hit >= 5 and added == [{"action": "kill", "at_step": hit, "target": 0}] and spec["faults"] == added
    status = sw.stop()
    assert sw.state() == "stopped"
    assert list(status["state"]) == ["stopped", "skipped"]
    assert sw.pids() == []


def _flock_holders(lock: Path) -> tuple[set[int], set[int]]:
    """(PIDs holding, PIDs blocked waiting for) a flock on ``lock``, from /proc/locks."""
    inode = f":{lock.stat().st_ino} "
    held, waiting = set(), set()
    for line in Path("/proc/locks").read_text().splitlines():
        if "FLOCK" in line and inode in line:
            pid = int(line.split("FLOCK")[1].split()[2])
            (waiting if "->" in line else held).add(pid)
    return held, waiting


def test_a_sweep_with_a_lock_file_takes_turns_run_by_run(tracked, run_root, tmp_path):
    """``lock=``: while another process holds the file's flock the sweep submits nothing (its controller
    is queued on the lock, as ``flock(1)`` would be); once it is free, the sweep holds it while its run goes
    and lets it go at the end."""
    lock = tmp_path / "heavy.lock"
    lock.touch()
    holder = subprocess.Popen(["flock", str(lock), "cat"], stdin=subprocess.PIPE)  # holds until its stdin closes
    try:
        wait_until(lambda: holder.pid in _flock_holders(lock)[0] or _child_holds(holder.pid, lock), 30)
        sw = wb.sweep("demo", {**BASE, "steps": 10}, points=[{"seed": 1}], lock=lock)
        tracked.append(sw)
        ctl = sw._controller.pid
        wait_until(lambda: ctl in _flock_holders(lock)[1], 60)  # queued behind the holder
        assert sw.point_states() == ["queued"] and sw.runs() == {}
        holder.stdin.close()
        holder.wait(timeout=30)
        run = sw.wait_for_point(0, timeout=60)
        assert ctl in _flock_holders(lock)[0] or run.state() in ("completed", "failed", "stopped")
        sw.wait(timeout=180)
        assert sw.point_states() == ["completed"]
        assert _flock_holders(lock) == (set(), set())  # let go once its last run ended
    finally:
        kill_pids([holder.pid])
        holder.wait(timeout=30)


def _child_holds(pid: int, lock: Path) -> bool:
    """flock(1) may hold the lock in itself or in the command it runs (its child)."""
    held, _ = _flock_holders(lock)
    return any(Path(f"/proc/{p}/stat").exists() and _ppid(p) == pid for p in held)


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s: {predicate}"
        time.sleep(0.05)


# -- the notebook --------------------------------------------------------------------


@pytest.mark.slow
def test_ablation_notebook_runs_headless(run_root):
    nb = nbformat.read(NOTEBOOKS / "04_ablation.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    finally:
        sweeps = [wb.attach_sweep(d) for d in list_sweeps(run_root)]
        _stop_everything(sweeps)
    (sw,) = [s for s in sweeps if HB in s.table().columns]
    table = sw.table()
    assert list(table[HB]) == [500, 1000, 5000]
    assert list(table["state"]) == ["completed"] * 3
    assert (table["survivor_steps_lost"] == 0).all()
    # The survivor waits for the lighthouse to drop the dead group: the stall follows the timeout.
    # Only where the kill hit a group taking part (on a crowded machine one may start too late to join).
    hit = table[table["participants_at_fault"] == 2]
    assert len(hit) >= 2, table
    assert hit["survivor_stall_s"].is_monotonic_increasing, hit
    # At least about the timeout, and growing with it (above); not held by something longer (a loaded machine
    # adds a second or two, not a collective's timeout). How far past the timeout (about 1 s on an idle machine)
    # is ``survivor_stall_s`` of ``make bench``'s kill recovery.
    for hb, stall in zip(hit[HB], hit["survivor_stall_s"]):
        assert 0.5 * hb / 1000 < stall < hb / 1000 + 5.0, (hb, stall)
    # The hang detector's window under a 6 s freeze of replica 1 (the notebook's last section), by hand.
    (windows,) = [s for s in sweeps if "hang.timeout_s" in s.table().columns]
    back = {}
    for run in windows.runs().values():
        ev = run.event_records()
        (freeze,) = [e for e in ev if e["kind"] == "fault" and e["action"] == "hang"]
        evictions = [e for e in ev if e["kind"] == "fault" and e["origin"] == "watchdog"]
        restarts = [e for e in ev if e["kind"] == "restart" and e["replica"] == 1]
        window = run.spec.hang.timeout_s
        back[window] = min(
            e["t"] - freeze["t"]
            for e in ev
            if e["kind"] == "step"
            and e["replica"] == 1
            and e["t"] > freeze["t"]
            and e.get("committed", True)
            and e.get("participating", True)
        )
        if window < freeze["seconds"]:  # killed after the window, though it would have come back: a false eviction
            (kill,) = evictions
            assert (kill["action"], kill["target"]) == ("kill", 1)
            assert window <= kill["t"] - freeze["t"] < freeze["seconds"], (window, kill["t"] - freeze["t"])
            assert [r["attempt"] for r in restarts] == [1]
        else:  # waited out: the same process takes part again once thawed (the fault is recorded just after
            # its SIGSTOP, and the SIGCONT is timed from the stop: a step can land a few ms before 6 s after the record)
            assert evictions == [] and restarts == [] and not [e for e in ev if e["kind"] == "hang"]
            assert back[window] >= freeze["seconds"] - 0.1, back
    assert sorted(back) == [2, 10] and back[2] < back[10], back
