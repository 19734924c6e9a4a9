"""One replicate of each strategy: one draw of failure times turned into useful work and badput by cause.

The strategies' rules and why a replicate is a few numpy passes over the
failure times rather than an event loop: ``model``. Each function returns the
replicate's useful seconds (per group), optimizer steps, badput seconds by
cause (``model.BADPUT``) and failure count.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional

import numpy as np

from workbench.projection.inputs import CheckpointRestart, DiLoCo, Elastic, Job


def restart_replicate(job: Job, t: np.ndarray, cr: CheckpointRestart, mtbf_s: float) -> dict:
    c = cr.costs(job, mtbf_s)
    tau, w, down = c["period_s"], c["write_s"], c["down_s"] + c["restore_s"]
    H = job.horizon_s
    starts = np.concatenate([[0.0], t])
    ends = np.concatenate([t, [H]])
    gaps = ends - starts
    # Each failure's downtime (the first interval starts up); a failure within it starts it again.
    dead = np.where(np.arange(len(gaps)) == 0, 0.0, np.minimum(gaps, down))
    up = gaps - dead
    cycle = tau + w
    k = np.floor(up / cycle)
    rem = up - k * cycle
    last = np.arange(len(gaps)) == len(gaps) - 1  # the window's end is not a failure: nothing is lost
    lost = np.where(last, 0.0, np.minimum(rem, tau))
    part_write = np.maximum(rem - tau, 0.0)
    useful = k * tau + np.where(last, np.minimum(rem, tau), 0.0)
    written = k * w + part_write
    frac_restart = c["down_s"] / down if down > 0 else 0.0
    return {
        "useful_s": float(useful.sum()),
        "steps": float(useful.sum()) / job.step_s,
        "badput_s": {
            "checkpoint": float(written.sum()),
            "recompute": float(lost.sum()),
            "restart": float(dead.sum()) * frac_restart,
            "restore": float(dead.sum()) * (1 - frac_restart),
        },
        "failures": int(len(t)),
        "period_s": tau,
        "write_s": w,
    }


def _absences(job: Job, t: np.ndarray, g: np.ndarray, el: Elastic, sync_period_s: Optional[float]) -> tuple:
    """Per group its merged absences [lo, hi); per failure its cost parts; the survivors' stall.

    A failure of a group already out (killed again while it restarts or heals) extends its absence
    and stalls no one: the survivors' quorum no longer has it. The replacement comes from the
    spare pool when one is free.
    """
    heal = el.heal(job)
    free = el.spares
    returns: list[float] = []
    out: dict[int, list[list[float]]] = {}
    parts = np.zeros((len(t), 3))  # missing (replacement + restart), heal, lost inner work
    stalls = 0.0  # group-seconds: each live hit stalls the groups still live, if they keep a quorum
    stalled = 0  # failures that stalled a quorum
    for i, (ti, gi) in enumerate(zip(t, g)):
        while returns and returns[0] <= ti:
            heapq.heappop(returns)
            free += 1
        if free > 0:
            free -= 1
            heapq.heappush(returns, ti + el.replacement_s)
            repl = el.spare_s
        else:
            repl = el.replacement_s
        back = ti + repl + el.restart_s + heal + el.rejoin_s
        start = ti
        if sync_period_s:
            start = math.floor(ti / sync_period_s) * sync_period_s
            back = math.ceil(back / sync_period_s) * sync_period_s
        spans = out.setdefault(int(gi), [])
        if spans and ti < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], back)
        else:
            others = job.groups - 1 - sum(1 for k, v in out.items() if k != gi and v and v[-1][0] <= ti < v[-1][1])
            if others >= max(el.min_groups, 1):
                stalls += el.stall_s * others
                stalled += 1
            spans.append([start, back])
        parts[i] = (repl + el.restart_s, heal, ti - start)
    merged = [(a, b) for spans in out.values() for a, b in spans]
    return merged, parts, stalls, stalled


def group_replicate(job: Job, t: np.ndarray, g: np.ndarray, el: Elastic) -> dict:
    H, R = job.horizon_s, job.groups
    sync = el.sync_s(job) if isinstance(el, DiLoCo) else 0.0
    over = el.step_overhead(job)
    sync_period = el.sync_steps * job.step_s * (1 + over) + sync if isinstance(el, DiLoCo) else None
    merged, parts, stall, stalled = _absences(job, t, g, el, sync_period)
    # Live groups over time: a sweep over the absences' ends, clipped to the window.
    edges = [(max(0.0, a), -1) for a, b in merged if a < H] + [(min(H, b), +1) for a, b in merged if a < H]
    edges.sort()
    live, prev = R, 0.0
    live_s = 0.0  # group-seconds live while a quorum exists
    no_quorum = 0.0
    quorum_s = 0.0  # wall seconds with a quorum (steps advance)
    for x, d in edges + [(H, 0)]:
        span = x - prev
        if live >= el.min_groups and live > 0:
            live_s += live * span
            quorum_s += span
        else:
            no_quorum += live * span
        live += d
        prev = x
    absent = R * H - live_s - no_quorum
    discarded = 0.0
    if sync_period:
        # torchft's DiLoCo: a failure between outer steps fails the next one, and every group discards
        # the inner steps since the last (local_sgd.py: "sync_every steps will be discarded").
        discarded = len(np.unique(np.floor(t / sync_period))) * sync_period * (R - 1)
    stall = min(stall + discarded, live_s)
    live_s -= stall + el.startup_s
    quorum_s -= el.stall_s * stalled
    slow = 1.0 + over
    if sync_period:
        slow *= sync_period / (sync_period - sync) if sync_period > sync else math.inf
    useful = live_s / slow
    total_parts = parts.sum(axis=0) if len(parts) else np.zeros(3)
    # Absent group-seconds split by cause in proportion to each failure's parts (merging overlaps shrinks all).
    raw = total_parts.sum()
    share = total_parts / raw if raw > 0 else np.zeros(3)
    overhead = live_s - useful
    sync_part = live_s / (1 + over) - useful if sync_period else 0.0
    badput = {
        "overhead": (overhead - sync_part) / R,
        "sync": sync_part / R,
        "missing": absent * share[0] / R,
        "heal": absent * share[1] / R,
        "recompute": absent * share[2] / R,
        "stall": (stall - min(discarded, stall)) / R,
        "discarded": min(discarded, stall) / R,
        "no_quorum": no_quorum / R,
        "startup": el.startup_s / R,
    }
    return {
        "useful_s": useful / R,
        "steps": max(quorum_s, 0.0) / (job.step_s * slow),
        "badput_s": badput,
        "failures": int(len(t)),
    }
