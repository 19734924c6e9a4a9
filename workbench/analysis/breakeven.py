"""Break-even: the failure rate above which elastic training beats checkpoint-restart.

Model. A job that loses ``L`` full-rate seconds per fault and runs at ``R``
samples/s without faults delivers, at a mean time between failures ``M``,

    useful(M) = R · (1 − L / M)        (first order: valid for M ≫ L)

Each kind's ``R`` and ``L`` come from its own runs' events:

- ``R``: the fault-free rate, ``analysis.goodput``'s steady-state rate of a
  fault-free run (or, without one, of the faulted run's fault-free stretches),
  in samples/s.
- ``L`` elastic (torchft): the full-rate time a faulted run actually lost,
  ``goodput.lost_s / faults``: survivors' stall and discarded step, the
  victim's absence until it participates again, its healing step.
- ``L`` checkpoint-restart: ``restart_s + period_s / 2``. Every rank stops at
  the fault and the job waits ``restart_s`` (fault → first committed step of
  the next attempt, measured per fault), then redoes the steps since its last
  checkpoint, on average half a checkpoint period (``period_s``, the measured
  spacing of its ``checkpoint`` events). A run's own losses depend on where in
  the period its faults landed, so they are reported beside the model
  (``measured_lost_per_fault_s``) but not used for it.

Setting the two equal: ``R_e (1 − L_e/M) = R_r (1 − L_r/M)`` gives
``M* = (R_r L_r − R_e L_e) / (R_r − R_e)``. With ``R_e < R_r`` (elastic pays a
fault-free overhead) and ``L_e < L_r``, elastic wins for every ``M < M*``:
failures more often than every ``M*`` seconds.

Useful work. A checkpoint-restart job's steps after its last checkpoint are
committed when run and then rolled back by the restore; they are not useful.
:func:`rolled_back` finds them from the ``restored`` phase events
(``from_step``), so useful samples count each (replica, step) once.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import analysis
from workbench.faults import kinds as faultkinds
from workbench.trainers import trainer_kind


def _events_and_spec(run: Any) -> tuple[list[dict], Any]:
    if isinstance(run, tuple):
        return run
    return run.event_records(), run.spec


def rolled_back(events: list[dict]) -> pd.Series:
    """For each committed step event (index into ``metrics_frame``): rolled back by a later restore?

    A step of attempt ``a`` is rolled back when a later attempt of the same
    replica restored from a checkpoint older than that step.
    """
    df = analysis.metrics_frame(events)
    if df.empty:
        return pd.Series(dtype=bool)
    restores: dict[Any, list[tuple[int, int]]] = {}
    for e in events:
        if e.get("kind") == "phase" and e.get("phase") == "restored":
            restores.setdefault(e.get("replica"), []).append((e.get("attempt", 0), int(e.get("from_step") or 0)))
    out = np.zeros(len(df), dtype=bool)
    for i, row in enumerate(df.itertuples()):
        later = [frm for att, frm in restores.get(row.replica, []) if att > row.attempt]
        out[i] = bool(later) and bool(row.committed) and row.step > min(later)
    return pd.Series(out, index=df.index)


def samples_per_step(spec) -> int:
    """Samples one replica's (or rank's) committed step trains on."""
    return trainer_kind(spec.trainer).samples_per_step(spec)


def throughput(events: list[dict], spec) -> dict:
    """Rates in samples/s: fault-free (steady-state) and useful (each step once, over the whole window).

    ``analysis.goodput`` supplies the window and the steady-state rate (in
    samples/s: it counts a step as this spec's samples per step).
    """
    g = analysis.goodput(events, spec)
    df = analysis.metrics_frame(events)
    if g["goodput"] is None or df.empty:
        return {"rate_samples_per_s": None, "useful_samples_per_s": None, "T_s": None, "goodput": None}
    good = df["committed"].astype(bool) & df["participating"].fillna(True).astype(bool)
    back = rolled_back(events)
    useful = int((good & ~back).sum()) * samples_per_step(spec)
    rate = g["rate_samples_per_s"]
    return {
        "rate_samples_per_s": rate,
        "useful_samples": useful,
        "rolled_back_steps": int((good & back).sum()),
        "T_s": g["T_s"],
        "useful_samples_per_s": useful / g["T_s"],
        "goodput": useful / (rate * g["T_s"]),
        "lost_s": g["T_s"] - useful / rate,
    }


def replica_faults(events: list[dict]) -> list[dict]:
    """Faults that took a replica group or rank down (the kinds that end a process)."""
    ending = faultkinds.ending_kinds()
    return [
        e for e in events if e.get("kind") == "fault" and isinstance(e.get("target"), int) and e.get("action") in ending
    ]


def restart_seconds(events: list[dict]) -> list[float]:
    """Per fault: fault → the next attempt's first committed step (no rank trains meanwhile)."""
    out = []
    steps = [e for e in events if e.get("kind") == "step" and e.get("committed")]
    for f in replica_faults(events):
        before = [e.get("attempt", 0) for e in steps if e["t"] <= f["t"]]
        attempt = max(before, default=0)
        after = [e["t"] for e in steps if e["t"] > f["t"] and e.get("attempt", 0) > attempt]
        if after:
            out.append(min(after) - f["t"])
    return out


def checkpoint_period_s(events: list[dict]) -> Optional[float]:
    """Median spacing of consecutive durable checkpoints written by the same attempt."""
    gaps: list[float] = []
    by_attempt: dict[tuple, list[float]] = {}
    for e in events:
        if e.get("kind") == "checkpoint" and e.get("durable"):
            by_attempt.setdefault((e.get("replica"), e.get("attempt", 0)), []).append(e["t"])
    for ts in by_attempt.values():
        gaps.extend(np.diff(sorted(ts)).tolist())
    return float(np.median(gaps)) if gaps else None


def fault_cost(run: Any, fault_free: Any = None) -> dict:
    """``R`` and ``L`` of one kind, from a faulted run and optionally a fault-free one."""
    events, spec = _events_and_spec(run)
    faulted = throughput(events, spec)
    rate = faulted["rate_samples_per_s"]
    clean = None
    if fault_free is not None:
        clean = throughput(*_events_and_spec(fault_free))
        rate = clean["rate_samples_per_s"]
    faults = len(replica_faults(events))
    measured = faulted["lost_s"] / faults if faults and faulted["lost_s"] is not None else None
    out = {
        "trainer": spec.trainer,
        "elastic": trainer_kind(spec.trainer).elastic,
        "rate_samples_per_s": rate,
        "faulted_rate_samples_per_s": faulted["rate_samples_per_s"],
        "useful_samples_per_s": faulted["useful_samples_per_s"],
        "goodput": faulted["goodput"],
        "faults": faults,
        "measured_lost_per_fault_s": measured,
        "rolled_back_steps": faulted["rolled_back_steps"],
    }
    if out["elastic"]:
        out["lost_per_fault_s"] = measured
    else:
        restarts = restart_seconds(events)
        period = checkpoint_period_s(events)
        if fault_free is not None and period is None:
            period = checkpoint_period_s(_events_and_spec(fault_free)[0])
        restart = float(np.median(restarts)) if restarts else None
        out.update(restart_s=restart, restart_s_each=restarts, checkpoint_period_s=period)
        out["lost_per_fault_s"] = restart + period / 2 if restart is not None and period is not None else None
    return out


def useful_rate(rate: float, lost_per_fault_s: float, mtbf_s) -> np.ndarray:
    """``R · (1 − L/M)``, floored at 0 (a job that loses more than M per fault makes no progress)."""
    m = np.asarray(mtbf_s, dtype=float)
    return np.maximum(0.0, rate * (1.0 - lost_per_fault_s / m))


def crossing_mtbf(re: float, le: float, rr: float, lr: float) -> Optional[float]:
    """The M where ``re(1 − le/M) = rr(1 − lr/M)``; None when the lines do not cross at M > 0."""
    if re == rr:
        return None
    m = (rr * lr - re * le) / (rr - re)
    return float(m) if m > 0 else None


def breakeven(
    elastic_run: Any, restart_run: Any, elastic_fault_free: Any = None, restart_fault_free: Any = None
) -> dict:
    """Each argument a ``Run`` or ``(events, spec)``; faulted runs required, fault-free ones optional."""
    e = fault_cost(elastic_run, elastic_fault_free)
    r = fault_cost(restart_run, restart_fault_free)
    m = crossing_mtbf(e["rate_samples_per_s"], e["lost_per_fault_s"], r["rate_samples_per_s"], r["lost_per_fault_s"])
    if m is None:
        wins = (
            "always"
            if e["lost_per_fault_s"] <= r["lost_per_fault_s"] and e["rate_samples_per_s"] >= r["rate_samples_per_s"]
            else "never"
        )
    else:
        wins = "below" if e["rate_samples_per_s"] < r["rate_samples_per_s"] else "above"
    return {
        "elastic": e,
        "restart": r,
        "crossing_mtbf_s": m,
        "elastic_wins": wins,  # "below": elastic is better for every MTBF below the crossing
        "fault_free_overhead": 1 - e["rate_samples_per_s"] / r["rate_samples_per_s"],
    }


def breakeven_figure(result: dict):
    """Useful throughput against MTBF (log axis) for both kinds, the crossing marked."""
    e, r, m = result["elastic"], result["restart"], result["crossing_mtbf_s"]
    lo = max(1.0, 0.8 * min(e["lost_per_fault_s"], r["lost_per_fault_s"]))
    hi = max(3600.0, 20 * (m or 0))
    x = np.geomspace(lo, hi, 400)
    fig = go.Figure()
    for k, name in ((e, f"elastic ({e['trainer']})"), (r, f"checkpoint-restart ({r['trainer']})")):
        fig.add_scatter(
            x=x,
            y=useful_rate(k["rate_samples_per_s"], k["lost_per_fault_s"], x),
            mode="lines",
            name=f"{name}: R={k['rate_samples_per_s']:.0f}/s, L={k['lost_per_fault_s']:.1f} s/fault",
        )
    if m is not None:
        y = float(useful_rate(e["rate_samples_per_s"], e["lost_per_fault_s"], m))
        fig.add_scatter(
            x=[m],
            y=[y],
            mode="markers+text",
            marker=dict(size=11, symbol="x"),
            name="break-even",
            text=[f"MTBF {m:.0f} s"],
            textposition="bottom right",
        )
        fig.add_vline(x=m, line_dash="dot")
    fig.update_layout(
        title="Useful throughput vs mean time between failures",
        xaxis_type="log",
        xaxis_title="MTBF (s)",
        yaxis_title="useful samples/s",
        legend_orientation="h",
        height=420,
    )
    return fig
