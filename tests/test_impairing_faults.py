"""The recovery timeline and the fold of the faults that impair a group while it runs, on logs written by hand.

Two groups step once a second. Times are binary fractions, so every difference is exact.

| t    | what happens |
|------|---|
| 10.5 | partition group 1's node (6 s). Group 0's quorum without it at 11.25, one participant from 12. Link back at 16.5 (its undo), group 1's quorum of both 17.25, heal 17.5, a healing step at 18, participating from 19 (its steps at s + 0.125). |
| 30.5 | straggler on group 1 (4 s): both keep stepping, no quorum changes; undone at 34.5, group 1's next step 35. |
"""

from workbench import analysis
from workbench.state.fold import RunState


def _log() -> list:
    ev, t0 = [], 1_000_000.0

    def e(t, kind, **f):
        ev.append({"t": t0 + t, "kind": kind, **f})

    for s in range(1, 41):
        e(
            s,
            "step",
            replica=0,
            attempt=0,
            step=s,
            committed=True,
            participating=True,
            participants=1 if 12 <= s <= 18 else 2,
        )
        if not 11 <= s <= 18:
            e(s + 0.125, "step", replica=1, attempt=0, step=s, committed=True, participating=True, participants=2)
    e(18, "step", replica=1, attempt=0, step=18, committed=False, participating=False)
    e(10.5, "fault", action="partition", target=1, attempt=0, node="n2", seconds=6.0, origin="cli")
    e(11.25, "quorum", replica=0, participants=1)
    e(16.5, "fault", action="resume", resumed="partition", target=1, node="n2", origin="schedule")
    e(17.25, "quorum", replica=1, participants=2)
    e(17.5, "heal", replica=1, attempt=0, seconds=0.25, bytes=1024)
    e(30.5, "fault", action="straggler", target=1, attempt=0, seconds=4.0, share=0.25, origin="cli")
    e(34.5, "fault", action="resume", resumed="straggler", target=1, origin="schedule")
    return ev


def test_partition_row_reads_cut_quorum_without_it_link_back_healed_rejoined():
    rows = analysis.recovery_timeline(_log()).set_index("action")
    p = rows.loc["partition"]
    assert (p["quorum_without_victim"], p["replacement_started"], p["heal_done"], p["participating"]) == (
        0.75,
        6.0,
        7.0,
        8.625,
    )  # its steps land 0.125 s after group 0's
    assert bool(p["complete"])


def test_straggler_row_needs_no_quorum_change_and_counts_from_its_undo():
    s = analysis.recovery_timeline(_log()).set_index("action").loc["straggler"]
    assert s["replacement_started"] == 4.0 and s["participating"] == 4.625 and bool(s["complete"])


def test_the_fold_marks_an_impaired_group_until_its_undo_and_keeps_its_state():
    state = RunState(2, 100)
    log = sorted(_log(), key=lambda e: e["t"])
    cut = next(i for i, e in enumerate(log) if e.get("action") == "partition")
    state.apply(log[: cut + 1])
    assert state.replicas[1].impaired["kind"] == "partition" and ("partition", 1) in state.host_faults
    back = next(i for i, e in enumerate(log) if e.get("resumed") == "partition")
    state.apply(log[cut + 1 : back + 1])
    assert state.replicas[1].impaired is None and state.host_faults == {}


def test_node_health_samples_a_busy_process_and_its_memory():
    import subprocess
    import sys

    from workbench.controller import nodehealth

    busy = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nx = bytearray(64 << 20)\nt = time.time()\nwhile time.time() - t < 30: pass",
        ]
    )
    try:
        sampler = nodehealth.Sampler()
        sampler.sample([("n1", [busy.pid]), ("idle", [])])
        import time

        time.sleep(1.0)  # cpu_percent is a delta over the interval between samples
        rows = {r["node"]: r for r in sampler.sample([("n1", [busy.pid]), ("idle", [])])}
        assert rows["n1"]["cpu_percent"] > 30 and rows["n1"]["rss_bytes"] > 64 << 20
        assert rows["idle"]["cpu_percent"] == 0 and rows["idle"]["rss_bytes"] == 0
        assert "cpu" in nodehealth.tile_line(rows["n1"]) and "MB" in nodehealth.tile_line(rows["n1"])
    finally:
        busy.kill()
        busy.wait()


def test_a_node_health_sample_reaches_the_node_view_and_its_tile_line():
    from workbench.widgets.state import DashboardState

    state = RunState(1, 100)
    state.apply(
        [
            {"t": 1.0, "kind": "start", "replica": 0, "attempt": 0, "node": "n1", "pid": 4242, "role": "replica"},
            {
                "t": 2.0,
                "kind": "node_health",
                "node": "n1",
                "pid": 99,
                "cpu_percent": 87.5,
                "rss_bytes": 312_000_000,
                "mem_share": 0.0125,
                "net_sent_bytes": 10,
                "net_received_bytes": 20,
                "net_sent_bps": 12_000.0,
                "net_received_bps": 3_000.0,
            },
        ]
    )
    (row,) = state.nodes.table(state.attempts())
    assert row["health"]["cpu_percent"] == 87.5 and "pid" not in row["health"]
    (shown,) = DashboardState(1, 100, run_state=state).node_rows()
    assert shown["health_line"] == "cpu 88% · mem 312 MB (1.2 %) · net ↑12 kB/s ↓3 kB/s"
