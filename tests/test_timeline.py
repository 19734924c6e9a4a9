"""The classroom views and the time scrubber without a browser: a real event log written by
EventWriter in a real run directory, read back by EventReader, folded."""

from __future__ import annotations

import os

import numpy as np
import pytest

from workbench.analysis.wallclock import STATE_COLORS, Replay, Timeline, fold_until, useful_rate
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec

GROUPS = 16


@pytest.fixture
def log(tmp_path):
    """A 16-group run: every group steps, group 3 is killed and relaunched, group 5 is frozen and
    resumes, group 7 is killed and never comes back before the run ends."""
    spec = load_spec("demo", {"replicas": GROUPS, "steps": 100, "faults": [], "run_root": str(tmp_path)})
    run_dir = rundir.create(tmp_path, "20250101-000000-class-abcdef", spec.to_dict())
    ctl = EventWriter(run_dir, "controller", run="test")
    control = EventWriter(run_dir, f"control-{os.getpid()}", run="test")
    w = {}

    def writer(r, a=0):
        if (r, a) not in w:
            w[(r, a)] = EventWriter(run_dir, f"replica-{r}.attempt-{a}", run="test", replica=r, attempt=a)
        return w[(r, a)]

    marks = {}
    ctl.emit("start", role="controller", trainer="torchft-lite", cluster="local")
    for r in range(GROUPS):
        writer(r).emit("start", trainer="torchft-lite", role="replica", world_size=1)
    for step in range(1, 4):
        for r in range(GROUPS):
            writer(r).emit(
                "step", step=step, loss=1.0, committed=True, participating=True, participants=GROUPS, quorum_id=1
            )
    marks["before_kill"] = writer(3).emit("heartbeat", step=3)["t"]
    marks["kill3"] = control.emit("fault", action="kill", target=3, pid=1, origin="schedule")["t"]
    marks["kill7"] = control.emit("fault", action="kill", target=7, pid=1, origin="schedule")["t"]
    marks["freeze5"] = control.emit("fault", action="freeze", target=5, pid=1, origin="schedule", seconds=2.0)["t"]
    for r in range(GROUPS):
        if r not in (3, 5, 7):
            writer(r).emit(
                "step", step=4, loss=0.9, committed=True, participating=True, participants=GROUPS - 3, quorum_id=2
            )
    ctl.emit("restart", replica=3, attempt=1, reason="died", from_step=4)
    marks["restart3"] = writer(3, 1).emit("start", trainer="torchft-lite", role="replica", world_size=1)["t"]
    writer(3, 1).emit("heal", step=4, seconds=0.1)
    marks["resume5"] = control.emit("fault", action="resume", target=5, resumed="freeze", origin="undo")["t"]
    writer(5).emit("step", step=5, loss=0.9, committed=True, participating=True, participants=GROUPS - 1, quorum_id=3)
    writer(3, 1).emit(
        "step", step=5, loss=0.9, committed=True, participating=True, participants=GROUPS - 1, quorum_id=3
    )
    marks["end"] = ctl.emit("run_end", state="stopped", reason="stop", steps=5)["t"]
    events = EventReader(run_dir).poll()
    marks["run_dir"] = run_dir
    return spec, events, marks


def states_at(snapshot):
    return {c.replica: (c.state, c.attempt) for c in snapshot.cells}


def test_scrubber_grid_is_the_log_at_that_time(log):
    spec, events, m = log
    replay = Replay(events, spec.replicas, spec.steps, samples_per_step=spec.model.batch_size)
    before = states_at(replay.at(m["before_kill"]))
    assert before[3] == ("participating", 0) and before[7] == ("participating", 0)
    after = states_at(replay.at(m["freeze5"]))
    assert after[3] == ("dead", 0) and after[7] == ("dead", 0) and after[5] == ("hung", 0)
    assert after[0] == ("participating", 0)
    relaunched = states_at(replay.at(m["restart3"]))
    assert relaunched[3] == ("starting", 1) and relaunched[7] == ("dead", 0)
    final = states_at(replay.at(m["end"]))
    assert final[3] == ("participating", 1) and final[5] == ("participating", 0) and final[7] == ("dead", 0)
    for t in (m["before_kill"], m["kill7"], m["restart3"], m["resume5"], m["end"]):  # the slow way agrees
        fold = fold_until(events, t, spec.replicas, spec.steps)
        assert states_at(replay.at(t)) == {r: (v.state, v.attempt) for r, v in fold.replicas.items()}


def test_scrubber_series_are_cut_at_that_time(log):
    spec, events, m = log
    replay = Replay(events, spec.replicas, spec.steps, samples_per_step=spec.model.batch_size)
    snap = replay.at(m["kill7"])
    assert [f.target for f in snap.faults] == [3, 7]
    assert list(snap.queue["dead"])[-1] == 2 and list(snap.queue["hung"])[-1] == 0
    assert list(snap.quorum["participants"]) == [GROUPS]  # the smaller quorum came after
    end = replay.at(m["end"])
    assert [f.target for f in end.faults] == [3, 7, 5]  # the resume is no fault
    assert list(end.quorum["participants"]) == [GROUPS, GROUPS - 3, GROUPS - 1]
    # Queue of dead groups: 0, 1 and 2 (kills), 2 (group 5 hung), 1 (group 3's new attempt), 1 (5 resumed).
    assert list(end.queue["dead"]) == [0, 1, 2, 2, 1, 1]
    assert list(end.queue["hung"]) == [0, 0, 0, 1, 1, 0]


def test_queue_tracks_hangs_and_backlog_says_what_is_left(log):
    spec, events, m = log
    replay = Replay(events, spec.replicas, spec.steps)
    q = replay.timeline.queue_series()
    hung_at = q["t"][np.argmax(q["hung"])] + replay.start
    assert q["hung"].max() == 1 and hung_at == pytest.approx(m["freeze5"])
    assert q["hung"][-1] == 0
    b = replay.timeline.backlog()
    assert b["peak"] == 2 and b["at_end"] == 1


def test_useful_throughput_counts_committed_participating_samples(log):
    spec, events, m = log
    batch = spec.model.batch_size
    replay = Replay(events, spec.replicas, spec.steps, samples_per_step=batch)
    steps = [e for e in events if e["kind"] == "step"]  # every step in this log is committed and participating
    b = (m["end"] - replay.start) / 8
    tp = replay.timeline.throughput(bin_s=b, until=m["end"] + b)  # bins that cover the whole log
    assert tp["rate"].sum() * b == pytest.approx(len(steps) * batch)
    # Bin k is [start + k·b, start + (k+1)·b): the log spans milliseconds at t ≈ 1.8e9 s, so an event can sit
    # within float rounding of an edge, where (t - start) // b and a comparison with the edge disagree.
    edge = lambda k: replay.start + b * k
    kill_bin = max(k for k in range(9) if edge(k) <= m["kill3"])
    in_kill_bin = sum(1 for e in steps if edge(kill_bin) <= e["t"] < edge(kill_bin + 1))
    assert tp["rate"][kill_bin] * b == pytest.approx(in_kill_bin * batch)
    assert replay.timeline.throughput(bin_s=b, until=m["end"] - b / 2)["t"].size == 7  # the unfilled bin is left out
    assert useful_rate(events, batch)["samples"] == len(steps) * batch


def test_uncommitted_and_healing_steps_are_not_useful(tmp_path):
    run_dir = rundir.create(tmp_path, "20250101-000000-x-abcdef", {"replicas": 1})
    w = EventWriter(run_dir, "replica-0.attempt-0", run="t", replica=0, attempt=0)
    w.emit("start", role="replica")
    w.emit("step", step=1, committed=True, participating=True)
    w.emit("step", step=1, committed=False, participating=True)
    w.emit("step", step=2, committed=True, participating=False)
    w.emit("step", step=2, committed=True, participating=True)
    events = EventReader(run_dir).poll()
    assert useful_rate(events, 8)["samples"] == 16


def test_live_timeline_follows_the_fold_batch_by_batch(log):
    spec, events, m = log
    from workbench.state.fold import RunState

    run = RunState(spec.replicas, spec.steps)
    tl = Timeline(run, spec.model.batch_size)
    run.subscribe(tl.observe)
    cut = next(i for i, e in enumerate(events) if e["kind"] == "fault")
    run.apply(events[: cut + 1])
    assert {c.replica: c.state for c in tl.cells_at(events[cut]["t"])}[3] == "dead"
    assert STATE_COLORS["dead"] != STATE_COLORS["participating"]
    run.apply(events[cut + 1 :])
    assert tl.transitions[3][-1][1:] == ("participating", 1)


def cell_states(html_text):
    import re

    return {
        int(r): (s, int(a))
        for r, s, a in re.findall(
            r"class='wb-cell' data-replica='(\d+)' data-state='(\w+)' data-attempt='(\d+)'", html_text
        )
    }


def test_dashboard_at_16_groups_shows_the_grid_and_replays_it_once_ended(log):
    from workbench.widgets import Dashboard

    spec, events, m = log
    d = Dashboard(m["run_dir"], start=False)
    try:
        grid = cell_states(d.tiles.value)
        assert len(grid) == GROUPS and "wb-tile'" not in d.tiles.value
        assert grid[7] == ("dead", 0) and grid[3] == ("participating", 1)
        assert d.scrub_box.layout.display == "flex"  # the run has ended: the scrubber is offered
        snap = d.scrub(m["freeze5"] - d.replay.start)
        grid = cell_states(d.tiles.value)
        assert grid[3] == ("dead", 0) and grid[5] == ("hung", 0) and grid[0] == ("participating", 0)
        assert len(snap.faults) == 3
        fig = d.clock.to_dict()["data"]
        assert list(fig[1]["text"]) == [f.label for f in snap.faults]  # every fault so far is marked
        assert list(fig[3]["y"])[-1] == 2  # dead groups at that time
        d.scrub(m["end"] - d.replay.start)
        assert cell_states(d.tiles.value)[3] == ("participating", 1)
        assert "data-peak='2'" in d.backlog_panel.value
    finally:
        d.stop()


def test_sync_events_are_loss_plot_markers_once_per_sync(tmp_path):
    from workbench.widgets import DashboardState

    run_dir = rundir.create(tmp_path, "20250101-000000-s-abcdef", {"replicas": 2})
    ws = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="t", replica=r, attempt=0) for r in range(2)]
    for w in ws:
        w.emit("start", role="replica")
        w.emit("step", step=10, loss=2.0, committed=True, participating=True)
    for w in ws:
        w.emit(
            "sync",
            step=10,
            sync_index=1,
            algorithm="diloco",
            fragment=None,
            bytes=2_000_000,
            seconds=0.5,
            participants=2,
            quorum_id=4,
            committed=True,
        )
    state = DashboardState(2, 100)
    state.apply(EventReader(run_dir).poll())
    syncs = state.marker_arrays("sync")
    assert list(syncs["step"]) == [10.0] and list(syncs["loss"]) == [2.0]
    assert "sync 1 (diloco): 2 groups, 2.0 MB in 0.50 s" == syncs["label"][0]


def test_a_queue_that_grows_is_reported_as_not_absorbed(tmp_path):
    run_dir = rundir.create(tmp_path, "20250101-000000-q-abcdef", {"replicas": 8})
    control = EventWriter(run_dir, "control-1", run="t")
    ws = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="t", replica=r, attempt=0) for r in range(8)]
    t = 1000.0  # times given: one event a second, so the queue's time weights are the test's own
    for w in ws:
        w.emit("start", role="replica", t=t)
    for r in range(6):  # a kill every 10 s and no relaunch: the queue only grows
        for i, w in enumerate(ws[r:]):
            w.emit("step", step=r + 1, committed=True, participating=True, t=t + 10 * r + i * 0.5)
        control.emit("fault", action="kill", target=r, pid=1, origin="schedule", t=t + 10 * r + 5)
    ws[7].emit("step", step=7, committed=True, participating=True, t=t + 65)
    replay = Replay(EventReader(run_dir).poll(), 8)
    b = replay.timeline.backlog()
    assert b["peak"] == 6 and b["at_end"] == 6 and b["kept_up"] is False
    assert b["mean"] == pytest.approx(
        (10 * (1 + 2 + 3 + 4 + 5) + 10 * 6) / 65
    )  # 0 dead for 5 s, then 1..6 for 10 s each


def test_a_semi_synchronous_step_is_useful_once_its_sync_committed(tmp_path):
    run_dir = rundir.create(tmp_path, "20250101-000000-d-abcdef", {"replicas": 1})
    w = EventWriter(run_dir, "replica-0.attempt-0", run="t", replica=0, attempt=0)
    w.emit("start", role="replica")
    for step in range(1, 11):  # a sync every 4 steps: step 4 commits, step 8 does not, 9-10 die with the process
        sync = step % 4 == 0
        w.emit(
            "step",
            step=step,
            inner=not sync,
            committed=step != 8 if sync else True,
            participating=True,
            algorithm="diloco",
        )
    events = EventReader(run_dir).poll()
    assert useful_rate(events, 8)["samples"] == 4 * 8
    replay = Replay(events, 1, samples_per_step=8)
    assert len(replay.timeline.useful_t) == 4
    assert replay.timeline.useful_t == [e["t"] for e in events if e["kind"] == "step" and e["step"] <= 4]
