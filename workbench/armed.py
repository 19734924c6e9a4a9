"""Armed faults: a fault kind with a ``trigger`` waits for an event of the trainer's own, then fires.

``kill_during_checkpoint`` must land while a checkpoint is being written. A
save of the small models here takes milliseconds, shorter than any poll, so
the protocol makes the window an event-driven handshake instead of a race:

1. ``faults.inject`` (a notebook, the CLI, the controller's schedule) *arms*
   it: writes ``<run_dir>/armed/<trigger>-r<target>.json`` and records an
   ``armed`` event (action, target, origin). Nothing is signalled yet.
2. The target's checkpoint writer, at the start of each save, looks for
   the arm file (:func:`is_armed`) and emits ``checkpoint state=started``
   with ``held=True`` if it was there; it writes its temporary file and, only
   for a held save, waits before the commit (the rename), as a save to slow
   storage would, for at most :data:`HOLD_S` (:func:`hold_while_armed`; a
   test aid that only an armed run ever meets).
3. The run controller (:class:`Triggers`) pairs the ``armed`` event with a
   ``started`` event marked ``held``, in whichever order it reads the two,
   and injects the kind for real (the backend's SIGKILL, with
   ``checkpoint_step``), then removes the arm file: the next attempt saves
   normally.

So the kill lands between the save's start and its commit marker, and the
restart finds the temporary file and the previous durable checkpoint. The
writer decides, and says, which save it holds: an arm that appears while a
save is already under way waits for the next save. (Deciding on both sides
by timestamps raced: an arm written mid-save made the writer hold a save the
controller would not kill, for the full :data:`HOLD_S`, which outlasted
gloo's 30 s collective timeout on the writer's peers: measured on a loaded
2-core machine, the attempt died of that timeout and the kill hit the next one.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from .rundir import write_json_text

ARMED_DIR = "armed"
HOLD_S = 30.0
POLL_S = 0.05


def arm_path(run_dir, trigger: str, replica: int) -> Path:
    return Path(run_dir) / ARMED_DIR / f"{trigger}-r{int(replica)}.json"


def arm(run_dir, trigger: str, replica: int, record: dict) -> None:
    path = arm_path(run_dir, trigger, replica)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_json_text(path, json.dumps(record))


def disarm(run_dir, trigger: str, replica: int) -> None:
    arm_path(run_dir, trigger, replica).unlink(missing_ok=True)


def is_armed(run_dir, trigger: str, replica: int) -> bool:
    """In the trainer, at the start of a save: hold this one (say so with ``held=True`` on ``started``)."""
    return arm_path(run_dir, trigger, replica).exists()


def hold_while_armed(run_dir, trigger: str, replica: int, limit_s: float = HOLD_S) -> float:
    """In the trainer, inside a held save: wait while the arm file is there (the controller kills or disarms)."""
    path = arm_path(run_dir, trigger, replica)
    t0 = time.monotonic()
    while path.exists() and time.monotonic() - t0 < limit_s:
        time.sleep(POLL_S)
    return time.monotonic() - t0


class Triggers:
    """The controller's side: which armed faults the events just folded make due."""

    def __init__(self) -> None:
        self.armed: dict[int, dict] = {}  # target -> its armed event
        self.held: dict[int, dict] = {}  # replica -> its held save's started event, not yet committed

    def observe(self, e: dict) -> Optional[tuple[dict, dict]]:
        """(armed event, trigger event) when ``e`` completes a pair, else None."""
        kind = e.get("kind")
        if kind == "armed" and isinstance(e.get("target"), int):
            target = e["target"]
            if target in self.held:
                return e, self.held.pop(target)
            self.armed[target] = e
        elif kind == "checkpoint" and e.get("replica") is not None:
            replica = e["replica"]
            if e.get("state") == "started" and e.get("held"):
                if replica in self.armed:
                    return self.armed.pop(replica), e
                self.held[replica] = e
            elif e.get("durable"):
                self.held.pop(replica, None)
        return None
