"""Chaos soak: many random faults against one run, then invariants checked from the run directory alone.

``python -m workbench.experiments.soak [--faults 50] [--mtbf 4] [--cluster local|slurm]``
submits a torchft-lite run with a seeded chaos schedule (kills, hangs,
lighthouse kills; on Slurm also node down), waits for it, and prints the
invariant counts. ``make soak`` runs the long version; the test suite runs a
short one.

Invariants, each computed from events only:

- the run completed its target step;
- no survivor crashed: every attempt that ended without completing was itself
  the target of an injected fault that ends a process (``unexplained_crashes``;
  a hang, freeze or straggler is one the group must live through);
- every committed step of every replica attempt is recorded exactly once, and
  within an attempt committed steps only go up;
- the replicas' weights are identical at the end;
- no partially written checkpoint was loaded: every restore names a step that
  a ``durable`` checkpoint event recorded (torchft-lite heals from live peers'
  memory, so it has none to check);
- every fault has a complete recovery-timeline row;
- every scheduled fault fired. The schedule is in seconds and the run's length
  in steps, so a run that steps faster than its spec was sized for ends with
  faults still due; ``soak_spec`` sizes ``steps`` from the drawn schedule at the
  fastest a step can go (``step_delay_s``) so that cannot happen.

Also counted, not an invariant: ``restarts_from_scratch``, kills that found
every peer down as well (overlapping faults), so the replacement had no one
to heal from. Elastic training without checkpoints loses its state then;
hot spares (``spares: 1`` here) shorten recoveries and so these overlaps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from workbench import analysis
from workbench.cluster import backend_names
from workbench.faults import kinds as faultkinds
from workbench.run.handle import Run, submit
from workbench.spec.load import load_spec
from workbench.spec.schedule import materialize


def unexplained_crashes(events: list[dict]) -> list[dict]:
    """``job`` events of attempts that ended unclean with no process-ending fault aimed at that very attempt.

    An attempt of group r lives from its ``submit`` (or a spare's takeover ``restart``) to the
    ``job`` event that ends it. A fault explains the end if it is of a kind that ends a process
    (``ends_process`` in ``workbench.faults.kinds``: a kill, an abort, a preemption, a node down,
    the watchdog's kill) and targeted r while that attempt was r's current one: the fault's
    ``attempt`` where the backend recorded it, else its time inside the attempt's life. A fault
    the group is meant to survive (a hang, a freeze, a straggler, a partition: it pauses or
    impairs the process and the process carries on) is no alibi: a group that died of one is a
    crash the soak exists to find. Nor is a group whose *earlier* attempt was killed. An attempt
    the controller stopped itself (``reason: stopped``) did not crash.
    """
    born: dict[tuple, float] = {}
    for e in events:
        if e["kind"] in ("submit", "restart") and isinstance(e.get("replica"), int):
            born.setdefault((e["replica"], e.get("attempt", 0)), e["t"])
    ending = faultkinds.ending_kinds()
    faults = [
        e for e in events if e["kind"] == "fault" and e.get("action") in ending and isinstance(e.get("target"), int)
    ]
    out = []
    for job in events:
        if job["kind"] != "job" or job.get("clean") or job.get("reason") == "stopped":
            continue
        r, a = job.get("replica"), job.get("attempt", 0)
        t0 = born.get((r, a), float("-inf"))
        explained = any(f["target"] == r and (f.get("attempt") == a or t0 <= f["t"] <= job["t"]) for f in faults)
        if not explained:
            out.append(job)
    return out


def check_invariants(run: Run) -> dict:
    events = run.event_records()
    crashes = unexplained_crashes(events)
    df = run.metrics()
    committed = df[df["committed"].astype(bool)] if not df.empty else df
    duplicates = int(committed.duplicated(["replica", "attempt", "step"]).sum()) if not df.empty else 0
    backwards = 0
    for _, g in committed.groupby(["replica", "attempt"]):
        steps = g.sort_values("t")["step"].to_numpy()
        backwards += int((steps[1:] <= steps[:-1]).sum())
    final = [e for e in events if e["kind"] == "exit" and e.get("reason") == "completed"]
    durable = {e.get("step") for e in events if e["kind"] == "checkpoint" and e.get("durable")}
    restores = [e for e in events if e["kind"] == "phase" and e.get("phase") == "restored"]
    bad_restores = [e for e in restores if e.get("from_step") not in durable and e.get("from_step") not in (0, None)]
    timeline = analysis.recovery_timeline(events)
    faults = [e for e in events if e["kind"] == "fault" and e.get("action") != faultkinds.RESUME]
    scheduled = len(run.spec.faults)
    result = {
        "state": run.state(),
        "steps": analysis.max_committed_step(events),
        "steps_target": run.spec.steps,
        "faults": len(faults),
        "faults_scheduled": scheduled,
        "faults_not_fired": scheduled - sum(1 for e in faults if e.get("origin") == "schedule"),
        "faults_by_action": {
            a: sum(1 for e in faults if e["action"] == a) for a in sorted({e["action"] for e in faults})
        },
        "restarts": sum(1 for e in events if e["kind"] == "restart"),
        "heals": sum(1 for e in events if e["kind"] == "heal"),
        "survivor_crashes": len(crashes),
        "duplicate_committed_steps": duplicates,
        "steps_going_back": backwards,
        "final_weights_distinct": len({e.get("weights") for e in final}),
        "replicas_completed": len({e["replica"] for e in final}),
        "restores": len(restores),
        "restores_of_non_durable_checkpoints": len(bad_restores),
        "timeline_rows": len(timeline),
        "timeline_incomplete": int((~timeline["complete"]).sum()) if len(timeline) else 0,
        "restarts_from_scratch": int(timeline["from_scratch"].fillna(False).sum()) if len(timeline) else 0,
        "survivor_steps_lost": analysis.survivor_steps(events)[0],
    }
    result["invariants_hold"] = (
        result["state"] == "completed"
        and result["steps"] == result["steps_target"]
        and result["survivor_crashes"] == 0
        and duplicates == 0
        and backwards == 0
        and result["final_weights_distinct"] == 1
        and not bad_restores
        and result["timeline_rows"] == result["faults"]
        and result["timeline_incomplete"] == 0
        and result["faults_not_fired"] == 0
    )
    return result


def commit_invariants(events: list[dict]) -> dict:
    """What must hold after every commit, from the events so far (a notebook checks it live):

    - ``checksum_disagreements``: steps where committed weights checksums of two groups differ
      (every participant applies the same averaged update, so they agree; a group that committed
      on its own while cut off would not);
    - ``steps_committed_twice``: a (group, attempt, step) committed more than once;
    - ``cut_off_commits``: steps a group committed while a ``partition`` of its node was in force,
      beyond the one in flight (1 s grace): cut off from the lighthouse and its peers, a group
      cannot join a quorum, so anything it committed would be weights no one else has.
    """
    by_step: dict = {}
    seen, twice = set(), 0
    for e in events:
        if e.get("kind") != "step" or not e.get("committed"):
            continue
        key = (e.get("replica"), e.get("attempt", 0), e.get("step"))
        twice += key in seen
        seen.add(key)
        if e.get("weights") is not None and e.get("participating", True):
            by_step.setdefault(e["step"], {})[e["replica"]] = e["weights"]
    disagree = sorted(s for s, w in by_step.items() if len(set(w.values())) > 1)
    cuts = []
    for f in events:
        if f.get("kind") == "fault" and f.get("action") == "partition":
            back = next(
                (
                    r["t"]
                    for r in events
                    if r.get("kind") == "fault"
                    and r.get("resumed") == "partition"
                    and r.get("target") == f.get("target")
                    and r["t"] > f["t"]
                ),
                float("inf"),
            )
            cuts.append((f["target"], f["t"] + 1.0, back))
    alone = [
        e
        for e in events
        if e.get("kind") == "step"
        and e.get("committed")
        and any(e.get("replica") == r and lo < e["t"] < hi for r, lo, hi in cuts)
    ]
    return {
        "checksum_disagreements": len(disagree),
        "steps_committed_twice": twice,
        "cut_off_commits": len(alone),
        "steps_checked": len(by_step),
    }


def soak_mix(cluster: str) -> list[str]:
    """Every fault kind the backend injects, a replica kill twice as often as each other kind.

    Without the single-point kinds (``process`` other than the group's): on torchft-lite, whose
    store host and rank 0 are the group's own process, they are a ``kill`` under another name.
    """
    return [n for n in faultkinds.names(cluster) if faultkinds.KINDS[n].process == "group"] + ["kill"]


STEP_DELAY_S = 0.02
TAIL_S = 10.0  # after the last fault: its recovery, and a hang's or straggler's seconds


def soak_spec(faults: int, mtbf_s: float, seed: int, cluster: str, steps: int | None = None) -> dict:
    """The soak's spec. ``steps`` left out: enough that the run cannot end before its last
    scheduled fault, and ``TAIL_S`` after it, even if every step took only ``step_delay_s``."""
    actions = soak_mix(cluster)
    spec = {
        "name": "soak",
        "cluster": cluster,
        "faults": [],
        "min_replicas": 1,
        "model": {"step_delay_s": STEP_DELAY_S},
        "spares": 1,
        "relaunch_delay_s": 0.0,
        "max_restarts": 10 * faults,
        "chaos": {
            "mtbf_s": mtbf_s,
            "seed": seed,
            "actions": actions,
            "max_faults": faults,
            "start_s": 2.0,
            "hang_seconds": 2.0,
        },
    }
    if steps is None:
        last_s = max(f.at_s for f in materialize(load_spec("demo", spec)).faults)
        steps = math.ceil((last_s + TAIL_S) / STEP_DELAY_S)
    return {**spec, "steps": steps}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbench.experiments.soak", description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--mtbf", type=float, default=6.0, help="mean seconds between faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cluster", choices=backend_names(), default="local")
    p.add_argument("--steps", type=int, default=None, help="default: long enough for every fault to land")
    args = p.parse_args(argv)
    spec = soak_spec(args.faults, args.mtbf, args.seed, args.cluster, args.steps)
    run = submit("demo", spec)
    print(
        f"soak: {args.faults} faults, mean {args.mtbf}s apart, {spec['steps']} steps; run dir {run.run_dir}", flush=True
    )
    try:
        run.wait(timeout=spec["steps"] * STEP_DELAY_S * 6 + 600)
    finally:
        if run.state() not in ("completed", "failed", "stopped"):
            run.stop()
    result = check_invariants(run)
    for k, v in result.items():
        print(f"  {k:38} {v}")
    print(json.dumps(result))
    return 0 if result["invariants_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
