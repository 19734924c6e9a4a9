"""Armed faults: a fault kind with a ``trigger`` waits for an event of the trainer's own, then fires.

``kill_during_checkpoint`` must land while a checkpoint is being written. A
save of the small models here takes milliseconds, shorter than any poll, so
the protocol makes the window an event-driven handshake instead of a race:

1. ``faults.inject`` (a notebook, the CLI, the controller's schedule) *arms*
   it (:func:`arm`): writes the arm file, ``<run_dir>/armed/<trigger>-r<target>.json``
   (:func:`.arm_file.arm_path`), and records an ``armed`` event (action,
   target, origin). Nothing is signalled yet.
2. The target's checkpoint writer, at the start of each save, finds the arm
   file, emits ``checkpoint state=started`` with ``held=True``, and holds the
   save before its commit (the rename) while the file is there, for at most
   :data:`.arm_file.HOLD_S`. That is the trainer's side, :mod:`.arm_file`
   (the only part the trainers import), which also says why the writer, not
   the controller, decides which save it holds.
3. The run controller (:class:`Triggers`) pairs the ``armed`` event with a
   ``started`` event marked ``held``, in whichever order it reads the two,
   and injects the kind for real (the backend's SIGKILL, with
   ``checkpoint_step``), then removes the arm file (:func:`disarm`): the next
   attempt saves normally.

So the kill lands between the save's start and its commit marker, and the
restart finds the temporary file and the previous durable checkpoint.

``kill_in_allreduce`` is the same handshake around a collective: the group's
process, about to join an all-reduce across groups (the first one of a sync
or of a step), finds the arm file, emits ``held`` (``trigger="allreduce"``)
and waits there, so its peers enter the all-reduce and wait for it inside;
the controller's SIGKILL then lands with every peer blocked on the dead
group, the case that costs a whole ``pg_timeout_ms`` (docs/classroom.md).
A hold that ends without the kill (disarmed, or :data:`.arm_file.HOLD_S`
passed) says ``held`` with ``released=True``.
"""

from __future__ import annotations

import json
from typing import Optional

from workbench.faults.arm_file import arm_path
from workbench.run.rundir import write_json_text


def arm(run_dir, trigger: str, replica: int, record: dict) -> None:
    path = arm_path(run_dir, trigger, replica)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_json_text(path, json.dumps(record))


def disarm(run_dir, trigger: str, replica: int) -> None:
    arm_path(run_dir, trigger, replica).unlink(missing_ok=True)


class Triggers:
    """The controller's side: which armed faults the events just folded make due.

    An arm and its trigger pair by (trigger, target), in whichever order they
    are read. Trigger events: ``checkpoint`` with ``state="started"`` and
    ``held`` (trigger ``"checkpoint"``), and ``held`` (its ``trigger`` field).
    A held trigger that ends without the fault (a durable checkpoint; a
    ``held`` with ``released``) is forgotten.
    """

    def __init__(self) -> None:
        # Keyed by (trigger, target): an arm by its target, a trigger event by its replica. A ``held``
        # event names its trigger; one that does not (None) pairs with nothing.
        self.armed: dict[tuple[Optional[str], int], dict] = {}  # its armed event
        self.held: dict[tuple[Optional[str], int], dict] = {}  # the event that holds, not yet released

    def observe(self, e: dict) -> Optional[tuple[dict, dict]]:
        """(armed event, trigger event) when ``e`` completes a pair, else None."""
        kind, replica = e.get("kind"), e.get("replica")
        if kind == "armed" and isinstance(e.get("target"), int):
            key = (e.get("trigger") or "checkpoint", e["target"])
            if key in self.held:
                return e, self.held.pop(key)
            self.armed[key] = e
            return None
        if replica is None:
            return None
        if kind == "checkpoint":
            key, holds, released = (
                ("checkpoint", replica),
                e.get("state") == "started" and e.get("held"),
                e.get("durable"),
            )
        elif kind == "held":
            key, holds, released = (e.get("trigger"), replica), not e.get("released"), e.get("released")
        else:
            return None
        if holds:
            if key in self.armed:
                return self.armed.pop(key), e
            self.held[key] = e
        elif released:
            self.held.pop(key, None)
        return None
