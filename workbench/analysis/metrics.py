"""The step metrics of a run: one row per ``step`` event, and the furthest committed step.

Two ways to the same DataFrame: :func:`metrics_frame` from event dicts (what
the analysis functions hold), and :class:`~workbench.analysis.step_columns.StepColumns`,
the columnar read path ``Run.metrics()`` uses, which parses the events files'
bytes straight into columns and arranges them as :func:`arrange_steps` does here.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pandas as pd

STEP_COLUMNS = [
    "t",
    "replica",
    "attempt",
    "step",
    "loss",
    "committed",
    "participating",
    "participants",
    "quorum_id",
    "step_time_s",
    "tokens_per_s",
    "weights",
]
DROPPED = ("kind", "run", "host", "pid")  # fields of a step event that are no column of the frame


def metrics_frame(events: Sequence[dict]) -> pd.DataFrame:
    """Every ``step`` event as a row, in time order: ``STEP_COLUMNS`` first, then any trainer-specific fields."""
    rows = [e for e in events if e.get("kind") == "step"]
    df = pd.DataFrame(rows)
    return arrange_steps(df)


def arrange_steps(df: pd.DataFrame, in_t_order: bool = False) -> pd.DataFrame:
    """Missing ``STEP_COLUMNS`` as None, the column order, rows in stable ``t`` order (``in_t_order``: they are)."""
    if df.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    for col in STEP_COLUMNS:
        if col not in df:
            df[col] = None
    df = df[STEP_COLUMNS + [c for c in df.columns if c not in STEP_COLUMNS and c not in DROPPED]]
    return df if in_t_order else df.sort_values(["t"], kind="stable").reset_index(drop=True)


def max_committed_step(events: Sequence[dict], replica: Optional[int] = None) -> int:
    steps = [
        e.get("step", 0)
        for e in events
        if e.get("kind") == "step" and e.get("committed") and (replica is None or e.get("replica") == replica)
    ]
    return max(steps, default=0)
