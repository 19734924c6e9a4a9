"""The straggler score on a real run: how low it goes with no fault, how soon it ranks a throttled group worst.

``python -m bench --only straggler`` (or ``python -m bench.straggler [--minutes 5]`` to print the
figures alone). One torchft-lite run, three groups of the ``demo`` decoder made larger (:data:`MODEL`:
a step's own work ~0.15 s, over the 0.1 s period of the CPU quota a ``straggler`` fault sets; the
demo's 20 ms steps run some steps whole inside a period at full speed, so they cannot show the
throttle step by step, and a real trainer's steps are longer still). ``minutes`` fault-free (5 in the
full bench, the issue's check: nothing may be flagged), then a ``straggler`` fault (25 % of a CPU,
:data:`FAULT_S`) on each group in turn, the next one once the last one's window has refilled with
unthrottled steps. The scores are replayed from the run's events step by step, as the live fold
computed them (``analysis.straggler.trace``).

Reported: the lowest relative and individual score of any group over the fault-free stretch and
how many score samples were flagged there; for each fault, the throttled group's steps from the
fault event until the score first ranked it worst (the issue's criterion: within 10), until it
stayed worst for the rest of its first 10, its relative score at its 10th, and until it was first
flagged; the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.analysis import straggler
from workbench.state.steptimes import WARMUP, WINDOW

GROUPS, FAULT_S, WITHIN = 3, 10.0, 10
MODEL = {"dim": 256, "heads": 4, "layers": 2, "seq_len": 64, "batch_size": 16}


def overrides(run_root: Path) -> dict:
    return {
        "faults": [],
        "steps": 10**7,
        "replicas": GROUPS,
        "min_replicas": 1,
        "model": MODEL,
        "run_root": str(run_root),
    }


def throttle_each(run, groups=range(GROUPS), log=print) -> list[tuple[int, float, float]]:
    """A ``straggler`` fault on each of ``groups`` in turn; after each one's undo, wait until that group
    has a fresh window of unthrottled steps. Returns (group, fault event's t, undo event's t) each."""
    out = []
    for g in groups:
        fault = run.kill(replica=g, how="straggler", seconds=FAULT_S)
        log(f"  straggler on group {g} for {FAULT_S:g} s")
        resumed = lambda r: [e["t"] for e in r.events_read if e.get("resumed") == "straggler" and e["t"] > fault["t"]]
        run.wait_for(lambda r: resumed(r), timeout=FAULT_S + 60)
        t_undo = resumed(run)[0]
        fresh = lambda r: sum(
            e.get("kind") == "step" and e.get("replica") == g and e["t"] > t_undo for e in r.events_read
        )
        run.wait_for(lambda r: fresh(r) >= WINDOW + WARMUP, timeout=120)
        out.append((g, fault["t"], t_undo))
    return out


def measure(fault_free_s: float, run_root: Path, log=print) -> dict:
    load_start = os.getloadavg()
    run = wb.submit("demo", overrides(run_root))
    try:
        run.wait_for_step(WARMUP + WINDOW + 5, replica=GROUPS - 1, timeout=300)
        t_free = time.time()
        log(f"  {run.id}: {fault_free_s:g} s fault-free")
        run.wait_for(lambda r: time.time() - t_free >= fault_free_s, timeout=fault_free_s + 120)
        load_mid = os.getloadavg()
        faults = throttle_each(run, log=log)
    finally:
        run.stop(timeout=30)
    return {
        "run": run.id,
        **figures(run.event_records(), faults),
        "fault_free_s": fault_free_s,
        "loadavg_start": load_start,
        "loadavg_before_faults": load_mid,
        "loadavg_end": os.getloadavg(),
    }


def trials(events: list[dict], faults: list[tuple[int, float, float]]) -> list[dict]:
    """Per fault (group, fault t, undo t): the throttled group's step (counted from the fault event) at
    which the score, just after that step, first ranked it worst (lowest relative score), the step from
    which it stayed worst through its ``WITHIN``-th, its relative score at that step, and the first
    step it was flagged (None: not within the fault)."""
    out = []
    scored = [(e, s) for e, s in straggler.trace(events, GROUPS) if len(s) == GROUPS]
    for g, t_fault, t_undo in faults:
        worst, flagged, n, at_within = [], None, 0, None
        for e, by_group in scored:
            if not t_fault < e["t"] < t_undo or e.get("replica") != g:
                continue
            n += 1
            if n <= WITHIN:
                worst.append(min(by_group.values(), key=lambda s: s.relative).replica == g)
                at_within = round(by_group[g].relative, 3)
            if flagged is None and by_group[g].flagged:
                flagged = n
        first = worst.index(True) + 1 if True in worst else None
        stays = next((k + 1 for k in range(len(worst)) if all(worst[k:])), None) if worst and worst[-1] else None
        out.append(
            {
                "group": g,
                "steps": n,
                "worst_at": first,
                "worst_from": stays,
                "relative_at_within": at_within,
                "flagged_at": flagged,
            }
        )
    return out


def figures(events: list[dict], faults: list[tuple[int, float, float]]) -> dict:
    """The fault-free stretch's figures (before the first fault) and each fault's (module docstring)."""
    free_rel, free_ind, free_flagged, free_samples = 1.0, 1.0, 0, 0
    first_fault = min(t for _, t, _ in faults)
    for e, by_group in straggler.trace(events, GROUPS):
        if len(by_group) < GROUPS or e["t"] >= first_fault:
            continue
        free_samples += 1
        free_rel = min(free_rel, *(s.relative for s in by_group.values()))
        free_ind = min(free_ind, *(s.individual for s in by_group.values()))
        free_flagged += any(s.flagged for s in by_group.values())
    per_fault = trials(events, faults)
    worst_at = [t["worst_at"] for t in per_fault]
    return {
        "fault_free_samples": free_samples,
        "fault_free_min_relative": round(free_rel, 3),
        "fault_free_min_individual": round(free_ind, 3),
        "fault_free_flagged_samples": free_flagged,
        "faults": per_fault,
        "median_worst_at": statistics.median(worst_at) if None not in worst_at else None,
        "window": WINDOW,
        "threshold": straggler.RELATIVE_THRESHOLD,
    }


def render(r: dict) -> list[str]:
    load = lambda x: "/".join(f"{v:.1f}" for v in x)
    per = "; ".join(
        f"group {t['group']}: worst at step {t['worst_at']} (and from {t['worst_from']} on; relative "
        f"{t['relative_at_within']} at step {WITHIN}), flagged at {t['flagged_at']}"
        for t in r["faults"]
    )
    return [
        f"## Straggler score (three torchft-lite groups, model {MODEL}, each throttled in turn)",
        "",
        f"- fault-free, {r['fault_free_s']:g} s ({r['fault_free_samples']} score samples): lowest relative score "
        f"{r['fault_free_min_relative']}, lowest individual {r['fault_free_min_individual']}; flagged samples "
        f"{r['fault_free_flagged_samples']} (relative threshold {r['threshold']}, "
        f"window {r['window']} steps)",
        f"- `straggler` ({FAULT_S:g} s, 25 % of a CPU), the throttled group's steps from the fault: {per}; "
        f"median step at which it was first worst: {r['median_worst_at']} (criterion: within {WITHIN})",
        f"- load average (1/5/15 min) at start {load(r['loadavg_start'])}, before the faults "
        f"{load(r['loadavg_before_faults'])}, at end {load(r['loadavg_end'])}",
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="fault-free minutes before the faults")
    ap.add_argument("--run-root", help="keep the run here (default: a temporary directory)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wb-bench-straggler-") as tmp:
        r = measure(args.minutes * 60, Path(args.run_root or tmp))
    print(json.dumps(r, indent=1))
    print("\n".join(render(r)))
    ok = r["fault_free_flagged_samples"] == 0 and all(
        t["worst_from"] and t["relative_at_within"] < r["fault_free_min_relative"] for t in r["faults"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
