"""Goodput: useful work against the run's own fault-free rate, and where the rest went."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from workbench.analysis.metrics import metrics_frame
from workbench.analysis.recovery import recovery_timeline
from workbench.analysis.useful import decided
from workbench.faults import kinds as faultkinds
from workbench.trainers import trainer_kind

BADPUT_PARTS = ("stall", "discarded", "heal", "missing", "restart", "startup", "checkpoint", "other")


def goodput(events: Sequence[dict], spec, timeline: Optional[pd.DataFrame] = None) -> dict:
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

    A semi-synchronous algorithm's steps count as :mod:`.useful` decides them:
    an inner step is work once its process's next sync committed, so a fault
    between syncs shows as the victim's inner steps since its last committed
    sync, ``discarded``, and nothing of the survivors'.

    ``timeline``: this run's ``recovery_timeline`` if the caller already has it.
    """
    events = decided(events)
    df = metrics_frame(events)
    empty = {
        "goodput": None,
        "rate_samples_per_s": None,
        "lost_s": None,
        "T_s": None,
        "badput_s": {k: 0.0 for k in BADPUT_PARTS},
        "productive_s": None,
    }
    if df.empty or not df["committed"].astype(bool).any():
        return empty
    df["committed"] = df["committed"].astype(bool)
    df["participating"] = df["participating"].fillna(True).astype(bool)
    batch = trainer_kind(spec.trainer).samples_per_step(spec)
    stepped = df[df["committed"] & df["participating"]]
    # A step redone after a restore from a checkpoint counts once as work, but the job stepped at its
    # steady rate while redoing it: the rate is measured on every step taken.
    good = stepped.drop_duplicates(["replica", "step"], keep="first")
    t0, t1 = float(df.loc[df["committed"], "t"].min()), float(df.loc[df["committed"], "t"].max())
    T = t1 - t0
    if T <= 0:
        return empty
    intervals = good.groupby(["replica", "attempt"])["t"].diff().dropna()
    median_step = float(intervals.median()) if len(intervals) else T
    width = min(max(1.0, 20 * median_step), T)
    nbins = max(1, int(T // width))
    edges = t0 + width * np.arange(nbins + 1)
    ts = stepped["t"].to_numpy()
    counts, _ = np.histogram(ts[ts < edges[-1]], bins=edges)  # half-open bins, the last one too
    # Steady state: the bins that no fault or recovery touches.
    timeline = recovery_timeline(events) if timeline is None else timeline
    faults = [e for e in events if e.get("kind") == "fault"]
    dirty = np.zeros(nbins, dtype=bool)
    for f in timeline.itertuples():
        end = f.t + (f.participating if not np.isnan(f.participating) else 60.0)
        dirty |= (edges[1:] > f.t - median_step) & (edges[:-1] < end)
    for e in faults:
        if not isinstance(e.get("target"), int):
            dirty |= (edges[1:] > e["t"]) & (edges[:-1] < e["t"] + 30.0)
    clean = ~dirty
    R = (
        float(counts[clean].sum()) * batch / (clean.sum() * width)
        if clean.any()
        else float(np.median(counts)) * batch / width
    )
    W = len(good) * batch
    n = trainer_kind(spec.trainer).step_writers(spec)
    normal = n * batch / R if R > 0 else median_step
    # A survivor's stall lasts until the quorum without the victim has formed (and a step or two).
    formed = timeline["quorum_without_victim"].dropna() if len(timeline) else pd.Series(dtype=float)
    stall_window = (float(formed.max()) if len(formed) else 5.0) + 2 * median_step
    fault_ts = np.sort(np.array([e["t"] for e in faults], dtype=float))
    ckpt_s = sum(float(e.get("seconds") or 0) for e in events if e.get("kind") == "checkpoint")

    parts = {k: 0.0 for k in BADPUT_PARTS}
    productive = 0.0
    starts = {
        (e.get("replica"), e.get("attempt", 0)): e["t"]
        for e in events
        if e.get("kind") == "start" and e.get("replica") is not None
    }
    ending_faults: dict = {}
    for e in faults:
        action = e.get("action")
        kind = faultkinds.kind(action) if isinstance(action, str) else None
        if isinstance(e.get("target"), int) and kind is not None and kind.targets == "replica" and kind.ends_process:
            ending_faults.setdefault(e["target"], []).append(e["t"])
    for r, g in df.groupby("replica"):
        ts, attempts = g["t"].to_numpy(dtype=float), g["attempt"].to_numpy()
        committed, participating = g["committed"].to_numpy(), g["participating"].to_numpy()
        # After a fault at f, a step until f + stall_window is near it; the latest fault before t decides.
        latest = np.searchsorted(fault_ts, ts, side="right") - 1
        near_fault = (
            (latest >= 0) & (ts <= fault_ts[np.maximum(latest, 0)] + stall_window)
            if fault_ts.size
            else np.zeros(len(ts), dtype=bool)
        )
        ended = sorted(ending_faults.get(r, []))
        prev_t, prev_attempt = None, None
        for i, t in enumerate(ts):
            attempt = attempts[i]
            if t < t0 or t > t1 + 1e-9:
                if t <= t0:
                    prev_t, prev_attempt = t, attempt
                continue
            if prev_t is None or prev_t < t0 and prev_attempt != attempt:
                begin = starts.get((r, attempt), t0)
                if begin > t0:
                    parts["startup" if attempt == 0 or prev_t is None else "restart"] += t - max(begin, t0)
                    parts["startup"] += max(0.0, begin - t0) if attempt == 0 else 0.0
                    if attempt != 0:
                        parts["missing"] += max(0.0, begin - t0)
                prev_t, prev_attempt = t, attempt
                continue
            if attempt != prev_attempt:
                tf = next((x for x in ended if x >= prev_t), prev_t)
                begin = starts.get((r, attempt), tf)
                parts["discarded"] += max(0.0, tf - max(prev_t, t0))
                parts["missing"] += max(0.0, begin - max(tf, t0))
                parts["restart"] += t - max(begin, t0)
            else:
                dt = t - max(prev_t, t0)
                if not committed[i]:
                    parts["discarded"] += dt
                elif not participating[i]:
                    parts["heal"] += dt
                else:
                    productive += normal
                    parts["stall" if near_fault[i] else "other"] += dt - normal
            prev_t, prev_attempt = t, attempt
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
