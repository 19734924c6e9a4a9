"""The dashboard without a browser: real events in a real run directory, real widgets."""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest

from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec
from workbench.widgets import Dashboard, DashboardState, active_dashboards
from workbench.widgets.state import decimate


def wait_until(predicate, timeout=10.0, poll=0.05, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


@pytest.fixture
def run_dir(tmp_path):
    spec = load_spec("demo", {"replicas": 3, "steps": 100, "faults": [], "run_root": str(tmp_path)})
    return rundir.create(tmp_path, "20250101-000000-test-abcdef", spec.to_dict())


class Writers:
    """The writers a real run has: controller, one per replica attempt, a control file."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.controller = EventWriter(run_dir, "controller", run="test")
        self.control = EventWriter(run_dir, f"control-{os.getpid()}", run="test")
        self._replicas = {}

    def replica(self, r, attempt=0):
        key = (r, attempt)
        if key not in self._replicas:
            self._replicas[key] = EventWriter(
                self.run_dir, f"replica-{r}.attempt-{attempt}", run="test", replica=r, attempt=attempt
            )
        return self._replicas[key]

    def start(self, r, attempt=0):
        self.controller.emit("submit", replica=r, attempt=attempt, job_id=f"j{r}.{attempt}")
        w = self.replica(r, attempt)
        w.emit("start", trainer="torchft-lite", role="replica", world_size=1, node=f"node{r}")
        w.emit("phase", phase="manager_ready", seconds=1.0)
        return w

    def step(self, r, step, attempt=0, loss=None, committed=True, participating=True, participants=3, quorum_id=1):
        return self.replica(r, attempt).emit(
            "step",
            step=step,
            loss=loss if loss is not None else 5.0 / (1 + step) + 0.01 * r,
            committed=committed,
            participating=participating,
            participants=participants,
            quorum_id=quorum_id,
            step_time_s=0.02,
            tokens_per_s=12800.0,
            mem_gb=0.5,
        )


@pytest.fixture
def writers(run_dir):
    return Writers(run_dir)


@pytest.fixture
def dashboard(run_dir):
    d = Dashboard(run_dir, start=False)
    yield d
    d.stop()


def tile_states(d):
    return {r: t.state for r, t in d.state.tiles.items()}


def test_loss_traces_follow_step_events(dashboard, writers):
    for r in range(3):
        writers.start(r)
    assert dashboard.update() > 0
    assert tile_states(dashboard) == {0: "starting", 1: "starting", 2: "starting"}
    for s in range(1, 11):
        for r in range(3):
            writers.step(r, s)
    dashboard.update()
    plot = dashboard.loss_plot
    for r in range(3):
        drawn = plot.drawn(f"replica {r}")
        assert drawn["x"] == list(range(1, 11))
        assert drawn["y"][-1] == pytest.approx(5.0 / 11 + 0.01 * r)
        assert drawn["customdata"] == list(range(1, 11))
        style = plot.spec["traces"][r]
        assert (
            style["name"] == f"replica {r}" and "replica" in style["hovertemplate"] and "loss" in style["hovertemplate"]
        )
    assert tile_states(dashboard) == {0: "participating", 1: "participating", 2: "participating"}
    assert dashboard.progress.value == 10 and dashboard.progress.max == 100
    assert "data-replica='1' data-state='participating'" in dashboard.tiles.value
    assert dashboard.state.quorum_id == 1 and dashboard.state.participants == 3

    # Wall time is seconds since the run's first event, read here from the files themselves.
    written = [json.loads(line) for f in sorted((writers.run_dir / "events").glob("*.jsonl")) for line in f.open()]
    t_first = min(e["t"] for e in written)
    replica0 = [e["t"] - t_first for e in written if e["kind"] == "step" and e.get("replica") == 0]
    dashboard.x_toggle.value = "time"
    assert plot.drawn("replica 0")["x"] == pytest.approx(replica0, abs=1e-6)
    assert plot.data["xtitle"].startswith("wall time")


def test_kill_dead_restart_heal_participate_with_markers(dashboard, writers):
    for r in range(3):
        writers.start(r)
    for s in range(1, 21):
        for r in range(3):
            writers.step(r, s)
    writers.replica(0).emit("checkpoint", step=20, path="/ckpt/20", seconds=0.3, bytes=4096, durable=True)
    writers.control.emit("fault", action="kill", target=1, pid=12345, origin="button")
    dashboard.update()
    assert tile_states(dashboard)[1] == "dead"
    faults = dashboard.loss_plot.drawn("faults")
    assert faults["x"] == [20.0] and "kill replica 1 (button)" in faults["text"][0]
    assert dashboard.loss_plot.drawn("checkpoints")["x"] == [20.0]
    assert dashboard.state.checkpoints[0]["bytes"] == 4096

    writers.step(1, 21)  # a straggler of the dead attempt must not revive the tile
    writers.controller.emit("job", replica=1, attempt=0, job_id="j1.0", state="ended", clean=False)
    writers.controller.emit("restart", replica=1, attempt=1, reason="died", from_step=20)
    for s in range(21, 25):
        for r in (0, 2):
            writers.step(r, s, participants=2, quorum_id=2)
    dashboard.update()
    assert tile_states(dashboard)[1] == "dead"
    assert dashboard.state.participants == 2

    writers.start(1, attempt=1)
    dashboard.update()
    assert tile_states(dashboard)[1] == "starting" and dashboard.state.tiles[1].attempt == 1
    writers.replica(1, 1).emit("heal", step=24, seconds=0.05, bytes=200_000, from_address="http://h:1", from_replica=0)
    writers.step(1, 24, attempt=1, committed=False, participating=False, participants=3, quorum_id=3)
    dashboard.update()
    assert tile_states(dashboard)[1] == "healing"
    assert dashboard.loss_plot.drawn("heals")["x"] == [24.0]
    assert dashboard.state.heals[-1]["from"] == 0 and "200.0 kB" in dashboard.heal_panel.value  # decimal, as the CLI

    writers.step(1, 25, attempt=1, participants=3, quorum_id=3)
    dashboard.update()
    assert tile_states(dashboard) == {0: "participating", 1: "participating", 2: "participating"}
    assert "data-replica='1' data-state='participating' data-attempt='1'" in dashboard.tiles.value
    assert [q["participants"] for q in dashboard.state.quorum_history] == [3, 2, 3]
    assert (
        "class='wb-participants'" in dashboard.quorum_panel.value and "data-changes='3'" in dashboard.quorum_panel.value
    )
    assert "fault" in dashboard.tail_panel.value and "restart" in dashboard.tail_panel.value


def test_hang_resume_and_finish(dashboard, writers):
    for r in range(2):
        writers.start(r)
        writers.step(r, 1)
    writers.control.emit("fault", action="hang", target=0, pid=1, origin="button", seconds=30.0)
    writers.replica(0).emit("heartbeat", step=1)  # no progress: still hung
    dashboard.update()
    assert tile_states(dashboard)[0] == "hung"
    writers.control.emit("fault", action="resume", target=0, pid=1, origin="schedule")
    dashboard.update()
    assert tile_states(dashboard)[0] == "participating"

    writers.controller.emit("hang", target=1, seconds_without_progress=12.0)
    dashboard.update()
    assert tile_states(dashboard)[1] == "hung"
    writers.step(1, 2)
    dashboard.update()
    assert tile_states(dashboard)[1] == "participating"

    writers.replica(0).emit("exit", reason="completed", step=100)
    writers.replica(1).emit("exit", reason="error", step=2, error="boom")
    writers.controller.emit("run_end", state="completed", reason="all replicas done")
    dashboard.update()
    assert tile_states(dashboard)[0] == "finished" and tile_states(dashboard)[1] == "dead"
    assert tile_states(dashboard)[2] == "pending"
    assert "data-run-state='completed'" in dashboard.header.value


def sent_messages(widget):
    """Record what ``widget.send`` ships to the frontends (the comm's content), in order."""
    sent = []
    original = widget.send
    widget.send = lambda content, buffers=None: (
        sent.append(json.loads(json.dumps(content))),
        original(content, buffers),
    )
    return sent


def test_widget_state_for_a_reloaded_view_is_current(dashboard, writers):
    """A frontend that attaches later (reload, Voila) is sent the widget's state: the current content."""
    writers.start(0)
    dashboard.update()
    for s in range(1, 51):
        writers.step(0, s)
    writers.control.emit("fault", action="kill", target=0, pid=1, origin="api")
    dashboard.update()
    state = json.loads(json.dumps(dashboard.loss_plot.get_state()))  # what a new frontend is sent
    data = state["data"]
    main, tail = data["traces"]["replica 0"], data["tails"].get("replica 0", {"x": []})
    assert main["x"] + tail["x"] == list(range(1, 51))
    assert (main["y"] + tail.get("y", []))[-1] == pytest.approx(5.0 / 51)
    assert data["traces"]["faults"]["x"] == [50.0] and "kill replica 0 (api)" in data["traces"]["faults"]["text"][0]
    assert state["spec"]["layout"]["title"]["text"] == "loss"
    assert state["kind"] == "plot"
    clock = json.loads(json.dumps(dashboard.clock_plot.get_state()))["data"]  # the wall-clock plots, whole
    assert ["kill replica 0 (api)" in label for label in clock["traces"]["faults"]["text"]] == [True]
    assert clock["traces"]["quorum size"]["x"] and len(clock["layout"]["shapes"]) == 1


def test_each_update_sends_only_the_new_points(dashboard, writers):
    writers.start(0)
    for s in range(1, 21):
        writers.step(0, s)
    dashboard.update()
    sent = sent_messages(dashboard.loss_plot)
    writers.step(0, 21)
    writers.step(0, 22)
    dashboard.update()
    (msg,) = sent
    assert msg["type"] == "update" and not msg["full"] and msg["reset"] == []
    assert msg["traces"] == {
        "replica 0": {
            "x": [21.0, 22.0],
            "y": [pytest.approx(5.0 / 22), pytest.approx(5.0 / 23)],
            "customdata": [21.0, 22.0],
        }
    }
    dashboard.update()  # nothing new: nothing sent
    assert len(sent) == 1


def test_plot_is_drawn_before_the_dashboard_is_displayed(run_dir, writers):
    writers.start(0)
    for s in range(1, 6):
        writers.step(0, s)
    d = Dashboard(run_dir, start=False)
    try:
        assert d.loss_plot.get_state()["data"]["traces"]["replica 0"]["x"] == [1, 2, 3, 4, 5]
    finally:
        d.stop()


def test_decimation_keeps_extremes():
    x = np.sin(np.linspace(0, 20, 100_000))
    x[77_777] = 9.0
    idx = decimate(x, 2000)
    assert len(idx) <= 2004 and 77_777 in idx and idx[0] == 0 and idx[-1] == len(x) - 1
    assert np.all(np.diff(idx) > 0)
    assert decimate(x[:10], 2000).tolist() == list(range(10))


def test_update_with_100k_loss_points_is_fast(run_dir, writers):
    n_per_replica = 100_000 // 3 + 1
    for r in range(3):
        writers.start(r)
        w = writers.replica(r)
        lines = "".join(
            f'{{"t": {1000.0 + s * 0.01}, "kind": "step", "run": "test", "replica": {r}, "attempt": 0, "step": {s}, '
            f'"loss": {5.0 / (1 + s)}, "committed": true, "participating": true, "participants": 3, "quorum_id": 1}}\n'
            for s in range(1, n_per_replica + 1)
        )
        with open(w.path, "a") as f:
            f.write(lines)
    d = Dashboard(run_dir, start=False)
    try:
        points_before = d.state.total_points()
        assert points_before >= 100_000
        first = d.last_update_s
        for r in range(3):
            assert len(d.loss_plot.drawn(f"replica {r}")["x"]) <= d.max_points + 3
        times, sent, keyframes = [], sent_messages(d.loss_plot), d.loss_plot.syncs_sent
        for s in range(n_per_replica + 1, n_per_replica + 11):
            for r in range(3):
                writers.step(r, s)
            t0 = time.perf_counter()
            d.update()
            times.append(time.perf_counter() - t0)
        # The widget's keyframe timer (KEYFRAME_AFTER_S after it is first shown) may send the whole content
        # meanwhile on a loaded machine; every update's message carries the tail and at most one new bucket
        # per curve, never the curve again.
        updates = [m for m in sent if not m["full"]]
        assert len(updates) == 10 and len(sent) - 10 == d.loss_plot.syncs_sent - keyframes
        assert not any(m["reset"] for m in updates)
        assert max(len(t["x"]) for m in updates for t in list(m["traces"].values()) + list(m["tails"].values())) <= 3
        median = sorted(times)[len(times) // 2]
        print(
            f"\n100k loss points: first update (parse+fold+draw) {first * 1000:.0f} ms, "
            f"incremental update median {median * 1000:.1f} ms, max {max(times) * 1000:.1f} ms"
        )
        # The speed target (100 ms) is `make bench`'s; this checks the behaviour behind it: an update
        # reads and folds only the new lines (the fold gained exactly the 30 written) and draws a
        # decimated figure, so it costs a small fraction of the first update, which parsed all 100k
        # lines (here ~1 %; a tenth leaves room for a loaded machine, where both slow down alike).
        assert d.state.total_points() == points_before + 30
        assert median < first / 10, (median, first)
        assert d.loss_plot.drawn("replica 0")["customdata"][-1] == n_per_replica + 10
    finally:
        d.stop()


def test_updater_thread_follows_events_and_a_rerun_replaces_it(run_dir, writers):
    first = Dashboard(run_dir)
    try:
        assert first.running
        writers.start(0)
        writers.step(0, 1)
        wait_until(lambda: first.state.tiles[0].state == "participating", what="the thread to fold events")
        wait_until(lambda: first.loss_plot.drawn("replica 0").get("x") == [1.0], what="the plot to gain the point")

        second = Dashboard(run_dir)  # re-running the cell
        try:
            assert not first.running and second.running
            assert active_dashboards() == {str(run_dir.resolve()): second}
            names = [t.name for t in threading.enumerate() if t.name == f"wb-dashboard-{run_dir.name}"]
            assert len(names) == 1
            writers.controller.emit("run_end", state="completed", reason="done")
            wait_until(lambda: not second.running, what="the updater to end after run_end")
        finally:
            second.stop()
    finally:
        first.stop()
    assert not any(t.name == f"wb-dashboard-{run_dir.name}" for t in threading.enumerate())


def test_state_ignores_garbage_fields():
    s = DashboardState(2, 10)
    s.apply(
        [
            {"t": 1.0, "kind": "step", "replica": "x", "loss": "nan?"},
            {"t": 2.0, "kind": "step", "replica": 0, "loss": float("nan"), "step": 1},
            {"t": 3.0, "kind": "fault", "action": "lighthouse_kill", "target": "lighthouse", "origin": "api"},
            {"t": 4.0, "kind": "unknown"},
        ]
    )
    assert len(s.loss[0]) == 0 and [m.kind for m in s.markers] == ["diverged", "fault"]
    assert s.markers[1].replica is None


@pytest.fixture
def real_run(start_run, run_root):
    """A small real run: 3 replica groups on this machine (stopped by PID by ``start_run``)."""
    return start_run("demo", {"steps": 2000, "faults": [], "run_root": str(run_root), "model.step_delay_s": 0.02})


def test_kill_button_kills_the_replica_of_a_real_run(real_run):
    d = Dashboard(real_run)
    try:
        wait_until(
            lambda: d.state.tiles[1].state == "participating" and (d.state.tiles[1].step or 0) >= 3,
            timeout=120,
            poll=0.2,
            what="replica 1 to commit steps",
        )
        proc = real_run.run_state.replicas[1].live_proc()
        assert proc is not None and proc.alive()
        pid = proc.pid
        d.replica_picker.value = 1
        d.action_picker.value = "kill"
        d.inject_button.click()
        assert "kill" in d.fault_status.value and str(pid) in d.fault_status.value
        wait_until(lambda: not proc.alive(), timeout=10, what=f"pid {pid} to die")
        fault_events = real_run.events("fault")
        assert (
            (fault_events["origin"] == "button") & (fault_events["action"] == "kill") & (fault_events["target"] == 1)
        ).any()
        wait_until(
            lambda: d.state.tiles[1].state == "dead" or d.state.tiles[1].attempt >= 1,
            timeout=10,
            what="the tile to show the kill",
        )
        wait_until(lambda: len(d.loss_plot.drawn("faults").get("x", [])) >= 1, timeout=30, what="a fault marker")
        wait_until(
            lambda: d.state.tiles[1].attempt >= 1 and d.state.tiles[1].state == "participating",
            timeout=120,
            poll=0.2,
            what="replica 1 to be relaunched and rejoin",
        )
    finally:
        d.stop()


def test_a_checkpoint_restart_shows_a_restore_marker_and_the_steps_redone(tmp_path):
    """MaxText-style recovery: killed at step 37, restarted, resumed from checkpoint 30."""
    from workbench.events.reader import EventReader
    from workbench.events.writer import EventWriter
    from workbench.widgets.state import DashboardState

    w0 = EventWriter(tmp_path, "replica-0.attempt-0", run="r", replica=0, attempt=0)
    w0.emit("start", trainer="maxtext")
    for step in range(1, 38):
        w0.emit("step", step=step, loss=5.0 - step * 0.01, committed=True, participating=True)
        if step % 10 == 0:
            w0.emit("checkpoint", step=step, durable=True, bytes=100, seconds=0.1)
    EventWriter(tmp_path, "control-1", run="r").emit("fault", action="kill", target=0, origin="api")
    w1 = EventWriter(tmp_path, "replica-0.attempt-1", run="r", replica=0, attempt=1)
    w1.emit("start", trainer="maxtext")
    w1.emit("phase", phase="restored", from_step=30)
    w1.emit("step", step=31, loss=4.7, committed=True, participating=True)
    state = DashboardState(replicas=1, steps=100)
    state.apply(EventReader(tmp_path).poll())
    assert state.tiles[0].steps_lost == 7
    restores = state.marker_arrays("restore")
    assert len(restores["label"]) == 1 and "checkpoint step 30" in restores["label"][0]
    assert len(state.marker_arrays("checkpoint")["label"]) == 3


def test_panels_escape_what_event_files_say_and_use_decimal_units(tmp_path):
    """Quorum ids and heal sources come from files any job writes: shown as text, never as HTML.
    Sizes in decimal units, as `workbench summary` prints them (1,500,000 bytes is 1.5 MB)."""
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(tmp_path / "runs", "esc", load_spec("demo", {"faults": []}).to_dict())
    w = EventWriter(run_dir, "replica-1.attempt-1", run="esc", replica=1, attempt=1)
    w.emit("quorum", quorum_id="<img src=x onerror=alert(1)>", step=3, participants=2)
    w.emit("heal", step=3, seconds=0.5, bytes=1_500_000, from_address="<script>alert(2)</script>")
    d = Dashboard(run_dir, start=False)
    panels = d.quorum_panel.value + d.heal_panel.value
    assert "<img" not in panels and "<script>" not in panels
    assert "&lt;img src=x onerror=alert(1)&gt;" in panels and "&lt;script&gt;" in panels
    assert "1.5 MB" in d.heal_panel.value


def test_a_diverged_loss_is_marked_on_the_plot_and_the_tile(tmp_path):
    """NaN is not plotted (no y), so it must be marked: the tile says diverged, and the plot has
    a `diverged` marker at that step; status reports the step too."""
    import workbench as wb
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(tmp_path / "runs", "nan", load_spec("demo", {"faults": [], "replicas": 2}).to_dict())
    w = EventWriter(run_dir, "replica-0.attempt-0", run="nan", replica=0, attempt=0)
    w.emit("start")
    for step, loss in [(1, 3.0), (2, 2.5), (3, float("nan")), (4, float("nan"))]:
        w.emit("step", step=step, loss=loss, committed=True, participating=True)
    d = Dashboard(run_dir, start=False)
    assert (
        "data-replica='0' data-state='participating' data-attempt='0' data-step='4' data-diverged='3'" in d.tiles.value
    )
    assert "diverged at step 3" in d.tiles.value and "data-diverged=''" in d.tiles.value  # replica 1 did not
    diverged = d.loss_plot.drawn("diverged")
    assert diverged["customdata"] == [3.0] and diverged["y"] == [2.5]
    assert wb.attach(run_dir).status()["replicas"]["0"]["diverged_at"] == 3
