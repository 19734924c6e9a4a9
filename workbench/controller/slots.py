"""A replica slot: the controller's record of one replica group and its current attempt.

One slot per replica group (one for a one-job trainer), for the whole run: each
attempt (a relaunch, or a hot spare taking over) begins anew in the same slot,
which keeps the count of restarts. The progress fields come from the group's
committed steps of its current attempt only (``Controller._observe_one``); the
hang watchdog reads them.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ReplicaSlot:
    replica: int
    attempt: int = -1
    job: Any = None
    state: str = "pending"  # pending | running | relaunch_wait | completed | failed | stopped
    relaunch_at: float = 0.0
    restarts: int = 0
    last_step: int = 0
    committed_steps: int = 0
    last_progress_t: float = 0.0
    hang_reported_t: float = 0.0  # when its hang was reported; 0.0: none since its last progress

    def begin_attempt(self) -> None:
        """The next attempt of the group (a job launched, or a spare assigned): no progress of its own yet."""
        self.attempt += 1
        self.committed_steps = 0
        self.last_progress_t = 0.0  # a relaunch gap is no step interval
        self.hang_reported_t = 0.0
