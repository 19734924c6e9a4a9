"""The faults the controller fires itself: the spec's schedule, and armed faults whose trigger came.

A scheduled fault (``faults:`` in the spec) is due at a step (``at_step``: the
run's highest committed step) or a time (``at_s``). An armed fault
(``workbench.faults.armed``: a kind with a ``trigger``, armed by anyone) is due
when the event it waits for is read. Both are injected through
``workbench.faults.inject`` with the controller as the run's handle.
"""

from __future__ import annotations

import time
from typing import Optional

from workbench.errors import FaultError
from workbench.events.writer import EventWriter
from workbench.faults import armed
from workbench.faults import inject as faults
from workbench.spec.sections import FaultSpec

DEFER_S = 0.5  # a fault whose target is between attempts: the next try
DEFER_FOR_S = 60.0  # and how long it keeps trying


class FaultSchedule:
    def __init__(
        self, schedule: list[FaultSpec], default_target: int, writer: EventWriter, run: faults.RunHandle
    ) -> None:
        self.schedule = schedule
        self.default_target = default_target  # a fault without a target: the last replica group
        self.writer = writer
        self.run = run  # the handle faults are injected through (the controller)
        self.fired: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.first_refused_t: dict[int, float] = {}
        self.triggers = armed.Triggers()
        self.due_triggers: list[tuple[dict, dict]] = []

    def observe(self, e: dict) -> None:
        hit = self.triggers.observe(e)
        if hit is not None:
            self.due_triggers.append(hit)

    def fire(self, max_step: int, t_first_step: Optional[float]) -> None:
        self._fire_scheduled(max_step, t_first_step)
        self._fire_triggered()

    def _fire_scheduled(self, max_step: int, t_first_step: Optional[float]) -> None:
        """Fire due faults. ``at_s`` counts from the first committed step, so startup jitter
        does not shift a schedule between a run and its replay. A fault whose target is
        between attempts waits (up to 60 s) for the target's next process."""
        now = time.time()
        elapsed = now - t_first_step if t_first_step else -1.0
        for i, f in enumerate(self.schedule):
            if i in self.fired:
                continue
            due = (f.at_step is not None and max_step >= f.at_step) or (f.at_s is not None and elapsed >= f.at_s)
            if not due or now < self.retry_at.get(i, 0.0):
                continue
            target = f.target if f.target is not None else self.default_target
            try:
                faults.inject(self.run, f.action, target, origin="schedule", seconds=f.seconds, writer=self.writer)
            except FaultError as e:
                first_try = self.first_refused_t.setdefault(i, now)
                if now - first_try < DEFER_FOR_S:
                    self.retry_at[i] = now + DEFER_S
                    continue
                self.writer.emit("warning", message=f"scheduled fault {i} not injected: {e}")
            self.fired.add(i)

    def _fire_triggered(self) -> None:
        """Armed faults whose trigger came (``workbench.faults.armed``): inject them now, then disarm."""
        while self.due_triggers:
            arm, trigger = self.due_triggers.pop(0)
            on = arm.get("trigger") or "checkpoint"
            try:
                faults.inject(
                    self.run,
                    arm["action"],
                    arm["target"],
                    origin=arm.get("origin") or "schedule",
                    writer=self.writer,
                    fire=True,
                    armed_t=arm.get("t"),
                    **{f"{on}_step": trigger.get("step")},
                )
            except FaultError as e:
                self.writer.emit("warning", message=f"armed {arm['action']} not injected: {e}")
            finally:
                armed.disarm(self.run.run_dir, on, arm["target"])

    def warn_unfired(self, max_step: int) -> None:
        """At the run's end: each scheduled fault that never fired, as a warning."""
        for i, f in enumerate(self.schedule):
            if i not in self.fired:
                when = f"at {f.at_s} s" if f.at_s is not None else f"at step {f.at_step}"
                self.writer.emit(
                    "warning",
                    message=f"scheduled fault {i} ({f.action} {when}) never fired: "
                    f"the run ended at step {max_step} first",
                )
