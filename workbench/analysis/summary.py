"""A run's summary: what it reached, what its faults cost the survivors and the victims.

Definitions (a *survivor* is a replica group that was never a fault's target
and never relaunched: attempt 0 throughout):

- ``survivor_steps_lost``: committed steps a survivor had to redo — a
  committed step number it repeated or went back to. Elastic recovery
  promises 0; a checkpoint-restart job loses everything since its checkpoint.
- ``survivor_steps_discarded``: step attempts a survivor computed that were
  voted down (``committed=False``) because a peer died mid-step; the same step
  number is retried on the same batch, so no progress is lost, only time.
- ``survivor_stall_s``: the max over the faults that end a process (kill,
  preempt, node loss) of the timeline's ``survivor_stall_s``.
- ``kill_to_rejoin_s``: the median over the same faults of the timeline's
  ``participating`` milestone (fault → the victim's next attempt's first
  committed, participating step, after its heal).
- ``heal_seconds``, ``heal_bytes``: medians over the same faults.
- ``steps_redone``: the timeline's ``steps_lost`` summed over every fault.
- ``state_lost``: the last ``state_lost`` (``step``, ``action``, ``resumed_from`` as the groups loaded it,
  ``recorded_from`` as the event said, ``source``): every group
  died with no live peer holding the model state (``controller/total_loss.py``); None if it never was.

A semi-synchronous algorithm's steps are read as :mod:`.useful` decides them: a
survivor's inner steps before a sync voted down were discarded, not committed
and then redone.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.metrics import max_committed_step, metrics_frame
from workbench.analysis.recovery import ends_process, recovery_timeline
from workbench.analysis.useful import decided
from workbench.faults import kinds as faultkinds
from workbench.state.run_status import as_resumed, run_state_of

STATE_LOST_FIELDS = ("step", "action", "resumed_from", "recorded_from", "source", "t")


def counts(events: Sequence[dict]) -> dict:
    """Faults injected (a fault's undo, ``resume``, is not one), restarts and heals."""
    return {
        "faults": sum(1 for e in events if e.get("kind") == "fault" and e.get("action") != faultkinds.RESUME),
        "restarts": sum(1 for e in events if e.get("kind") == "restart"),
        "heals": sum(1 for e in events if e.get("kind") == "heal"),
    }


def survivor_steps(events: Sequence[dict], metrics: Optional[pd.DataFrame] = None) -> tuple[int, int]:
    """(lost, discarded) step counts over all survivors; see the module docstring.

    ``metrics``: this run's ``metrics_frame`` if the caller already has it.
    """
    df = metrics_frame(decided(events)) if metrics is None else metrics
    if df.empty:
        return 0, 0
    victims = {e.get("target") for e in events if e.get("kind") == "fault" and isinstance(e.get("target"), int)}
    lost = discarded = 0
    for r, g in df.groupby("replica"):
        if r in victims or (g["attempt"] != 0).any():
            continue
        discarded += int((~g["committed"].astype(bool)).sum())
        c = g[g["committed"].astype(bool)]["step"].to_numpy()
        lost += int(np.sum(np.diff(c) <= 0)) if len(c) > 1 else 0
    return lost, discarded


def summary(events: Sequence[dict], spec, timeline: Optional[pd.DataFrame] = None) -> dict:
    """The run's headline figures (see the module docstring).

    ``timeline``: this run's ``recovery_timeline`` if the caller already has it.
    """
    events = decided(events)
    timeline = recovery_timeline(events) if timeline is None else timeline
    kills = timeline[ends_process(timeline)] if len(timeline) else timeline
    metrics = metrics_frame(events)
    lost, discarded = survivor_steps(events, metrics)
    lost_state = [e for e in events if e.get("kind") == "state_lost"]
    starts = [e["t"] for e in events if e.get("kind") == "start" and e.get("role") == "controller"]
    committed = metrics[metrics["committed"].astype(bool)] if not metrics.empty else metrics
    first = float(committed["t"].min() - starts[0]) if starts and not committed.empty else None
    members_after = None
    if not kills.empty:
        last_quorums = [e for e in events if e.get("kind") == "step" and e.get("committed")]
        members_after = max((e.get("participants") or 0 for e in last_quorums[-3 * spec.replicas :]), default=None)

    def over_kills(col: str, how: str) -> Optional[float]:
        values = pd.to_numeric(kills[col], errors="coerce").dropna() if not kills.empty else kills
        return float(getattr(values, how)()) if len(values) else None

    return {
        "state": run_state_of(events),
        "trainer": spec.trainer,
        "replicas": spec.replicas,
        "steps_target": spec.steps,
        "steps_completed": max_committed_step(events),
        **counts(events),
        "survivor_steps_lost": lost,
        "survivor_steps_discarded": discarded,
        "steps_redone": int(pd.to_numeric(timeline["steps_lost"], errors="coerce").fillna(0).sum())
        if len(timeline)
        else 0,
        "survivor_stall_s": over_kills("survivor_stall_s", "max"),
        "kill_to_rejoin_s": over_kills("participating", "median"),
        "heal_seconds": over_kills("heal_seconds", "median"),
        "heal_bytes": over_kills("heal_bytes", "median"),
        "participants_at_end": members_after,
        "submit_to_first_step_s": first,
        "state_lost": _state_lost(events, max(lost_state, key=lambda e: e.get("t", 0.0))) if lost_state else None,
    }


def _state_lost(events: Sequence[dict], lost: dict) -> dict:
    """The last ``state_lost``, resumed from what the groups loaded after it (``as_resumed``)."""
    restores = [e for e in events if e.get("kind") == "phase" and e.get("phase") == "restored"]
    lost = as_resumed(lost, restores) or {}
    return {k: lost.get(k) for k in STATE_LOST_FIELDS}
