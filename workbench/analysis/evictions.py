"""Evictions of live groups: a quorum the lighthouse formed without a group whose process was alive and unfaulted.

torchft's lighthouse forms a quorum from the groups that asked for one and whose last heartbeat is
younger than ``lighthouse.heartbeat_timeout_ms``; it waits up to ``join_timeout_ms`` for a healthy group
that has not asked yet. A live group is left out when its heartbeats stop reaching the lighthouse for
that long (its Manager's heartbeat task, on torchft's tokio thread, was not scheduled: a loaded machine)
or it asks more than ``join_timeout_ms`` after the first group (a straggler). Its peers then train
without it and it heals back in a quorum later: the cost a short heartbeat timeout risks, which
``bench/stall.py`` measures against the survivor stall it buys.

Read from the events. torchft's quorum id changes when, and only when, the quorum's members change,
and every group of a new quorum writes a ``quorum`` event with its id when it gets it. Those events
say who was in which quorum, and a quorum's time is its first one's. ``step`` and ``sync`` events carry
the id too, and are read for it only in a log with no ``quorum`` event (``torchft.structured_logs:
false``): a step in flight across a lighthouse restart carries the old series' id. A group's attempt ``(replica, attempt)`` is
*evicted* when a run of one or more quorums between two it was in (so it had joined, and its process
lived through them: a relaunch is a new attempt) does not have it, and no fault touched it meanwhile:
no ``fault`` event naming its replica, or naming no replica (a lighthouse outage, a run-wide fault),
from its last event before the first missed quorum to that quorum (a fault in effect then, a hang
until its ``resume``, counts). A killed group is in no later quorum and its replacement in no earlier
one, so neither counts. A lighthouse restart starts its quorum ids again; its ``up`` event starts a
new series.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Optional, Sequence

_CARRIES_QUORUM = ("quorum", "step", "sync")
RESUME = "resume"


def live_evictions(events: Sequence[dict]) -> list[dict]:
    """One dict per eviction of a live, unfaulted group: ``t`` (the first quorum without it), ``replica``,
    ``attempt``, ``quorum_id`` (that quorum's id), ``quorums`` (how many in a row left it out) and
    ``gap_s`` (from that quorum to the next one with it). Pure: the events in any order."""
    evs = sorted(events, key=lambda e: e["t"])
    ups = [e["t"] for e in evs if e.get("kind") == "lighthouse" and e.get("state") == "up"]
    first_t: dict[tuple[int, int], float] = {}
    members: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
    seen: dict[tuple[int, int], list[float]] = defaultdict(list)
    joins = ("quorum",) if any(e.get("kind") == "quorum" for e in evs) else _CARRIES_QUORUM
    for e in evs:
        r = e.get("replica")
        if r is None or e.get("kind") not in _CARRIES_QUORUM:
            continue
        group = (r, e.get("attempt") or 0)
        seen[group].append(e["t"])
        qid = e.get("quorum_id")
        if qid is None or e["kind"] not in joins:
            continue
        q = (bisect.bisect_right(ups, e["t"]), qid)
        first_t.setdefault(q, e["t"])
        members[q].add(group)
    order = sorted(first_t, key=first_t.__getitem__)
    windows = _fault_windows(evs)
    out = []
    for group, ts in seen.items():
        idx = [i for i, q in enumerate(order) if group in members[q]]
        for a, b in zip(idx, idx[1:]):
            if b == a + 1:
                continue
            q = order[a + 1]
            t_q = first_t[q]
            k = bisect.bisect_left(ts, t_q)
            t_prev = ts[k - 1] if k else t_q
            if any(lo <= t_q and hi >= t_prev for lo, hi in windows.get(group[0], []) + windows.get(None, [])):
                continue
            out.append(
                {
                    "t": t_q,
                    "replica": group[0],
                    "attempt": group[1],
                    "quorum_id": q[1],
                    "quorums": b - a - 1,
                    "gap_s": first_t[order[b]] - t_q,
                }
            )
    return sorted(out, key=lambda d: d["t"])


def _fault_windows(evs: Sequence[dict]) -> dict[Optional[int], list[tuple[float, float]]]:
    """Per target replica (None: the whole run), each fault's span: from the fault to the later of its
    ``resume`` (the next one of its kind on its target) and ``t + seconds``; a fault with neither, an instant."""
    out: dict[Optional[int], list[tuple[float, float]]] = defaultdict(list)
    open_: dict[tuple[Optional[int], object], list[int]] = defaultdict(list)
    for e in evs:
        if e.get("kind") != "fault":
            continue
        target = e.get("target")
        if e.get("action") == RESUME:
            for i in open_.pop((target, e.get("resumed")), []):
                out[target][i] = (out[target][i][0], max(out[target][i][1], e["t"]))
            out[target].append((e["t"], e["t"]))
            continue
        out[target].append((e["t"], e["t"] + float(e.get("seconds") or 0.0)))
        open_[(target, e.get("action"))].append(len(out[target]) - 1)
    return out
