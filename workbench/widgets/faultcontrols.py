"""``FaultControls``: the dashboard's fault buttons (target, fault kind, duration, inject).

A click becomes ``run.fault(kind, target, origin="button", seconds=...)``, the
one entry point every fault goes through (:mod:`workbench.faults.inject`), so
a clicked fault is logged, replayed and checked like any other. The kinds on
offer are the run's (``run.fault_kinds()``: what its backend injects and its
trainer has a target for). A failed injection is shown next to the button,
not raised: a click has no cell to raise into.
"""

from __future__ import annotations

import html
from typing import Any, Optional

import ipywidgets as w

from workbench.faults import kinds as faultkinds


class FaultControls(w.HBox):
    """The controls of ``run`` with ``replicas`` groups; :meth:`inject` is what the button does.

    ``enabled=False``: built but refusing to inject (a dashboard with ``faults=False`` does not show them).
    """

    def __init__(self, run: Any, replicas: int, enabled: bool = True, **kwargs: Any) -> None:
        self.run = run
        self.enabled = bool(enabled)
        self.replica_picker = w.Dropdown(
            options=[(f"replica {r}", r) for r in range(replicas)],
            value=1 if replicas > 1 else 0,
            description="target",
            layout=w.Layout(width="180px"),
        ).add_class("wb-replica-picker")
        actions = run.fault_kinds()
        self.action_picker = w.Dropdown(
            options=actions, value=actions[0] if actions else None, description="action", layout=w.Layout(width="200px")
        ).add_class("wb-action-picker")
        self.hang_seconds = w.BoundedFloatText(
            value=5.0, min=0.1, max=3600, step=0.5, description="hang s", layout=w.Layout(width="150px")
        ).add_class("wb-hang-seconds")
        self.inject_button = w.Button(description="inject", button_style="danger", icon="bolt").add_class("wb-inject")
        self.inject_button.on_click(lambda _: self.inject())
        self.fault_status = w.HTML().add_class("wb-fault-status")
        super().__init__(
            [self.replica_picker, self.action_picker, self.hang_seconds, self.inject_button, self.fault_status],
            **kwargs,
        )
        self.add_class("wb-controls")

    def inject(self) -> Optional[dict]:
        """Inject the fault the controls describe; the outcome shows next to the button."""
        if not self.enabled:
            raise RuntimeError("this dashboard was built with faults=False: it has no fault controls")
        action = self.action_picker.value
        kind = faultkinds.KINDS[action]
        target = self.replica_picker.value if kind.targets == "replica" else None
        seconds = self.hang_seconds.value if kind.has_duration else None
        try:
            event = self.run.fault(action, target, origin="button", seconds=seconds)
        except Exception as e:  # shown, not raised: a click has no cell to raise into
            self.fault_status.value = f"<span style='color:#c62828'>{html.escape(str(e))}</span>"
            return None
        if event.get("kind") == "armed":
            self.fault_status.value = html.escape(
                f"{action} armed on {event.get('target')}: fires on its next {event.get('trigger')}"
            )
        else:
            self.fault_status.value = html.escape(f"{action} → {event.get('target')} (pid {event.get('pid')})")
        return event
