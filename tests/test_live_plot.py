"""The live plot's protocol without a browser: what is sent per update (appendplot), and the widget's state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.widgets.appendplot import AppendDecimator, PlotFeed, apply, drawn, full_message
from workbench.widgets.state import DashboardState

MARKERS = {
    "fault": "faults",
    "heal": "heals",
    "checkpoint": "checkpoints",
    "restore": "restarts",
    "diverged": "diverged",
    "sync": "syncs",
}


def grow(total: int, seed: int = 0):
    """A loss curve arriving in uneven batches (1 to 300 points per poll), with one spike."""
    rng = np.random.default_rng(seed)
    values = 5.0 / (1 + np.arange(total)) + rng.normal(0, 0.01, total)
    values[total * 2 // 3] = 50.0
    n = 0
    while n < total:
        n = min(total, n + int(rng.integers(1, 300)))
        yield values[:n]


def test_decimation_only_appends_and_resets_when_the_series_doubles():
    dec, max_points = AppendDecimator(200), 200
    shown: list[int] = []
    resets, last_n = [], 0
    for values in grow(20_000):
        reset, new, tail = dec.update(values)
        before = list(shown)
        if reset:
            resets.append(len(values))
            shown = []
        shown += new.tolist()
        if not reset:
            assert shown[: len(before)] == before  # what was drawn is never touched
            assert not len(new) or new[0] > (before[-1] if before else -1)
        assert len(shown) + len(tail) <= max_points + 3
        assert (shown + tail.tolist())[-1] == len(values) - 1  # the newest loss is drawn at once
        assert new.tolist() == sorted(set(new.tolist()))
        last_n = len(values)
    # 200 → 20k points: the width doubles ~log2(100) times, each a reset; every other update appends
    assert 5 <= len(resets) <= 8, resets
    assert all(b >= 1.8 * a for a, b in zip(resets, resets[1:])), resets
    assert last_n * 2 // 3 in shown  # the spike survived decimation
    assert len(shown) >= max_points // 2 - 2


def test_decimation_equals_a_fresh_decimation_of_the_whole_series():
    """Appending bucket by bucket gives exactly what decimating the final series at that width gives."""
    values = list(grow(9_000, seed=3))[-1]
    incremental = AppendDecimator(300)
    shown: list[int] = []
    for v in grow(9_000, seed=3):
        reset, new, _ = incremental.update(v)
        shown = new.tolist() if reset else shown + new.tolist()
    fresh = AppendDecimator(300)
    fresh.width = incremental.width
    _, all_at_once, _ = fresh.update(values)
    assert shown == all_at_once.tolist()


def test_short_series_are_drawn_whole():
    dec = AppendDecimator(100)
    reset, new, tail = dec.update(np.arange(10.0))
    assert new.tolist() == list(range(10)) and tail.tolist() == []
    reset, new, tail = dec.update(np.arange(12.0))
    assert not reset and new.tolist() == [10, 11]


def test_max_points_is_checked():
    with pytest.raises(ValueError, match="max_points"):
        AppendDecimator(2)


def steps(state: DashboardState, replica: int, start: int, stop: int, t0: float = 1000.0):
    state.apply(
        [
            {
                "t": t0 + s * 0.1,
                "kind": "step",
                "replica": replica,
                "attempt": 0,
                "step": s,
                "loss": 5.0 / (1 + s),
                "committed": True,
                "participating": True,
            }
            for s in range(start, stop)
        ]
    )


def test_feed_sends_only_new_points_and_markers():
    state = DashboardState(2, 1000)
    state.apply([{"t": 999.0, "kind": "start", "replica": r, "attempt": 0} for r in range(2)])
    feed = PlotFeed(MARKERS, max_points=1500)
    steps(state, 0, 1, 11)
    first = feed.update(state, "step")
    assert first["full"] and first["traces"]["replica 0"]["x"] == list(range(1, 11))
    assert first["traces"]["faults"] == {"x": [], "y": [], "customdata": [], "text": []}
    assert feed.update(state, "step") is None  # nothing new, nothing sent

    steps(state, 1, 1, 3)
    state.apply([{"t": 1001.5, "kind": "fault", "action": "kill", "target": 0, "origin": "api", "pid": 1}])
    msg = feed.update(state, "step")
    assert msg["prev"] == first["seq"] and not msg["full"] and msg["reset"] == []
    assert set(msg["traces"]) == {"replica 1", "faults"}
    assert msg["traces"]["replica 1"]["x"] == [1.0, 2.0]
    assert msg["traces"]["faults"]["x"] == [10.0] and "kill replica 0 (api)" in msg["traces"]["faults"]["text"][0]

    msg = feed.update(state, "time")  # the x axis changes: everything again, in seconds since the first event
    assert msg["full"] and msg["xtitle"].startswith("wall time")
    assert msg["traces"]["replica 0"]["x"] == pytest.approx([1.0 + s * 0.1 for s in range(1, 11)])
    assert msg["traces"]["faults"]["x"] == pytest.approx([2.5])


def test_frontend_content_follows_messages_and_a_full_message_restores_it():
    """What the kernel keeps (``apply``) equals what a frontend that saw every message has, and a
    frontend that missed messages is made equal by one full message."""
    state = DashboardState(1, 10**6)
    state.apply([{"t": 999.0, "kind": "start", "replica": 0, "attempt": 0}])
    feed = PlotFeed(MARKERS, max_points=100)
    kernel, frontend, late = {}, {}, {}
    sizes, resets = [], 0
    for k in range(60):
        steps(state, 0, 1 + k * 100, 1 + (k + 1) * 100)
        msg = json.loads(json.dumps(feed.update(state, "step")))  # as it crosses the comm
        apply(kernel, msg)
        apply(frontend, msg)
        if k == 20:
            late = json.loads(json.dumps(full_message(kernel)))  # a view created now, from the state
        elif k > 20:
            apply(late, msg)
        sizes.append(sum(len(t["x"]) for t in msg["traces"].values()))
        resets += bool(msg["reset"]) and not msg["full"]
    assert drawn(frontend, "replica 0") == drawn(kernel, "replica 0") == drawn(late, "replica 0")
    assert drawn(kernel, "replica 0")["x"][-1] == 6000.0
    assert 5 <= resets <= 7  # 100 → 6000 points: the width doubled each time the curve did
    assert np.median(sizes) <= 20  # an update carries its ~100 new points decimated, not the curve


def test_live_plot_state_is_the_current_content_and_a_sync_request_gets_it_all():
    from workbench.widgets.liveplot import LivePlot

    plot = LivePlot({"layout": {}, "traces": [{"name": "replica 0"}]})
    sent = []
    plot.send = lambda content, buffers=None: sent.append(json.loads(json.dumps(content)))
    state = DashboardState(1, 100)
    state.apply([{"t": 999.0, "kind": "start", "replica": 0, "attempt": 0}])
    feed = PlotFeed(MARKERS)
    steps(state, 0, 1, 6)
    plot.push(feed.update(state))
    steps(state, 0, 6, 8)
    plot.push(feed.update(state))
    assert sent[-1]["traces"]["replica 0"]["x"] == [6.0, 7.0]
    assert json.loads(json.dumps(plot.get_state()))["data"]["traces"]["replica 0"]["x"] == [1, 2, 3, 4, 5, 6, 7]
    plot._on_frontend(plot, {"type": "sync"}, [])
    assert sent[-1]["full"] and sent[-1]["traces"]["replica 0"]["x"] == [1, 2, 3, 4, 5, 6, 7]
    plot.close()
