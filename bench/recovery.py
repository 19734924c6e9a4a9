"""From the sessions' event logs to the recovery, throughput and startup figures.

- kill recovery (torchft-lite runs with kills): per fault that ended a process,
  from the run's one ``analysis.recovery_timeline``, the survivors' stall
  beyond a normal step and the victim's kill → participating time (a fresh
  process, relaunched by the controller), and per run the survivors' lost and
  discarded steps (``analysis.summary``).
- throughput: the steady-state (fault-free) rate of each run and the useful
  rate under kills, both in committed samples/s via ``workbench.analysis.breakeven.
  throughput`` (``analysis.goodput``'s window and steady-state rate, each
  (replica, step) counted once, so a checkpoint-restart job's redone steps are
  not counted twice).
- submit → first committed step (``analysis.summary``), for every run.
- writer A/B: the step rate from ``heartbeat`` events (which report the step
  whether or not step events are written), events on vs off.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench import analysis
from workbench.analysis import breakeven

from .sessions import RunRecord


def kill_recoveries(records: list[RunRecord]) -> pd.DataFrame:
    """One row per fault that ended a process, from the run's one recovery timeline."""
    rows = []
    for rec in records:
        for _, f in rec.timeline[analysis.ends_process(rec.timeline)].iterrows():
            rows.append(
                {
                    "variant": rec.variant,
                    "run_dir": rec.run_dir,
                    "target": f["target"],
                    "survivor_stall_s": f["survivor_stall_s"],
                    "kill_to_participating_s": f["participating"],
                    "replacement_started_s": f["replacement_started"],
                    "imports_done_s": f["imports_done"],
                    "heal_done_s": f["heal_done"],
                    "steps_lost_by_victim": f["steps_lost"],
                }
            )
    return pd.DataFrame(rows)


def survivor_steps(records: list[RunRecord]) -> pd.DataFrame:
    rows = []
    for rec in records:
        s = analysis.summary(rec.events, rec.spec, rec.timeline)
        rows.append(
            {
                "variant": rec.variant,
                "faults": s["faults"],
                "survivor_steps_lost": s["survivor_steps_lost"],
                "survivor_steps_discarded": s["survivor_steps_discarded"],
                "survivor_stall_max_s": s["survivor_stall_s"],
            }
        )
    return pd.DataFrame(rows)


def throughputs(records: list[RunRecord]) -> pd.DataFrame:
    rows = []
    for rec in records:
        t = breakeven.throughput(rec.events, rec.spec)
        steps = [e for e in rec.events if e.get("kind") == "step" and e.get("committed")]
        rows.append(
            {
                "variant": rec.variant,
                "trainer": rec.spec.trainer,
                "faults": len(breakeven.replica_faults(rec.events)),
                "window_s": t["T_s"],
                "steady_rate": t["rate_samples_per_s"],
                "useful_rate": t["useful_samples_per_s"],
                "goodput": t["goodput"],
                "rolled_back_steps": t.get("rolled_back_steps"),
                "median_step_time_s": float(np.median([e["step_time_s"] for e in steps if e.get("step_time_s")]))
                if steps
                else None,
                "loadavg_1m": rec.loadavg[0],
            }
        )
    return pd.DataFrame(rows)


def startup(records: list[RunRecord]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "variant": rec.variant,
                "trainer": rec.spec.trainer,
                "submit_to_first_step_s": analysis.summary(rec.events, rec.spec, rec.timeline)[
                    "submit_to_first_step_s"
                ],
            }
            for rec in records
        ]
    )


def heartbeat_rate(events: list[dict], spec) -> float | None:
    """Samples/s from the replicas' heartbeats (step reached vs time), skipping the first 3 s."""
    beats = [e for e in events if e.get("kind") == "heartbeat" and e.get("replica") is not None]
    if not beats:
        return None
    t_first = min(e["t"] for e in beats)
    rates = []
    for r in {e["replica"] for e in beats}:
        mine = sorted((e["t"], e["step"]) for e in beats if e["replica"] == r and e["t"] > t_first + 3)
        if len(mine) >= 3 and mine[-1][0] > mine[0][0]:
            rates.append((mine[-1][1] - mine[0][1]) / (mine[-1][0] - mine[0][0]))
    return float(np.mean(rates)) * spec.replicas * spec.model.batch_size if rates else None


def writer_ab(records: list[RunRecord]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "variant": rec.variant,
                "heartbeat_rate": heartbeat_rate(rec.events, rec.spec),
                "loadavg_1m": rec.loadavg[0],
            }
            for rec in records
        ]
    )


def ratio_of_medians(df: pd.DataFrame, col: str, num: str, den: str) -> float | None:
    a = df.loc[df["variant"] == num, col].dropna()
    b = df.loc[df["variant"] == den, col].dropna()
    return float(a.median() / b.median()) if len(a) and len(b) and b.median() else None


def median_p95(xs) -> dict:
    """``n``, ``median_s`` and ``p95_s`` (numpy's linear percentile) of the seconds ``xs``; None where ``xs`` is empty."""
    xs = [float(x) for x in xs]
    return {
        "n": len(xs),
        "median_s": float(np.median(xs)) if xs else None,
        "p95_s": float(np.percentile(xs, 95)) if xs else None,
    }
