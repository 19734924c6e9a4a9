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
    """PIDs of this host's processes of the run (controller, lighthouse, local jobs)."""
    import socket

    here = socket.gethostname()
    pids = []
    for e in events:
        if e.get("kind") == "start" or (e.get("kind") == "lighthouse" and e.get("state") == "up"):
            if e.get("pid") and e["pid"] not in pids and e.get("host", here) == here:
                pids.append(e["pid"])
    return pids


def replica_states(events: list[dict], replicas: int) -> dict[int, dict]:
    """Per replica group: state, attempt, step, pid, from events only."""
    out = {r: {"state": "pending", "attempt": 0, "step": 0, "pid": None, "t": None} for r in range(replicas)}
    for e in events:
        kind = e["kind"]
        r = e.get("target") if kind in ("fault", "hang") else e.get("replica")
        if r not in out or e.get("role") == "controller":
            continue
        s = out[r]
        if e.get("attempt", 0) < s["attempt"] and kind not in ("fault", "hang"):
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
        elif kind == "fault":
            if e.get("action") == "kill":
                s["state"] = "dead"
            elif e.get("action") == "hang":
                s["state"] = "hung"
            elif e.get("action") == "resume":
                s["state"] = "participating"
        elif kind == "hang":
            s["state"] = "hung"
        s["t"] = e.get("t")
    return out


def counts(events: list[dict]) -> dict:
    """Faults injected (a hang's resume is not one), restarts and heals."""
    return {
        "faults": sum(1 for e in events if e.get("kind") == "fault" and e.get("action") != "resume"),
        "restarts": sum(1 for e in events if e.get("kind") == "restart"),
        "heals": sum(1 for e in events if e.get("kind") == "heal"),
    }


def status(events: list[dict], spec) -> dict:
    return {
        "state": run_state(events),
        "trainer": spec.trainer,
        "cluster": spec.cluster,
        "steps_target": spec.steps,
        "step": max_committed_step(events),
        **counts(events),
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
        attempt_then = max(
            (e.get("attempt", 0) for e in events if e.get("kind") == "start" and e.get("replica") == victim and e["t"] <= tf),
            default=0,
        )
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
                # The stall can land a step late (the peer died after its share of the step in
                # flight): look at every gap up to the first step committed without the victim.
                n_before = before["participants"].iloc[-1]
                smaller = after[after["participants"] < n_before] if n_before is not None else after.iloc[:0]
                end = smaller.index[0] if not smaller.empty else after.index[min(len(after) - 1, 3)]
                window = pd.concat([before.iloc[-1:], after.loc[:end]])
                stalls.append(float(np.diff(window["t"].to_numpy()).max()) - normal)
            later_attempt = committed["attempt"] > attempt_then if f.get("action") != "hang" else True
            rejoin = committed[
                (committed["replica"] == victim) & (committed["t"] > tf) & later_attempt
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
    timeline = recovery_timeline(events)
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
        **counts(events),
        "survivor_steps_lost": lost,
        "survivor_steps_discarded": discarded,
        "steps_redone": int(pd.to_numeric(timeline["steps_lost"], errors="coerce").fillna(0).sum()) if len(timeline) else 0,
        "survivor_stall_s": mx("survivor_stall_s"),
        "kill_to_rejoin_s": med("kill_to_rejoin_s"),
        "heal_seconds": med("heal_seconds"),
        "heal_bytes": med("heal_bytes"),
        "participants_at_end": members_after,
        "submit_to_first_step_s": first,
    }


# -- recovery timeline -------------------------------------------------------

REPLICA_FAULTS = ("kill", "hang", "preempt", "node_down", "slurmd_kill")
MILESTONES = ("detected", "quorum_without_victim", "replacement_started", "imports_done", "heal_done", "participating")


def recovery_timeline(events: list[dict]) -> pd.DataFrame:
    """One row per fault, each milestone in seconds after the fault (NaN: not reached).

    Elastic (torchft): fault → detected (a survivor's step voted down, or its
    next quorum) → quorum without the victim → replacement started (next
    attempt's ``start``, or the ``resume`` of a hang) → imports done → heal
    done → participating again. Checkpoint-restart (MaxText): fault → restart
    → restore done → first step, with ``steps_lost``.
    """
    evs = sorted(events, key=lambda e: e.get("t", 0.0))
    rows = []
    for f in evs:
        if f.get("kind") == "fault" and f.get("action") == "lighthouse_kill":
            rows.append(_lighthouse_recovery(f, evs))
            continue
        if f.get("kind") != "fault" or f.get("action") not in REPLICA_FAULTS or not isinstance(f.get("target"), int):
            continue
        tf, victim = f["t"], f["target"]
        later = [e for e in evs if e["t"] > tf]
        mine = [e for e in later if e.get("replica") == victim]
        others = [e for e in later if e.get("replica") not in (None, victim)]
        before = [e for e in evs if e["t"] <= tf and e.get("replica") == victim and e.get("kind") == "step"]
        attempt0 = before[-1]["attempt"] if before else f.get("attempt", 0)

        def first(seq, pred):
            return next((e["t"] - tf for e in seq if pred(e)), np.nan)

        last_before = max((e.get("step", 0) for e in before if e.get("committed")), default=0)
        row = {"t": tf, "action": f["action"], "target": victim, "origin": f.get("origin")}
        row["detected"] = first(
            others, lambda e: (e["kind"] == "commit" and e.get("commit_result") is False) or e["kind"] == "quorum"
        )
        row["quorum_without_victim"] = first(others, lambda e: e["kind"] == "quorum")
        if f["action"] == "hang":
            row["replacement_started"] = first(
                later, lambda e: e.get("kind") == "fault" and e.get("action") == "resume" and e.get("target") == victim
            )
            row["imports_done"] = row["replacement_started"]
            new_attempt = lambda e: True  # noqa: E731 - the same process carries on
        else:
            new_attempt = lambda e: e.get("attempt", 0) > attempt0  # noqa: E731
            row["replacement_started"] = first(mine, lambda e: e["kind"] == "start" and new_attempt(e))
            row["imports_done"] = first(
                mine, lambda e: e["kind"] == "phase" and e.get("phase") == "imports_done" and new_attempt(e)
            )
        heals = [e for e in mine if e["kind"] == "heal" and new_attempt(e)]
        restored = [e for e in mine if e["kind"] == "phase" and e.get("phase") == "restored" and new_attempt(e)]
        row["heal_done"] = heals[0]["t"] - tf if heals else (restored[0]["t"] - tf if restored else np.nan)
        row["heal_seconds"] = heals[0].get("seconds") if heals else None
        row["heal_bytes"] = heals[0].get("bytes") if heals else None
        row["participating"] = first(
            mine,
            lambda e: e["kind"] == "step" and e.get("committed") and e.get("participating", True) and new_attempt(e)
            and (not heals or e["t"] >= heals[0]["t"]),
        )
        if restored:
            row["steps_lost"] = max(0, last_before - int(restored[0].get("from_step") or 0))
        elif heals:
            row["steps_lost"] = 0
        else:
            row["steps_lost"] = None
        # A group that comes back behind its peers must heal; a hung one that was still the
        # furthest ahead (its peers died meanwhile) carries on from its own next step.
        back = [e for e in mine if e["kind"] == "step" and e.get("committed") and e.get("participating", True)
                and new_attempt(e)]
        carried_on = f["action"] == "hang" and bool(back) and back[0].get("step") == last_before + 1
        # With every peer down too (overlapping faults), there is no one to heal from: the group
        # restarts from scratch. That recovery completes, but it is a loss, and is flagged.
        lone = bool(back) and not heals and not any(
            e["kind"] == "step" and e.get("committed") and e["t"] <= back[0]["t"] for e in others
            if e["t"] >= tf + (0 if np.isnan(row["replacement_started"]) else row["replacement_started"])
        )
        row["from_scratch"] = bool(lone and f["action"] != "hang")
        required = ["replacement_started", "participating"] + ([] if carried_on or lone else ["heal_done"])
        if any(e.get("kind") == "quorum" for e in evs):
            required += ["detected", "quorum_without_victim"]
        row["complete"] = bool(all(not np.isnan(row[k]) for k in required))
        rows.append(row)
    cols = ["t", "action", "target", "origin", *MILESTONES, "heal_seconds", "heal_bytes", "steps_lost", "from_scratch",
            "complete"]
    return pd.DataFrame(rows, columns=cols)


def _lighthouse_recovery(f: dict, evs: list[dict]) -> dict:
    """Lighthouse killed → seen down → restarted → training commits again."""
    tf = f["t"]
    later = [e for e in evs if e["t"] > tf]

    def first(pred):
        return next((e["t"] - tf for e in later if pred(e)), np.nan)

    row = dict.fromkeys(MILESTONES, np.nan)
    row.update(t=tf, action=f["action"], target="lighthouse", origin=f.get("origin"),
               heal_seconds=None, heal_bytes=None, steps_lost=0, from_scratch=False)
    row["detected"] = first(lambda e: e["kind"] == "lighthouse" and e.get("state") == "down")
    row["replacement_started"] = first(lambda e: e["kind"] == "lighthouse" and e.get("state") == "up")
    up = tf + row["replacement_started"] if not np.isnan(row["replacement_started"]) else float("inf")
    row["participating"] = next(
        (e["t"] - tf for e in later if e["kind"] == "step" and e.get("committed") and e["t"] > up), np.nan
    )
    row["complete"] = bool(not np.isnan(row["replacement_started"]) and not np.isnan(row["participating"]))
    return row


def timeline_figure(timeline: pd.DataFrame):
    """A Gantt-like plotly figure: one bar per fault, one segment per recovery phase."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [f"#{i} {r.action} r{r.target} @{r.t - timeline['t'].min():.0f}s" for i, r in enumerate(timeline.itertuples())]
    prev = np.zeros(len(timeline))
    for name in MILESTONES:
        ends = timeline[name].to_numpy(dtype=float)
        ends_f = np.where(np.isnan(ends), prev, np.maximum(ends, prev))
        fig.add_bar(y=labels, x=ends_f - prev, base=prev, orientation="h", name=f"→ {name.replace('_', ' ')}")
        prev = ends_f
    fig.update_layout(barmode="overlay", xaxis_title="seconds after the fault", height=120 + 40 * len(timeline),
                      title="Recovery timeline", legend_orientation="h")
    return fig


# -- goodput -----------------------------------------------------------------

BADPUT_PARTS = ("stall", "discarded", "heal", "missing", "restart", "startup", "checkpoint", "other")


def goodput(events: list[dict], spec) -> dict:
    """Useful work against the run's own fault-free rate, and where the rest went.

    Work-based: ``goodput = W / (R · T)`` with W the committed, participating
    samples, T the wall time from the first to the last committed step, and R
    the steady-state rate: the mean over the time bins that no fault or
    recovery touched. ``lost_s = T − W / R`` is the full-rate time lost.

    Time-based breakdown, each in full-rate seconds (replica-seconds / groups):
    every replica group's time in [first, last committed step] is split into
    productive steps, ``stall`` (steps slower than normal between a fault and
    the quorum that formed without its victim), ``discarded`` (steps voted down, and the step in flight when it
    died), ``heal`` (the step it healed in), ``missing`` (no process: fault →
    replacement start), ``restart`` (start → first step: imports, model,
    quorum), ``startup`` (joined after the run began), ``checkpoint``, and
    ``other`` (the signed sum of step-time jitter away from faults; ~0 in a
    steady run). A productive step is credited the steady-state step time
    ``n · batch / R``, so the parts add up to ``lost_s`` exactly when every
    group's time is accounted for once — the check that the accounting has no
    gaps or overlaps.
    """
    df = metrics_frame(events)
    empty = {"goodput": None, "rate_samples_per_s": None, "lost_s": None, "T_s": None,
             "badput_s": {k: 0.0 for k in BADPUT_PARTS}, "productive_s": None}
    if df.empty or not df["committed"].astype(bool).any():
        return empty
    df["committed"] = df["committed"].astype(bool)
    df["participating"] = df["participating"].fillna(True).astype(bool)
    batch = spec.model.batch_size if spec.trainer in ("torchft-lite", "ddp-restart") else 1
    # A step redone after a restore from a checkpoint counts once.
    good = df[df["committed"] & df["participating"]].drop_duplicates(["replica", "step"], keep="first")
    t0, t1 = float(df.loc[df["committed"], "t"].min()), float(df.loc[df["committed"], "t"].max())
    T = t1 - t0
    if T <= 0:
        return empty
    intervals = good.groupby(["replica", "attempt"])["t"].diff().dropna()
    median_step = float(intervals.median()) if len(intervals) else T
    width = min(max(1.0, 20 * median_step), T)
    nbins = max(1, int(T // width))
    edges = t0 + width * np.arange(nbins + 1)
    counts, _ = np.histogram(good["t"].to_numpy(), bins=edges)
    # Steady state: the bins that no fault or recovery touches.
    timeline = recovery_timeline(events)
    dirty = np.zeros(nbins, dtype=bool)
    for f in timeline.itertuples():
        end = f.t + (f.participating if not np.isnan(f.participating) else 60.0)
        dirty |= (edges[1:] > f.t - median_step) & (edges[:-1] < end)
    for e in events:
        if e.get("kind") == "fault" and not isinstance(e.get("target"), int):
            dirty |= (edges[1:] > e["t"]) & (edges[:-1] < e["t"] + 30.0)
    clean = ~dirty
    R = float(counts[clean].sum()) * batch / (clean.sum() * width) if clean.any() else float(np.median(counts)) * batch / width
    W = len(good) * batch
    n = spec.replicas if spec.trainer != "maxtext" else 1
    normal = n * batch / R if R > 0 else median_step
    fault_ts = np.array([e["t"] for e in events if e.get("kind") == "fault"])
    # A survivor's stall lasts until the quorum without the victim has formed (and a step or two).
    formed = timeline["quorum_without_victim"].dropna() if len(timeline) else pd.Series(dtype=float)
    stall_window = (float(formed.max()) if len(formed) else 5.0) + 2 * median_step
    ckpt_s = sum(float(e.get("seconds") or 0) for e in events if e.get("kind") == "checkpoint")

    parts = {k: 0.0 for k in BADPUT_PARTS}
    productive = 0.0
    starts = {(e.get("replica"), e.get("attempt", 0)): e["t"] for e in events if e.get("kind") == "start" and e.get("replica") is not None}
    faults_by_target: dict = {}
    for e in events:
        if e.get("kind") == "fault" and isinstance(e.get("target"), int) and e.get("action") in ("kill", "preempt", "node_down", "slurmd_kill"):
            faults_by_target.setdefault(e["target"], []).append(e["t"])
    for r, g in df.groupby("replica"):
        g = g.sort_values("t")
        prev_t, prev_attempt = None, None
        for row in g.itertuples():
            t = row.t
            if t < t0 or t > t1 + 1e-9:
                if t <= t0:
                    prev_t, prev_attempt = t, row.attempt
                continue
            if prev_t is None or prev_t < t0 and prev_attempt != row.attempt:
                begin = starts.get((r, row.attempt), t0)
                if begin > t0:
                    parts["startup" if row.attempt == 0 or prev_t is None else "restart"] += t - max(begin, t0)
                    parts["startup"] += max(0.0, begin - t0) if row.attempt == 0 else 0.0
                    if row.attempt != 0:
                        parts["missing"] += max(0.0, begin - t0)
                prev_t, prev_attempt = t, row.attempt
                continue
            if row.attempt != prev_attempt:
                tf = next((x for x in sorted(faults_by_target.get(r, [])) if x >= prev_t), prev_t)
                begin = starts.get((r, row.attempt), tf)
                parts["discarded"] += max(0.0, tf - max(prev_t, t0))
                parts["missing"] += max(0.0, begin - max(tf, t0))
                parts["restart"] += t - max(begin, t0)
            else:
                dt = t - max(prev_t, t0)
                if not row.committed:
                    parts["discarded"] += dt
                elif not row.participating:
                    parts["heal"] += dt
                else:
                    productive += normal
                    near_fault = fault_ts.size and np.any((fault_ts <= t) & (t <= fault_ts + stall_window))
                    parts["stall" if near_fault else "other"] += dt - normal
            prev_t, prev_attempt = t, row.attempt
    moved = min(max(parts["other"], 0.0), ckpt_s)
    parts["other"] -= moved
    parts["checkpoint"] += moved
    scale = 1.0 / n
    return {
        "goodput": W / (R * T) if R > 0 else None,
        "rate_samples_per_s": R,
        "useful_samples": W,
        "T_s": T,
        "lost_s": T - W / R if R > 0 else None,
        "productive_s": productive * scale,
        "badput_s": {k: v * scale for k, v in parts.items()},
        "normal_step_s": normal,
    }


def goodput_figure(g: dict):
    import plotly.graph_objects as go

    parts = {k: v for k, v in g["badput_s"].items() if v > 0}
    fig = go.Figure(go.Bar(x=list(parts.values()), y=list(parts.keys()), orientation="h"))
    fig.update_layout(
        title=f"Badput: {g['lost_s']:.1f} s of full-rate work lost of {g['T_s']:.0f} s (goodput {g['goodput']:.3f})"
        if g.get("goodput") else "Badput", xaxis_title="full-rate seconds", height=320,
    )
    return fig
