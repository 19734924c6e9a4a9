"""Evictions of live groups (``analysis.evictions``) on event logs written by hand, checked by hand.

Three groups step once a second; every group writes a ``quorum`` event when a quorum with it forms and
carries the quorum id on its steps, as torchft-lite does. Quorum ids change only with the members.
"""

import pytest

from workbench.analysis.evictions import live_evictions


def _log(quorums, faults=(), lighthouse_up=(), steps_until=20):
    """``quorums``: (t, quorum_id, [(replica, attempt), ...]); each group steps at every whole second from
    its first quorum to ``steps_until`` (its last quorum's time for a group in no later one), carrying the
    id of the newest quorum it is in."""
    events = [{"t": t, "kind": "lighthouse", "state": "up", "replica": None} for t in lighthouse_up]
    events += [{"t": t, "kind": "fault", "replica": None, "origin": "schedule", **f} for t, f in faults]
    groups = {g for _, _, gs in quorums for g in gs}
    for r, a in groups:
        mine = [(t, q) for t, q, gs in quorums if (r, a) in gs]
        for t, q in mine:
            events.append({"t": t, "kind": "quorum", "replica": r, "attempt": a, "quorum_id": q})
        last = steps_until if any((r, a) in gs for _, _, gs in quorums[-1:]) else mine[-1][0] + 0.5
        for s in range(int(mine[0][0]) + 1, int(last) + 1):
            q = [q for t, q in mine if t < s][-1]
            events.append({"t": float(s), "kind": "step", "replica": r, "attempt": a, "quorum_id": q, "step": s})
    return events


ALL = [(0, 0), (1, 0), (2, 0)]
WITHOUT_2 = [(0, 0), (1, 0)]


def test_a_live_group_left_out_and_back_is_one_eviction():
    events = _log([(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (7.25, 3, ALL)])
    assert live_evictions(events) == [
        {"t": 5.25, "replica": 2, "attempt": 0, "quorum_id": 2, "quorums": 1, "gap_s": 2.0}
    ]


def test_left_out_of_two_quorums_in_a_row_is_one_eviction():
    events = _log([(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (6.25, 3, [(0, 0)]), (7.25, 4, ALL)])
    ev = live_evictions(events)
    assert [(e["replica"], e["quorum_id"], e["quorums"]) for e in ev] == [(2, 2, 2), (1, 3, 1)]


@pytest.mark.parametrize(
    "fault",
    [
        {"action": "hang", "target": 2, "seconds": 1.5},  # stopped: its heartbeats stop, it is left out rightly
        {"action": "lighthouse_kill", "target": None},  # a run-wide fault
    ],
)
def test_a_fault_on_the_group_or_the_run_excuses_it(fault):
    events = _log([(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (7.25, 3, ALL)], faults=[(5.1, fault)])
    assert live_evictions(events) == []


def test_a_fault_on_another_group_does_not():
    events = _log(
        [(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (7.25, 3, ALL)],
        faults=[(5.1, {"action": "hang", "target": 1, "seconds": 1.0})],
    )
    assert [e["replica"] for e in live_evictions(events)] == [2]


def test_a_hang_long_resumed_excuses_until_its_resume_only():
    hang = (1.5, {"action": "hang", "target": 2, "seconds": 0.25})
    resume = (2.5, {"action": "resume", "resumed": "hang", "target": 2})
    excused = _log([(0.5, 1, ALL), (2.25, 2, WITHOUT_2), (4.25, 3, ALL)], faults=[hang, resume])
    assert live_evictions(excused) == []
    later = _log([(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (7.25, 3, ALL)], faults=[hang, resume])
    assert [e["quorum_id"] for e in live_evictions(later)] == [2]


def test_a_killed_group_and_its_replacement_are_not_evictions():
    events = _log(
        [(0.5, 1, ALL), (5.25, 2, WITHOUT_2), (7.25, 3, [(0, 0), (1, 0), (2, 1)])],
        faults=[(5.0, {"action": "kill", "target": 2})],
    )
    assert live_evictions(events) == []
    # the same log without the fault event: attempt 0 is in no later quorum, so still none
    assert live_evictions([e for e in events if e["kind"] != "fault"]) == []


def test_quorum_ids_start_again_after_a_lighthouse_restart():
    events = _log([(0.5, 1, ALL), (5.25, 2, ALL), (10.25, 1, ALL)], lighthouse_up=[0.0, 10.0])
    assert live_evictions(events) == []
    events = _log([(0.5, 1, ALL), (5.25, 2, ALL), (10.25, 1, WITHOUT_2), (11.25, 2, ALL)], lighthouse_up=[0.0, 10.0])
    assert [(e["replica"], e["quorum_id"]) for e in live_evictions(events)] == [(2, 1)]
