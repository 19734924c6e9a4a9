"""The arm file of an armed fault, and the trainer's side of its handshake: find it, say ``held``, hold.

An armed fault (the whole protocol: :mod:`workbench.faults.armed`, which arms,
disarms and pairs the events on the controller's side) is a file,
``<run_dir>/armed/<trigger>-r<target>.json`` (:func:`arm_path`). The trainers
import this module only, never the arming side.

``trigger="checkpoint"`` (``kill_during_checkpoint``): the target's checkpoint
writer, at the start of each save, looks for the arm file (:func:`is_armed`)
and emits ``checkpoint state=started`` with ``held=True`` if it was there; it
writes its temporary file and, only for a held save, waits before the commit
(the rename), as a save to slow storage would, for at most :data:`HOLD_S`
(:func:`hold_while_armed`; a test aid that only an armed run ever meets).

The writer decides, and says, which save it holds: an arm that appears while a
save is already under way waits for the next save. (Deciding on both sides by
timestamps raced: an arm written mid-save made the writer hold a save the
controller would not kill, for the full :data:`HOLD_S`, which outlasted gloo's
30 s collective timeout on the writer's peers: measured on a loaded 2-core
machine, the attempt died of that timeout and the kill hit the next one.)

``trigger="allreduce"`` (``kill_in_allreduce``): the group's process, about to
join an all-reduce across groups, finds the arm file, emits ``held`` and waits
the same way (:func:`workbench.trainers.torchft.collective_failure.hold_when_armed`);
a hold that ends without the kill says ``held`` with ``released=True``.
"""

from __future__ import annotations

import time
from pathlib import Path

ARMED_DIR = "armed"
HOLD_S = 30.0
POLL_S = 0.05


def arm_path(run_dir, trigger: str, replica: int) -> Path:
    return Path(run_dir) / ARMED_DIR / f"{trigger}-r{int(replica)}.json"


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
