"""What the machine-level faults cost, and what the node-health sampler costs.

``python -m bench.netfaults [--reps 3] [--partition] [--out FILE]``

On one local torchft-lite run of two groups (``--reps`` times each, medians):

- ``straggler`` at 25 % of a core for 10 s on group 1: the quorum's step time
  (group 0's committed-step interval) during it, against the fault-free interval before;
- ``freeze`` for 10 s on group 1: when group 0's quorum went on without it
  (what the lighthouse saw), when the controller's hang detector reported it,
  and when the group took part again;
- the sampler (``workbench.controller.nodehealth``): CPU seconds per sample over the
  run's processes, as a share of the sampling period (the core it takes
  from the trainers on a full machine: on a contended core, the share of
  each step's time the trainer loses to it).

``--partition``: the same run on the dev Slurm cluster (``devcluster.up`` in a
temporary state directory, down after): a partition of group 1's node for
10 s, the survivor's stall and cut-off → rejoined (``participating`` less
``replacement_started``: link back → taking part).

Prints one JSON line per measurement and the medians; ``uptime``'s load beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import workbench as wb
from workbench import analysis
from workbench.controller import nodehealth


def _committed(run, replica, lo, hi):
    return sorted(
        e["t"]
        for e in run.events_read
        if e["kind"] == "step" and e.get("replica") == replica and e.get("committed") and lo < e["t"] < hi
    )


def _interval(ts):
    return statistics.median(b - a for a, b in zip(ts, ts[1:])) if len(ts) > 2 else float("nan")


def _resumed(run, kind, after):
    run.wait_for(
        lambda r: any(e["kind"] == "fault" and e.get("resumed") == kind and e["t"] > after for e in r.events_read),
        timeout=120,
    )
    return next(e for e in run.events_read if e["kind"] == "fault" and e.get("resumed") == kind and e["t"] > after)


def _settle(run, seconds=6.0):
    t = time.time()
    run.wait_for(lambda r: len(_committed(r, 1, t, float("inf"))) >= 10 and time.time() - t > seconds, timeout=180)


def local(reps: int) -> list[dict]:
    out = []
    run = wb.submit("demo", ["faults=[]", "steps=1000000", "replicas=2", "min_replicas=1", "hang.timeout_s=3.0"])
    try:
        run.wait_for_step(30, replica=1, timeout=300)
        for rep in range(reps):
            t0 = time.time()
            time.sleep(8)
            run.refresh()
            clean = _interval(_committed(run, 0, t0, time.time()))
            fault = run.kill(replica=1, how="straggler", seconds=10)
            back = _resumed(run, "straggler", fault["t"])
            slow = _interval(_committed(run, 0, fault["t"] + 1, back["t"]))
            out.append(
                {
                    "what": "straggler_25pct",
                    "rep": rep,
                    "clean_step_s": clean,
                    "straggler_step_s": slow,
                    "ratio": slow / clean,
                }
            )
            _settle(run)

            fault = run.kill(replica=1, how="freeze", seconds=10)
            back = _resumed(run, "freeze", fault["t"])
            _settle(run)
            row = analysis.recovery_timeline(run.event_records()).iloc[-1]
            hang = next(
                (e for e in run.events_read if e["kind"] == "hang" and e.get("target") == 1 and e["t"] > fault["t"]),
                None,
            )
            out.append(
                {
                    "what": "freeze_10s",
                    "rep": rep,
                    "quorum_without_it_s": row["quorum_without_victim"],
                    "hang_reported_s": hang["t"] - fault["t"] if hang else None,
                    "thawed_s": back["t"] - fault["t"],
                    "participating_s": row["participating"],
                }
            )

            sampler, costs = nodehealth.Sampler(), []
            nodes = nodehealth.nodes_of(run.run_state)
            sampler.sample(nodes)
            for _ in range(20):
                c = time.process_time()
                sampler.sample(nodes)
                costs.append(time.process_time() - c)
                time.sleep(0.05)
            per = statistics.median(costs)
            out.append(
                {
                    "what": "sampler",
                    "rep": rep,
                    "cpu_s_per_sample": per,
                    "core_share": per / nodehealth.PERIOD_S,
                    "step_s": clean,
                }
            )
            for r in out[-3:]:
                print(json.dumps(r), flush=True)
    finally:
        run.stop(timeout=30)
    return out


def partition(reps: int) -> list[dict]:
    from workbench import devcluster

    out = []
    state = tempfile.mkdtemp(prefix="wb-bench-slurm-")
    info = devcluster.up(state)
    os.environ["SLURM_CONF"] = info["env"]["SLURM_CONF"]
    try:
        run = wb.submit(
            "demo",
            [
                "cluster=slurm",
                "faults=[]",
                "steps=1000000",
                "replicas=2",
                "min_replicas=1",
                "slurm.cpus_per_task=3",
                "model.step_delay_s=0.05",
            ],
        )
        try:
            run.wait_for_step(30, replica=1, timeout=300)
            for rep in range(reps):
                fault = run.kill(replica=1, how="partition", seconds=10)
                _resumed(run, "partition", fault["t"])
                _settle(run, 10.0)
                row = analysis.recovery_timeline(run.event_records()).iloc[-1]
                r = {
                    "what": "partition_10s",
                    "rep": rep,
                    "survivor_stall_s": row["survivor_stall_s"],
                    "quorum_without_it_s": row["quorum_without_victim"],
                    "link_back_s": row["replacement_started"],
                    "cut_off_to_rejoined_s": row["participating"] - row["replacement_started"],
                    "healed_s": row["heal_done"],
                }
                out.append(r)
                print(json.dumps(r), flush=True)
        finally:
            run.stop(timeout=30)
    finally:
        devcluster.down(state)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--partition", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = partition(args.reps) if args.partition else local(args.reps)
    medians = {}
    for what in sorted({r["what"] for r in rows}):
        mine = [r for r in rows if r["what"] == what]
        medians[what] = {
            k: statistics.median(r[k] for r in mine if r[k] is not None and r[k] == r[k])
            for k, v in mine[0].items()
            if isinstance(v, (int, float)) and k != "rep" and any(r[k] is not None and r[k] == r[k] for r in mine)
        }
    result = {"medians": medians, "load": os.getloadavg()}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps({"rows": rows, **result}) + "\n")


if __name__ == "__main__":
    main()
