"""From events to answers: run state, metrics, and what each fault cost.

All functions take the list of event dicts (as read from the run directory)
and are pure, so the notebook, the CLI, the dashboard and the tests compute
the same figures.

Definitions used in the summary:

- *survivor*: a replica group that was not the target of any fault and never
  relaunched (attempt 0 throughout).
- ``survivor_steps_lost``: committed steps a survivor had to redo — a
  committed step number it repeated or went back to. Elastic recovery
  promises 0; a checkpoint-restart job loses everything since its checkpoint.
- ``survivor_steps_discarded``: step attempts a survivor computed that were
  voted down (``committed=False``) because a peer died mid-step; the same step
  number is retried on the same batch, so no progress is lost, only time.
- ``survivor_stall_s``: per kill, the longest gap between a survivor's last
  committed step before the fault and its first committed step after it,
  minus that survivor's median step interval; the max over kills.
- ``kill_to_rejoin_s``: per kill, from the fault event to the victim's next
  attempt's first committed step while participating; the median over kills.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

STEP_COLUMNS = [
    "t", "replica", "attempt", "step", "loss", "committed", "participating", "participants",
    "quorum_id", "step_time_s", "tokens_per_s", "weights",
]


def metrics_frame(events: list[dict]) -> pd.DataFrame:
    rows = [e for e in events if e.get("kind") == "step"]
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=STEP_COLUMNS)
    for col in STEP_COLUMNS:
        if col not in df:
            df[col] = None
    cols = STEP_COLUMNS + [c for c in df.columns if c not in STEP_COLUMNS and c not in ("kind", "run", "host", "pid")]
    return df[cols].sort_values(["t"], kind="stable").reset_index(drop=True)


def run_state(events: list[dict]) -> str:
    ends = [e for e in events if e.get("kind") == "run_end"]
    if ends:
        return ends[-1].get("state", "failed")
    if any(e.get("kind") == "step" for e in events):
        return "running"
    if any(e.get("kind") == "start" for e in events):
        return "starting"
    return "pending"


def max_committed_step(events: list[dict], replica: Optional[int] = None) -> int:
    steps = [
        e.get("step", 0) for e in events
        if e.get("kind") == "step" and e.get("committed") and (replica is None or e.get("replica") == replica)
    ]
    return max(steps, default=0)


def controller_pid(events: list[dict]) -> Optional[int]:
    for e in events:
        if e.get("kind") == "start" and e.get("role") == "controller":
            return e.get("pid")
    return None


def all_pids(events: list[dict]) -> list[int]:
    pids = []
    for e in events:
        if e.get("kind") == "start" or (e.get("kind") == "lighthouse" and e.get("state") == "up"):
            if e.get("pid") and e["pid"] not in pids:
                pids.append(e["pid"])
    return pids


def replica_states(events: list[dict], replicas: int) -> dict[int, dict]:
    """Per replica group: state, attempt, step, pid, from events only."""
    out = {r: {"state": "pending", "attempt": 0, "step": 0, "pid": None, "t": None} for r in range(replicas)}
    for e in events:
        r = e.get("replica")
        if r not in out or e.get("role") == "controller":
            continue
        s = out[r]
        kind = e["kind"]
        if e.get("attempt", 0) < s["attempt"] and kind not in ("fault",):
            continue
        if kind == "submit":
            s.update(attempt=e.get("attempt", 0), state="pending")
        elif kind == "start":
            s.update(attempt=e.get("attempt", 0), state="starting", pid=e.get("pid"))
        elif kind == "heal":
            s.update(state="healing", step=e.get("step", s["step"]))
        elif kind == "step":
            s["step"] = e.get("step", s["step"])
            s["state"] = "participating" if e.get("participating", True) else "healing"
        elif kind == "exit" and e.get("attempt", 0) == s["attempt"]:
            s["state"] = "finished" if e.get("reason") == "completed" else "dead"
        elif kind == "job" and e.get("attempt", 0) == s["attempt"] and not e.get("clean"):
            s["state"] = "dead"
        elif kind == "fault" and e.get("target") == r:
            if e.get("action") == "kill":
                s["state"] = "dead"
            elif e.get("action") == "hang":
                s["state"] = "hung"
            elif e.get("action") == "resume":
                s["state"] = "participating"
        s["t"] = e.get("t")
    return out


def status(events: list[dict], spec) -> dict:
    return {
        "state": run_state(events),
        "trainer": spec.trainer,
        "cluster": spec.cluster,
        "steps_target": spec.steps,
        "step": max_committed_step(events),
        "faults": sum(1 for e in events if e.get("kind") == "fault" and e.get("action") != "resume"),
        "restarts": sum(1 for e in events if e.get("kind") == "restart"),
        "heals": sum(1 for e in events if e.get("kind") == "heal"),
        "replicas": {str(k): v for k, v in replica_states(events, spec.replicas).items()},
    }


def _committed(events: list[dict]) -> pd.DataFrame:
    df = metrics_frame(events)
    if df.empty:
        return df
    return df[df["committed"].astype(bool)]


def fault_recoveries(events: list[dict]) -> pd.DataFrame:
    """One row per kill: when, whom, survivors' stall and lost steps, rejoin time."""
    df = metrics_frame(events)
    kills = [e for e in events if e.get("kind") == "fault" and e.get("action") == "kill"]
    victims = {e.get("target") for e in events if e.get("kind") == "fault" and isinstance(e.get("target"), int)}
    rows = []
    for f in kills:
        tf, victim = f["t"], f.get("target")
        row = {"t": tf, "target": victim, "origin": f.get("origin")}
        stalls = []
        if not df.empty:
            committed = df[df["committed"].astype(bool)]
            for r, g in committed.groupby("replica"):
                if r in victims or (g["attempt"] != 0).any():
                    continue
                before = g[g["t"] <= tf]
                after = g[g["t"] > tf]
                if before.empty or after.empty:
                    continue
                normal = float(np.median(np.diff(g["t"].to_numpy()))) if len(g) > 2 else 0.0
                stalls.append(float(after["t"].iloc[0] - before["t"].iloc[-1]) - normal)
            rejoin = committed[
                (committed["replica"] == victim) & (committed["t"] > tf)
                & (committed["participating"].fillna(True).astype(bool))
            ]
            row["kill_to_rejoin_s"] = float(rejoin["t"].iloc[0] - tf) if not rejoin.empty else None
            heals = [e for e in events if e.get("kind") == "heal" and e.get("replica") == victim and e["t"] > tf]
            row["healed"] = bool(heals)
            row["heal_step"] = heals[0].get("step") if heals else None
            row["heal_seconds"] = heals[0].get("seconds") if heals else None
            row["heal_bytes"] = heals[0].get("bytes") if heals else None
        row["survivor_stall_s"] = max(stalls) if stalls else None
        rows.append(row)
    return pd.DataFrame(rows)


def survivor_steps(events: list[dict]) -> tuple[int, int]:
    """(lost, discarded) step counts over all survivors; see the module docstring."""
    df = metrics_frame(events)
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


def summary(events: list[dict], spec) -> dict:
    rec = fault_recoveries(events)
    lost, discarded = survivor_steps(events)
    starts = [e["t"] for e in events if e.get("kind") == "start" and e.get("role") == "controller"]
    committed = _committed(events)
    first = float(committed["t"].min() - starts[0]) if starts and not committed.empty else None
    members_after = None
    if not rec.empty:
        last_quorums = [e for e in events if e.get("kind") == "step" and e.get("committed")]
        members_after = max((e.get("participants") or 0 for e in last_quorums[-3 * spec.replicas:]), default=None)

    def med(col):
        if rec.empty or col not in rec or rec[col].dropna().empty:
            return None
        return float(rec[col].dropna().median())

    def mx(col):
        if rec.empty or col not in rec or rec[col].dropna().empty:
            return None
        return float(rec[col].dropna().max())

    return {
        "state": run_state(events),
        "trainer": spec.trainer,
        "replicas": spec.replicas,
        "steps_target": spec.steps,
        "steps_completed": max_committed_step(events),
        "faults": sum(1 for e in events if e.get("kind") == "fault" and e.get("action") != "resume"),
        "restarts": sum(1 for e in events if e.get("kind") == "restart"),
        "heals": sum(1 for e in events if e.get("kind") == "heal"),
        "survivor_steps_lost": lost,
        "survivor_steps_discarded": discarded,
        "survivor_stall_s": mx("survivor_stall_s"),
        "kill_to_rejoin_s": med("kill_to_rejoin_s"),
        "heal_seconds": med("heal_seconds"),
        "heal_bytes": med("heal_bytes"),
        "participants_at_end": members_after,
        "submit_to_first_step_s": first,
    }
