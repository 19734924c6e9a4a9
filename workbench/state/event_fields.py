"""The fields of an event the run-state fold reads, and the types the writers give them.

An event whose fields do not have these types is malformed: the fold counts it
(``RunState.bad_events``) and skips it, instead of folding a wrong state from
it. The hot kinds (``step``, ``heartbeat``) are not checked here: their
handlers check each field they use.
"""

from __future__ import annotations

from typing import Any

FIELD_TYPES = {  # a field that is present must have one of these types (None: absent is fine)
    "replica": (int, type(None)),
    "attempt": (int, type(None)),
    "step": (int, type(None)),
    "action": (str,),
    "target": (int, str, type(None)),
    "state": (str, type(None)),
    "reason": (str, type(None)),
    "job_id": (str, int, type(None)),
    "spare": (int, type(None)),
}


def well_formed(e: dict) -> bool:
    """The fields the fold reads have the types the writers write (bool is no int here)."""
    for key, types in FIELD_TYPES.items():
        if key in e:
            v = e[key]
            if isinstance(v, bool) or not isinstance(v, types):
                return False
    return True


def int_or_zero(x: Any) -> int:
    """``x`` if it is an int (a bool is not), else 0: an absent attempt or task is the first."""
    return x if isinstance(x, int) and not isinstance(x, bool) else 0
