"""Which steps were useful work, for every ``ft.algorithm``: one definition that goodput, the recovery
timeline and the classroom views (``widgets.timeline``) share.

A per-step algorithm's step (DDP, HSDP, checkpoint-restart) is useful when it committed and its group
took part. A step of a semi-synchronous algorithm (its event has ``inner``) is provisional: the next
sync step of the same process (``inner: false``) decides it and every inner step since the previous
one. Committed, they all count; voted down (DiLoCo restores the weights of the last sync), or never
decided (the process died between two syncs, or the log ends there), none does. So a fault between
syncs costs the victim group its inner steps since its last committed sync, and a survivor nothing
unless its own sync was voted down.
"""

from __future__ import annotations

from typing import Any, Iterable


class UsefulSteps:
    """The decision, one ``step`` event at a time in time order; :meth:`add` returns what it decided."""

    def __init__(self) -> None:
        self._pending: dict[tuple, list[Any]] = {}

    def add(self, e: dict, item: Any) -> list[Any]:
        """The ``item``s (a time, the event: the caller's choice) of the steps this ``step`` event makes useful."""
        useful = e.get("participating") is not False
        if "inner" not in e:
            return [item] if useful and e.get("committed", True) else []
        pending = self._pending.setdefault((e.get("replica"), e.get("attempt")), [])
        if useful:
            pending.append(item)
        if e.get("inner") is not False:
            return []
        decided = list(pending) if e.get("committed") else []
        pending.clear()
        return decided


def decided(events: Iterable[dict]) -> list[dict]:
    """``events`` in time order, each semi-synchronous ``step`` replaced by a copy whose ``committed``
    is its decision (:class:`UsefulSteps`), and ``undecided: true`` on an inner step no sync decided
    (its process died first, or the log ends before the next sync). Other events are passed through
    unchanged, and a log with no semi-synchronous step is returned as it is: every analysis reads a
    DDP run exactly as before."""
    events = events if isinstance(events, list) else list(events)
    if not any(e.get("kind") == "step" and "inner" in e for e in events):
        return events
    out = sorted(events, key=lambda e: e.get("t", 0.0))
    semi = [i for i, e in enumerate(out) if e.get("kind") == "step" and "inner" in e]
    u = UsefulSteps()
    useful: set[int] = set()
    last_sync: dict[tuple, int] = {}
    for i in semi:
        e = out[i]
        useful.update(u.add(e, i))
        if e.get("inner") is False:
            last_sync[(e.get("replica"), e.get("attempt"))] = i
    for i in semi:
        e = out[i]
        after_last = i > last_sync.get((e.get("replica"), e.get("attempt")), -1)
        out[i] = {
            **e,
            "committed": i in useful,
            "provisional_committed": e.get("committed"),
            **({"undecided": True} if after_last and e.get("inner") is not False else {}),
        }
    return out
