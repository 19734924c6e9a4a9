"""The workbench's badput causes in ``ml-goodput-measurement``'s vocabulary.

MaxText users read badput as that library's ``BadputType`` members; the
workbench's :func:`~workbench.analysis.goodput.goodput` splits lost time by
its own causes (``BADPUT_PARTS``). Each cause maps onto exactly one
``BadputType``, so the seconds are moved, never split or dropped: the total
badput is the same in both vocabularies. Where the two cut the same time
differently (an elastic survivor's stall is time a restart-based job never
has; the library splits start-up three ways, the workbench does not) is
written out beside the table in ``docs/goodput.md``.

``BADPUT_TYPES``: the library's ``goodput_utils.BadputType`` names in enum
order (ml-goodput-measurement 0.2.x; the package is not a dependency: it
pulls in Google Cloud clients).
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.goodput import BADPUT_PARTS

BADPUT_TYPES = (
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "PROGRAM_STARTUP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "CUSTOM_BADPUT_EVENTS",
    "OTHER",
)

CAUSE_TO_BADPUT_TYPE = {
    "startup": "PROGRAM_STARTUP",
    "restart": "PROGRAM_STARTUP",
    "missing": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "stall": "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "discarded": "WASTED_PROGRESS_FROM_DISRUPTION",
    "heal": "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "checkpoint": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "other": "OTHER",
}


def badput_vocabularies(result: dict) -> pd.DataFrame:
    """One row per workbench cause: ``cause``, ``badput_type``, ``seconds`` (full-rate seconds, as
    ``goodput()["badput_s"]``) and ``share`` of the total badput."""
    badput = result.get("badput_s") or {}
    df = pd.DataFrame(
        {
            "cause": list(BADPUT_PARTS),
            "badput_type": [CAUSE_TO_BADPUT_TYPE[c] for c in BADPUT_PARTS],
            "seconds": [float(badput.get(c, 0.0)) for c in BADPUT_PARTS],
        }
    )
    total = df["seconds"].sum()
    df["share"] = df["seconds"] / total if total else 0.0
    return df


def badput_by_type(result: dict) -> pd.DataFrame:
    """Indexed by every ``BadputType`` name, in the library's order: ``seconds`` and the workbench
    ``causes`` summed into it (empty where no cause maps: its time is inside another row, or none)."""
    df = badput_vocabularies(result)
    grouped = df.groupby("badput_type").agg(seconds=("seconds", "sum"), causes=("cause", ", ".join))
    out = grouped.reindex(list(BADPUT_TYPES))
    out["seconds"] = out["seconds"].fillna(0.0)
    out["causes"] = out["causes"].fillna("")
    out.index.name = "badput_type"
    return out
