"""Comparing runs: a table of their figures, and their faults by the step each one hit.

Works on any list of runs: the points of a sweep, an original and its replay,
runs picked by hand. A run is anything that reads like a ``Run``
(:class:`ComparedRun`: its id, directory, spec and the events it has read); a
run directory is attached by the caller (``workbench.attach``), since analysis
sits below ``run`` in the data flow and imports nothing of it. Everything is
computed from each run's event log, so a finished sweep compares the same from
any kernel. Tables are pandas; the figures drawn from them are
``compare_figures``'.

Figures in the table, per run:

A semi-synchronous run's inner steps count as committed only once a sync
kept them (``analysis.useful.decided``): a window that a voted-down sync threw
away is in no figure.

- ``final_loss``: the mean loss of committed, participating steps in the last
  5% of the run's committed steps (at least the last step), over every replica
  group, so one noisy batch does not decide a comparison; NaN when the run
  diverged (a NaN is never averaged away into a finite number).
- ``diverged_at``: the first committed step whose loss was NaN or infinite
  (empty for a run that did not diverge).
- ``steps_per_s``: committed steps per second of wall time, first to last
  committed step (faults included: it is the rate the run achieved).
- ``goodput``: ``analysis.goodput`` (useful work against the run's own
  fault-free rate); empty where it cannot judge the run.
- ``survivor_stall_s``, ``kill_to_rejoin_s``, ``survivor_steps_lost``:
  ``analysis.summary``.
- ``participants_at_fault``: the quorum size just before the first fault
  (did the fault hit a group that was taking part?).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.goodput import goodput
from workbench.analysis.metrics import metrics_frame
from workbench.analysis.recovery import recovery_timeline
from workbench.analysis.summary import summary
from workbench.analysis.useful import decided
from workbench.spec.models import Spec

METRICS = ("final_loss", "diverged_at", "steps_per_s", "goodput", "survivor_stall_s", "kill_to_rejoin_s")
SUMMARY_KEYS = (
    "steps_completed",
    "faults",
    "restarts",
    "heals",
    "survivor_steps_lost",
    "survivor_stall_s",
    "kill_to_rejoin_s",
)
SUMMARY_COLUMNS = {"faults": "faults_injected", "steps_completed": "steps"}


class ComparedRun(Protocol):
    """What a comparison reads of a run; :class:`workbench.run.handle.Run` is one."""

    @property
    def id(self) -> str: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def spec(self) -> Spec: ...

    @property
    def events_read(self) -> Sequence[dict]:
        """The events read so far (``refresh`` reads what was appended since)."""
        ...

    def refresh(self) -> object: ...


def committed_losses(events: Sequence[dict]) -> pd.DataFrame:
    """Committed, participating steps: ``step``, ``t``, ``loss`` (mean over replica groups)."""
    df = metrics_frame(events)
    if df.empty:
        return pd.DataFrame(columns=["step", "t", "loss"])
    df = df[df["committed"].astype(bool) & df["participating"].fillna(True).astype(bool)]
    df = df.dropna(subset=["loss"])
    if df.empty:
        return pd.DataFrame(columns=["step", "t", "loss"])
    return df.groupby("step", as_index=False).agg(t=("t", "min"), loss=("loss", "mean"))


def diverged_at(events: Sequence[dict]) -> Optional[int]:
    """The first committed, participating step whose loss was written as NaN or infinite."""
    bad = [
        e.get("step")
        for e in events
        if e.get("kind") == "step"
        and e.get("committed")
        and e.get("participating", True) is not False
        and isinstance(e.get("loss"), float)
        and not np.isfinite(e["loss"])
    ]
    return min((s for s in bad if isinstance(s, int)), default=None)


def final_loss(curve: pd.DataFrame) -> Optional[float]:
    if curve.empty:
        return None
    last = curve["step"].max()
    window = max(1, int(round(0.05 * len(curve))))
    return float(curve[curve["step"] > last - window]["loss"].mean())


def steps_per_s(curve: pd.DataFrame) -> Optional[float]:
    if len(curve) < 2:
        return None
    dt = float(curve["t"].max() - curve["t"].min())
    return float((curve["step"].max() - curve["step"].min()) / dt) if dt > 0 else None


_FIGURES: dict[str, tuple[int, dict]] = {}


def run_figures(run: ComparedRun) -> dict:
    """The comparison figures of one run (see the module docstring).

    Cached per run directory while its event count is unchanged: a live view
    refreshing a sweep recomputes only the runs that moved.
    """
    run.refresh()
    cached = _FIGURES.get(str(run.run_dir))
    if cached is not None and cached[0] == len(run.events_read):
        return dict(cached[1])
    events, judged = run.events_read, decided(run.events_read)  # the analyses decide for themselves
    curve = committed_losses(judged)
    timeline = recovery_timeline(events)
    headline = summary(events, run.spec, timeline)
    diverged = diverged_at(judged)
    row: dict[str, Any] = {
        "run_id": run.id,
        "state": headline["state"],
        "final_loss": float("nan") if diverged is not None else final_loss(curve),
        "diverged_at": diverged,
        "steps_per_s": steps_per_s(curve),
    }
    try:
        row["goodput"] = goodput(events, run.spec, timeline).get("goodput")
    except Exception:  # an analysis that cannot judge this run leaves the cell empty
        row["goodput"] = None
    row.update({SUMMARY_COLUMNS.get(k, k): headline.get(k) for k in SUMMARY_KEYS})
    row["participants_at_fault"] = participants_at_first_fault(judged)
    row["run_dir"] = str(run.run_dir)
    _FIGURES[str(run.run_dir)] = (len(run.events_read), dict(row))
    return row


def participants_at_first_fault(events: Sequence[dict]) -> Optional[int]:
    """The quorum size of the last committed step before the first fault: whether the fault hit a
    group that was taking part (a group killed before it joined stalls nobody)."""
    faults = [e["t"] for e in events if e.get("kind") == "fault" and e.get("action") != "resume"]
    if not faults:
        return None
    before = [e for e in events if e.get("kind") == "step" and e.get("committed") and e["t"] <= min(faults)]
    return max(before, key=lambda e: e["t"]).get("participants") if before else None


def table(
    runs: Sequence[Optional[ComparedRun]],
    params: Optional[Sequence[Mapping[str, Any]]] = None,
    labels: Optional[Sequence[str]] = None,
) -> pd.DataFrame:
    """One row per run: its parameters (``params[i]``), label, and figures.

    A ``None`` in ``runs`` (a sweep point not submitted yet) gives a row of
    parameters with empty figures.
    """
    rows = []
    for i, r in enumerate(runs):
        row: dict[str, Any] = {}
        if labels is not None:
            row["label"] = labels[i]
        if params is not None:
            row.update(params[i])
        if r is not None:
            for k, v in run_figures(r).items():
                row[f"{k} (run)" if k in row else k] = v
        rows.append(row)
    df = pd.DataFrame(rows)
    lead = (["label"] if labels is not None else []) + param_keys(params) + ["run_id", "state"]
    for col in lead + list(METRICS):
        if col not in df:
            df[col] = None
    return df[[c for c in lead if c in df] + [c for c in df.columns if c not in lead]]


def param_keys(params: Optional[Sequence[Mapping[str, Any]]]) -> list[str]:
    keys: list[str] = []
    for p in params or []:
        keys.extend(k for k in p if k not in keys)
    return keys


# -- faults --------------------------------------------------------------------


def fault_steps(run: ComparedRun) -> pd.DataFrame:
    """The run's faults with the step they hit: the highest committed step when each fired.

    ``t_s`` counts from the run's first committed step (the clock of ``at_s``
    schedules), so an original and its replay line up.
    """
    run.refresh()
    events = sorted(run.events_read, key=lambda e: e.get("t", 0.0))
    committed = [e for e in events if e.get("kind") == "step" and e.get("committed")]
    t0 = committed[0]["t"] if committed else None
    rows = []
    for f in events:
        if f.get("kind") != "fault" or f.get("action") == "resume":
            continue
        step = max((e.get("step", 0) for e in committed if e["t"] <= f["t"]), default=0)
        rows.append(
            {
                "action": f.get("action"),
                "target": f.get("target"),
                "origin": f.get("origin"),
                "step": step,
                "t_s": f["t"] - t0 if t0 is not None else None,
                "seconds": f.get("seconds"),
            }
        )
    return pd.DataFrame(rows, columns=["action", "target", "origin", "step", "t_s", "seconds"])


def faults_side_by_side(runs: Sequence[ComparedRun], labels: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """The fault tables of several runs next to each other, fault by fault (an original and its replay)."""
    labels = list(labels) if labels is not None else [r.id for r in runs]
    frames = [fault_steps(r).add_prefix(f"{lab}.") for r, lab in zip(runs, labels)]
    return pd.concat(frames, axis=1) if frames else pd.DataFrame()
