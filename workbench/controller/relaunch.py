"""The relaunch policy: what becomes of a replica group whose job ended.

The controller notices a job that ended and asks :meth:`RelaunchPolicy.decide`,
which returns a :class:`Decision` and changes nothing; the controller carries
it out (a ``restart`` event, a spare assigned, a later launch). In order:

- an attempt whose trainer said ``exit reason=completed`` completed;
- one stopped on purpose (``run.stop()``, or by the controller) stays stopped;
- once one group has completed the target step, a dead group is not relaunched
  (it would find no live peer to heal from and train alone from scratch);
- with ``relaunch: off``, or ``max_restarts`` spent, the group failed;
- otherwise it restarts as its next attempt: at once on a ready hot spare when
  there is one and no ``relaunch_delay_s``, else as a new job
  ``relaunch_delay_s`` later.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from workbench.controller.slots import ReplicaSlot
from workbench.spec.models import Spec


@dataclasses.dataclass(frozen=True)
class Decision:
    """The slot's next ``state``; for a restart also why the attempt ended and how the next one starts."""

    state: str  # completed | stopped | failed | relaunch_wait (a new job at ``at``) | running (``spare`` takes over)
    reason: str = "died"  # the ended attempt's exit reason
    spare: Optional[int] = None
    at: float = 0.0

    @property
    def restarts(self) -> bool:
        """The group goes on as its next attempt (one of its ``max_restarts``)."""
        return self.state in ("relaunch_wait", "running")


class RelaunchPolicy:
    def __init__(self, spec: Spec) -> None:
        self.relaunch = spec.relaunch
        self.max_restarts = spec.max_restarts
        self.delay_s = spec.relaunch_delay_s

    def decide(
        self,
        slot: ReplicaSlot,
        exit_event: Optional[dict],
        *,
        stopping: bool,
        peer_completed: bool,
        spares_ready: set[int],
        now: float,
    ) -> Decision:
        """``exit_event``: the attempt's own ``exit`` event, None if it died without one."""
        if exit_event and exit_event.get("reason") == "completed":
            return Decision("completed")
        if slot.state == "stopped" or stopping or peer_completed:
            return Decision("stopped")
        if self.relaunch == "off" or slot.restarts >= self.max_restarts:
            return Decision("failed")
        reason = (exit_event or {}).get("reason", "died")
        if spares_ready and not self.delay_s:
            return Decision("running", reason, spare=min(spares_ready))
        return Decision("relaunch_wait", reason, at=now + self.delay_s)
