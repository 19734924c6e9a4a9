"""The recovery timeline on an event log written by hand (a real EventWriter), checked by hand.

The run: 3 replica groups step once a second (t = 1, 2, ... after BASE); group 0 is never a
target, so it is the only survivor. Times are binary fractions, so every difference is exact.

| t     | what happens |
|-------|---|
| 10.5  | kill group 1 (attempt 0). At 11 groups 0, 2 vote their step down; quorum of 0, 2 at 11.25; they step with 2 participants from 12. Attempt 1 starts at 12.5, imports done 13.5, quorum of all at 14.75, heal at 14.875, a healing step at 15, participating from 16. |
| 20.5  | hang group 2 (2 s). Groups 0, 1 vote down at 21, quorum at 21.25, 2 participants from 22. Resumed at 22.5, quorum 23.75, heal 23.875, healing step 24, participating from 25. |
| 30.5  | lighthouse kill: seen down at 30.75, up at 31.5; no steps at 31, 32; steps again from 33. |
| 40.5  | kill group 1 (attempt 1). Groups 0, 2 vote down at 41, quorum at 41.5, 2 participants from 42. Attempt 2 starts at 42.5 ... |
| 43.25 | ... and is killed before it stepped. Attempt 3 starts at 44.5, imports done 45.5, quorum of all 46.75, heal 46.875, healing step 47, participating from 48. |
"""

import math

from workbench import analysis
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.spec.load import load_spec

BASE = 1_000_000.0


class HandLog:
    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.step = 0
        self.writers = {r: self._writer(r, 0) for r in range(3)}
        self.control = EventWriter(run_dir, "control", run="r")
        self.controller = EventWriter(run_dir, "controller", run="r", role="controller")

    def _writer(self, replica, attempt):
        return EventWriter(
            self.run_dir, f"replica-{replica}.attempt-{attempt}", run="r", replica=replica, attempt=attempt
        )

    def emit(self, replica, kind, t, **fields):
        self.writers[replica].emit(kind, t=BASE + t, **fields)

    def relaunch(self, replica, attempt, start, imports_done=None):
        self.writers[replica] = self._writer(replica, attempt)
        self.emit(replica, "start", start, trainer="torchft-lite", role="replica")
        if imports_done is not None:
            self.emit(replica, "phase", imports_done, phase="imports_done", seconds=1.0)

    def first_ten_steps(self, trainer):
        """All three groups start at -2, form a quorum at -1 and commit steps 1-10 at t = 1..10."""
        for r in range(3):
            self.emit(r, "start", -2, trainer=trainer, role="replica")
        self.quorum(-1, [0, 1, 2])
        self.ticks(range(1, 11), [0, 1, 2], 3)

    def fault(self, t, action, target, **fields):
        self.control.emit("fault", t=BASE + t, action=action, target=target, origin="schedule", **fields)

    def quorum(self, t, groups):
        for r in groups:
            self.emit(r, "quorum", t, quorum_id=int(t * 100))

    def peer_lost(self, t, quorum_at, groups):
        """The step at ``t`` is voted down; ``groups`` then form a quorum without the lost peer."""
        self.ticks([t], groups, 3, vote_down=True)
        self.quorum(quorum_at, groups)

    def rejoin(self, replica, quorum_at, heal_seconds):
        """A quorum of all; ``replica`` heals 0.125 s later and steps once without taking part."""
        self.quorum(quorum_at, [0, 1, 2])
        self.emit(replica, "heal", quorum_at + 0.125, step=self.step, seconds=heal_seconds, bytes=1000)
        self.ticks([math.ceil(quorum_at)], [0, 1, 2], 3, healing=[replica])

    def ticks(self, ts, groups, participants, vote_down=False, healing=()):
        for t in ts:
            for r in groups:
                self.emit(r, "commit", t, step=self.step, commit_result=not vote_down)
            self.step += 0 if vote_down else 1
            for r in groups:
                self.emit(
                    r,
                    "step",
                    t,
                    step=self.step,
                    loss=1.0,
                    committed=not vote_down,
                    participating=r not in healing,
                    participants=participants,
                )


def hand_log(run_dir) -> list[dict]:
    log = HandLog(run_dir)
    log.controller.emit("start", t=BASE - 5, role="controller")
    log.first_ten_steps(trainer="torchft-lite")
    log.fault(10.5, "kill", 1)
    log.peer_lost(11, 11.25, [0, 2])
    log.ticks([12, 13, 14], [0, 2], 2)
    log.relaunch(1, 1, start=12.5, imports_done=13.5)
    log.rejoin(1, 14.75, heal_seconds=0.125)
    log.ticks(range(16, 21), [0, 1, 2], 3)
    log.fault(20.5, "hang", 2, seconds=2.0)
    log.peer_lost(21, 21.25, [0, 1])
    log.ticks([22, 23], [0, 1], 2)
    log.fault(22.5, "resume", 2)
    log.rejoin(2, 23.75, heal_seconds=0.25)
    log.ticks(range(25, 31), [0, 1, 2], 3)
    log.control.emit("fault", t=BASE + 30.5, action="lighthouse_kill", target="lighthouse", origin="schedule")
    log.controller.emit("lighthouse", t=BASE + 30.75, state="down")
    log.controller.emit("lighthouse", t=BASE + 31.5, state="up", pid=1)
    log.ticks(range(33, 41), [0, 1, 2], 3)
    log.fault(40.5, "kill", 1)
    log.peer_lost(41, 41.5, [0, 2])
    log.ticks([42, 43], [0, 2], 2)
    log.relaunch(1, 2, start=42.5)
    log.fault(43.25, "kill", 1)
    log.ticks([44, 45, 46], [0, 2], 2)
    log.relaunch(1, 3, start=44.5, imports_done=45.5)
    log.rejoin(1, 46.75, heal_seconds=0.125)
    log.ticks(range(48, 51), [0, 1, 2], 3)
    return sorted(EventReader(run_dir).poll(), key=lambda e: e["t"])


NAN = math.nan
# Seconds after each fault, read off the module docstring's table.
EXPECTED = [
    # action, target, detected, quorum w/o victim, replacement started, imports done, heal done, participating,
    # heal_seconds, steps_lost, survivor_stall_s, complete
    ("kill", 1, 0.5, 0.75, 2.0, 3.0, 4.375, 5.5, 0.125, 0, 1.0, True),
    ("hang", 2, 0.5, 0.75, 2.0, 2.0, 3.375, 4.5, 0.25, 0, 1.0, True),
    ("lighthouse_kill", "lighthouse", 0.25, NAN, 1.0, NAN, NAN, 2.5, None, 0, None, True),
    # Attempt 2 never got to imports: imports done is attempt 3's.
    ("kill", 1, 0.5, 1.0, 2.0, 5.0, 6.375, 7.5, 0.125, 0, 1.0, True),
    # Attempt 2 was not in any quorum: the survivors see nothing until the quorum that takes attempt 3
    # in; their step gaps stay 1 s, so no stall.
    ("kill", 1, 3.5, 3.5, 1.25, 2.25, 3.625, 4.75, 0.125, 0, 0.0, True),
]


def _same(a, b):
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return a == b


def test_each_fault_has_one_row_with_its_milestones_read_off_the_log(tmp_path):
    timeline = analysis.recovery_timeline(hand_log(tmp_path))
    assert len(timeline) == len(EXPECTED)
    columns = ["action", "target", *analysis.MILESTONES, "heal_seconds", "steps_lost", "survivor_stall_s", "complete"]
    for i, expected in enumerate(EXPECTED):
        row = timeline.iloc[i]
        got = tuple(row[c] for c in columns)
        assert all(_same(e, g) for e, g in zip(expected, got)), (i, dict(zip(columns, got)))
    assert not timeline["from_scratch"].any()
    assert list(analysis.ends_process(timeline)) == [True, False, False, True, True]


def test_summary_and_goodput_read_the_same_timeline(tmp_path):
    events = hand_log(tmp_path)
    spec = load_spec(trainer="torchft-lite", replicas=3)
    timeline = analysis.recovery_timeline(events)
    s = analysis.summary(events, spec, timeline)
    # Over the three kills: the longest survivor stall, the median kill → participating.
    assert s["survivor_stall_s"] == 1.0
    assert s["kill_to_rejoin_s"] == 5.5
    assert s["heal_seconds"] == 0.125
    assert (s["faults"], s["heals"], s["survivor_steps_lost"], s["survivor_steps_discarded"]) == (5, 3, 0, 3)
    assert s == analysis.summary(events, spec)
    assert analysis.goodput(events, spec, timeline) == analysis.goodput(events, spec)


def test_the_timeline_figure_keeps_a_readable_plot_area_for_any_number_of_faults():
    """The figure's height is its margins plus a plot area that grows with the rows: one fault got
    a strip about two pixels high when the height was fixed and the margins took it."""
    import pandas as pd

    from workbench.analysis import MILESTONES, timeline_figure

    for n in (1, 3, 40):
        rows = [
            {"t": 100.0 + i, "action": "kill", "target": 1, **{m: 1.0 + k for k, m in enumerate(MILESTONES)}}
            for i in range(n)
        ]
        layout = timeline_figure(pd.DataFrame(rows)).layout
        plot_px = layout.height - layout.margin.t - layout.margin.b
        assert plot_px >= max(160, 36 * n), (n, plot_px)


def test_a_hang_its_peers_waited_out_is_recovered_without_a_detection(tmp_path):
    """A 1 s hang of group 2 at 10.5, shorter than the process-group timeout: groups 0 and 1 wait in
    the all-reduce (no step at 11, no vote, no quorum), group 2 resumes at 11.5 and all three step at
    12 in the same quorum. Nothing detected it and nothing had to: complete, no heal; the survivors'
    stall is the 2 s gap less their 1 s median step."""
    log = HandLog(tmp_path)
    log.first_ten_steps(trainer="torchft-lite")
    log.fault(10.5, "hang", 2, seconds=1.0)
    log.fault(11.5, "resume", 2)
    log.ticks(range(12, 16), [0, 1, 2], 3)
    row = analysis.recovery_timeline(sorted(EventReader(tmp_path).poll(), key=lambda e: e["t"])).iloc[0]
    assert math.isnan(row["detected"]) and math.isnan(row["quorum_without_victim"]) and math.isnan(row["heal_done"])
    assert (row["replacement_started"], row["participating"], row["survivor_stall_s"]) == (1.0, 1.5, 1.0)
    assert row["complete"]


def test_a_replacement_restored_at_its_peers_step_recovers_without_a_heal_and_a_later_heal_is_not_its(tmp_path):
    """Group 1 killed at 10.5; attempt 1 (started 12.5) restores its durable checkpoint of step 10 at 13.5,
    the step its peers resume from after the voted-down step 11 (as a TorchTitan group that died just
    after its checkpoint does), and takes part from 14 without a heal. Killed again at 30.5, attempt 2
    heals at 34.875 and takes part from 36. Each row is its own recovery: the first is not the second heal's."""
    log = HandLog(tmp_path)
    log.first_ten_steps(trainer="titan")
    log.fault(10.5, "kill", 1)
    log.peer_lost(11, 11.25, [0, 2])
    log.relaunch(1, 1, start=12.5, imports_done=13.0)
    log.emit(1, "phase", 13.5, phase="restored", from_step=10)
    log.quorum(13.75, [0, 1, 2])
    log.ticks(range(14, 31), [0, 1, 2], 3)
    log.fault(30.5, "kill", 1)
    log.peer_lost(31, 31.25, [0, 2])
    log.ticks([32, 33], [0, 2], 2)
    log.relaunch(1, 2, start=32.5, imports_done=33.5)
    log.rejoin(1, 34.75, heal_seconds=0.125)
    log.ticks(range(36, 40), [0, 1, 2], 3)
    timeline = analysis.recovery_timeline(sorted(EventReader(tmp_path).poll(), key=lambda e: e["t"]))
    got = [(r.heal_done, r.heal_seconds, r.participating, r.steps_lost, r.complete) for r in timeline.itertuples()]
    expected = [(3.0, NAN, 3.5, 0, True), (4.375, 0.125, 5.5, 0, True)]
    assert all(_same(e, g) for want, row in zip(expected, got) for e, g in zip(want, row)) and len(got) == 2, got
