"""The step metrics of a run: one row per ``step`` event, and the furthest committed step."""

from __future__ import annotations

from typing import Optional

import pandas as pd

STEP_COLUMNS = [
    "t", "replica", "attempt", "step", "loss", "committed", "participating", "participants",
    "quorum_id", "step_time_s", "tokens_per_s", "weights",
]


def metrics_frame(events: list[dict]) -> pd.DataFrame:
    """Every ``step`` event as a row, in time order: ``STEP_COLUMNS`` first, then any trainer-specific fields."""
    rows = [e for e in events if e.get("kind") == "step"]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    for col in STEP_COLUMNS:
        if col not in df:
            df[col] = None
    cols = STEP_COLUMNS + [c for c in df.columns if c not in STEP_COLUMNS and c not in ("kind", "run", "host", "pid")]
    return df[cols].sort_values(["t"], kind="stable").reset_index(drop=True)


def max_committed_step(events: list[dict], replica: Optional[int] = None) -> int:
    steps = [
        e.get("step", 0) for e in events
        if e.get("kind") == "step" and e.get("committed") and (replica is None or e.get("replica") == replica)
    ]
    return max(steps, default=0)
