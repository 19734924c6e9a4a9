"""Total loss: every replica group of an elastic run died, and no live process holds the model state.

torchft keeps the model in the live groups only. A group that starts asks the
lighthouse for a quorum; the quorum's ``max_step`` is the highest step of its
members, and a member behind it heals from one at it. When every group died at
once, the groups that start again are all at step 0: ``max_step`` is 0, nobody
heals, and each trains from its initial weights (torchft's ``Manager`` treats
it as the run's first quorum). Measured before this watch: a two-group DiLoCo
run killed at step 309 went on from loss 5.74 at step 0 and ended
``completed``, with no word of it.

Who holds the state
-------------------
A group's current attempt holds the run's model state when:

- it is the group's first attempt (every group starts from the same seed);
- it healed (a ``heal`` of that attempt: it received a holder's state), or
  committed a step in a quorum of several groups while a holder lived
  (torchft lets a member commit only at the quorum's step, after its heal);
- the state was declared lost and it commits the first steps of what follows
  (resumed from durable state, or from scratch).

A relaunched attempt that has neither healed nor committed with a holder holds
nothing, even when it runs: with no peer ahead of it, it trains from scratch.
When an attempt ends and no attempt left holds the state, while the run had
committed steps since its state last began (step 0, or what it resumed from),
the state is lost: the watch writes ``state_lost`` (``step``: the newest
committed step) with its ``action``:

- ``resume`` when durable state exists (also when it holds that very step, as
  after a preemption that saved: the run still says every group died and what it
  resumed from): the newest durable ``checkpoint`` in the
  fold's ledger (TorchTitan's own checkpoints; torchft-lite's snapshots,
  ``torchft.snapshot_every``, ``trainers/lite/snapshot.py``). The trainers load
  it themselves before their first quorum, so a relaunch that the controller
  started before it saw the last death resumes too;
- otherwise the spec's ``on_state_loss``: ``fail`` (the default) ends the run
  ``failed``; ``restart`` lets it go on from scratch.

Either way the run's ``run_end`` says ``reason: state_lost``, which the fold
spells out with the step (``RunState.end_reason``), so a run that went on from
scratch never reads as a plain ``completed``.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from workbench.events.states import RunEndReason
from workbench.spec.models import Spec
from workbench.state.fold import RunState
from workbench.trainers.registry import trainer_kind


class TotalLossWatch:
    """Which groups hold the model state; the ``state_lost`` decision when none does (module docstring)."""

    def __init__(self, spec: Spec, replicas: Iterable[int], run_state: RunState, writer) -> None:
        self.enabled = trainer_kind(spec.trainer).elastic
        self.on_loss = spec.on_state_loss
        self.source = "snapshot" if spec.trainer == "torchft-lite" else "checkpoint"
        self.run_state, self.writer = run_state, writer
        self.holds = {r: False for r in replicas}
        self.attempts = {r: -1 for r in replicas}
        self.fresh = False  # True after a loss, until an attempt commits again
        self.base = self.top = 0  # the step the state last began at; the newest committed step since
        self.lost: list[dict] = []
        self.failed = False

    @property
    def end_reason(self) -> str:
        """``run_end``'s reason where the state was lost (the fold says the rest), else ''."""
        return RunEndReason.STATE_LOST.value if self.lost else ""

    def launched(self, replica: int, attempt: int) -> None:
        self.attempts[replica] = attempt
        self.holds[replica] = attempt == 0 and not self.lost

    def observe(self, e: dict) -> None:
        """A heal or a committed step of a group's current attempt (the controller's own events: skipped)."""
        r = e.get("replica")
        if r not in self.holds or e.get("attempt", 0) != self.attempts[r] or e.get("role") == "controller":
            return
        kind = e.get("kind")
        if kind == "heal":
            self.holds[r] = True
        elif kind == "step" and e.get("committed", True) and isinstance(e.get("step"), int):
            self.top = max(self.top, e["step"])
            if self.holds[r]:
                return
            others = any(h for o, h in self.holds.items() if o != r)
            with_holder = (e.get("participants") or 0) >= 2 and others and e.get("participating") is not False
            if self.fresh or with_holder:
                self.holds[r], self.fresh = True, False

    def ended(self, replica: int, exit_event: Optional[dict], slots: Iterable, *, stopping: bool) -> bool:
        """The group's attempt ended (``exit_event``: its own ``exit``, if any); writes ``state_lost`` if that
        lost the state. True when the run must fail for it (``on_state_loss: fail``)."""
        self.holds[replica] = False
        completed = (exit_event or {}).get("reason") == "completed" or any(s.state == "completed" for s in slots)
        if not self.enabled or completed or stopping or any(self.holds.values()) or self.top <= self.base:
            return False
        return self._lose()["action"] == "fail"

    def _durable(self) -> Optional[dict]:
        last = self.run_state.checkpoints.last_durable
        if last is None or not isinstance(last.get("step"), int) or last["step"] <= 0:
            return None
        path = last.get("path")
        return last if path is None or os.path.exists(path) else None

    def _lose(self) -> dict:
        step, durable = self.top, self._durable()
        if durable is not None:  # also where it holds the very step (a save just before, a preemption that saved)
            fields = dict(action="resume", resumed_from=durable["step"], source=self.source)
        else:
            fields = dict(action=self.on_loss)
        event = self.writer.emit("state_lost", step=step, **fields) or {"step": step, **fields}
        self.lost.append(event)
        self.failed = fields["action"] == "fail"
        self.base = self.top = durable["step"] if durable is not None else 0
        self.fresh = True
        return event
