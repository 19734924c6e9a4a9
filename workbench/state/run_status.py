"""A run's state in one word, and its end in words, from the ``run_end`` event and whether anything started or stepped.

The fold (:mod:`workbench.state.fold`) answers with these; so do readers that hold a list of events
and no fold (the matrix, the summary, a controller's unwritten end).
"""

from __future__ import annotations

import math
import time
from typing import Optional, Sequence

TERMINAL = ("completed", "failed", "stopped")


def no_write_since(since: object, error: object) -> str:
    """A run root's failure in words, from ``run_end``'s (or its trace's) ``since`` and ``error``."""
    when = "an unrecorded time"
    if isinstance(since, (int, float)) and math.isfinite(since):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    return f"the run root took no write from {when} ({error or 'no error recorded'})"


def as_resumed(lost: Optional[dict], restores: Sequence[dict]) -> Optional[dict]:
    """A ``state_lost`` event with ``resumed_from`` as the groups loaded it (the ``from_step`` of every
    ``phase restored`` event in ``restores`` that came after it), the controller's figure kept as
    ``recorded_from``.

    The event names the newest durable state the log recorded when the last group died; the groups load the
    newest on disk. The two differ when a group was killed after its save was renamed into place and before its
    ``checkpoint`` event was written (seen: a snapshot of step 60 loaded, the event saying 40), so what they
    loaded is what the run resumed from."""
    if not lost or lost.get("action") != "resume":
        return lost
    t = lost.get("t", 0.0)
    steps = [e["from_step"] for e in restores if isinstance(e.get("from_step"), int) and e.get("t", 0.0) >= t]
    return {**lost, "resumed_from": max(steps), "recorded_from": lost.get("resumed_from")} if steps else lost


def state_lost_text(lost: Optional[dict]) -> str:
    """A ``state_lost`` event in words: the step whose model state no live process held, and what followed."""
    if not lost:
        return "model state lost (no state_lost event read)"
    head = f"model state lost at step {lost.get('step')}: every replica group died with no live peer holding it"
    action = lost.get("action")
    if action == "resume":
        whole = isinstance(lost.get("resumed_from"), int) and lost["resumed_from"] >= (lost.get("step") or 0)
        tail = ": no committed step lost" if whole else ""
        return (
            f"{head}; resumed from the {lost.get('source') or 'durable state'} of step {lost.get('resumed_from')}{tail}"
        )
    if action == "restart":
        return f"{head}; trained on from scratch (on_state_loss: restart)"
    return f"{head}; no durable state, the run failed (on_state_loss: fail)"


def run_state(run_end: Optional[dict], started: bool, stepped: bool) -> str:
    if run_end is not None:
        return run_end.get("state") or "failed"
    if stepped:
        return "running"
    return "starting" if started else "pending"


def run_state_of(events: Sequence[dict]) -> str:
    """The run's state from a list of events, as the fold would say it."""
    ends = [e for e in events if e.get("kind") == "run_end"]
    return run_state(
        ends[-1] if ends else None,
        any(e.get("kind") == "start" for e in events),
        any(e.get("kind") == "step" for e in events),
    )
