"""Per fault that ended a process, where the replacement's seconds went: its ``phase`` events, from the fault.

The recovery timeline (:mod:`.recovery`) has the milestones every trainer has
(replacement started, imports done, heal done, participating). A trainer may
say more about its start: TorchTitan's rank 0 writes ``config_parsed``,
``distributed_ready``, ``model_built``, ``manager_ready`` and ``quorum_done``
(``trainers/titan/phases.py``); MaxText its own. :func:`replacement_phases`
reads them for the attempt that replaced each killed one: one row per
timeline row that ended a process, one column per phase the replacement
wrote (seconds after the fault, NaN where it wrote none), beside the
timeline's own milestones, in the order they were reached, and ``warm``
(its ``imports_done`` said so: TorchTitan's ranks forked warm, MaxText's standby).
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from workbench.analysis.recovery import ends_process

FIRST = ("replacement_started", "imports_done")
LAST = ("heal_done", "participating")
IN_TIMELINE = ("restored",)  # the timeline's ``heal_done`` where no heal replaced it


def replacement_phases(events: Sequence[dict], timeline: pd.DataFrame) -> pd.DataFrame:
    """One row per ``timeline`` row that ended a process: ``t``, ``target``, ``attempt`` (the replacement's),
    ``warm``, then each milestone and phase in seconds after the fault (see the module docstring)."""
    starts: dict = {}
    phases: dict = {}
    for e in events:
        if e.get("kind") == "start" and e.get("role") == "replica":
            starts.setdefault(e.get("replica"), []).append(e)
        elif e.get("kind") == "phase":
            phases.setdefault((e.get("replica"), e.get("attempt")), []).append(e)
    rows, names = [], []
    for _, f in timeline[ends_process(timeline)].iterrows():
        tf = f["t"]
        row = {"t": tf, "target": f["target"], "attempt": None, "warm": None}
        row.update({k: f[k] for k in FIRST})
        after = [s for s in starts.get(f["target"], []) if s["t"] > tf]
        if after:
            attempt = min(after, key=lambda s: s["t"]).get("attempt")
            row["attempt"] = attempt
            for e in sorted(phases.get((f["target"], attempt), []), key=lambda e: e["t"]):
                name = e.get("phase")
                if name == "imports_done" and e.get("warm") is not None:
                    row["warm"] = bool(e["warm"])
                if name in row or name in LAST or name in IN_TIMELINE:
                    continue
                row[name] = e["t"] - tf
                if name not in names:
                    names.append(name)
        row.update({k: f[k] for k in LAST})
        rows.append(row)
    order = ["t", "target", "attempt", "warm", *FIRST, *[n for n in names if n not in FIRST], *LAST]
    return pd.DataFrame(rows, columns=order)


def phase_medians(frame: pd.DataFrame) -> pd.DataFrame:
    """The median of each milestone column of :func:`replacement_phases` (seconds after the fault), with the
    median step from the one before it (``delta_s``) and ``n``: where a replacement's seconds go, in order."""
    cols = [c for c in frame.columns if c not in ("t", "target", "attempt", "warm")]
    rows, previous = [], 0.0
    for c in cols:
        values = pd.to_numeric(frame[c], errors="coerce").dropna()
        median = float(values.median()) if len(values) else math.nan
        rows.append({"milestone": c, "median_s": median, "delta_s": median - previous, "n": len(values)})
        previous = median if not math.isnan(median) else previous
    return pd.DataFrame(rows, columns=["milestone", "median_s", "delta_s", "n"])
