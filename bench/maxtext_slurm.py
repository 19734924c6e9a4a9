"""``python -m bench.maxtext_slurm [--reps 1] [--out FILE]``: MaxText restart -> first step on the local Slurm.

For each repetition, one ``maxtext-cpu-tiny`` run of one process (``slurm.nodes=1``) and one of
two (``slurm.nodes=2``, one JAX program: ``jax.distributed``, gloo), in alternating order. Each
trains to step 25, its (first) node is set DOWN (``node_down``), the controller resubmits the job,
and MaxText restores its last checkpoint. Figures, all from the run's events: fault -> the new
job's wrapper ``start``, -> MaxText's ``restored`` phase, -> its ``first_step`` phase. One JSON line
per run (with ``/proc/loadavg`` beside it) is appended to ``--out``; medians at the end.

Brings up its own dev cluster (``workbench.devcluster``) in a temporary directory and takes it down.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import workbench as wb
from workbench import devcluster

FIRST_FAULT_STEP = 25


def _of(run, kind: str, attempt: int) -> list[dict]:
    return [e for e in run.events_read if e["kind"] == kind and e.get("replica") == 0 and e.get("attempt") == attempt]


def _phase(run, name: str, attempt: int):
    return next((e for e in _of(run, "phase", attempt) if e["phase"] == name), None)


def one(nodes: int, run_root: Path) -> dict:
    run = wb.submit(
        "maxtext-cpu-tiny",
        ["cluster=slurm", f"slurm.nodes={nodes}", "steps=100000", "max_restarts=2", f"run_root={run_root}"],
    )
    try:
        run.wait_for(lambda r: any(e["step"] >= FIRST_FAULT_STEP for e in _of(r, "step", 0)), timeout=300)
        load = Path("/proc/loadavg").read_text().split()[:3]
        fault = run.fault("node_down", target=0, seconds=15)
        run.wait_for(lambda r: _phase(r, "first_step", 1), timeout=300)
        start = _of(run, "start", 1)[0]
        row = {
            "processes": nodes,
            "load": " ".join(load),
            "fault_to_start_s": start["t"] - fault["t"],
            "fault_to_restored_s": _phase(run, "restored", 1)["t"] - fault["t"],
            "fault_to_first_step_s": _phase(run, "first_step", 1)["t"] - fault["t"],
            "from_step": _phase(run, "restored", 1)["from_step"],
            "run_dir": str(run.run_dir),
        }
        run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "node_down" for e in r.events_read), 60)
        return row
    finally:
        run.stop(timeout=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.maxtext_slurm", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--first", type=int, choices=(1, 2), default=1, help="process count of the first run")
    ap.add_argument("--out", default="maxtext-slurm-restart.jsonl")
    args = ap.parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="wb-bench-maxtext-") as tmp:
        state = Path(tmp) / "slurm"
        info = devcluster.up(state)
        os.environ["SLURM_CONF"] = info["env"]["SLURM_CONF"]
        try:
            order = [args.first, 3 - args.first]
            for rep in range(args.reps):
                for nodes in order if rep % 2 == 0 else order[::-1]:
                    row = one(nodes, Path(tmp) / "runs")
                    print(json.dumps(row), flush=True)
                    with open(out, "a") as f:
                        f.write(json.dumps(row) + "\n")
        finally:
            devcluster.down(state)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for n in (1, 2):
        mine = [r["fault_to_first_step_s"] for r in rows if r["processes"] == n]
        if mine:
            print(
                f"{n} process(es): node_down -> first step median {statistics.median(mine):.1f} s over {len(mine)} "
                f"({', '.join(f'{x:.1f}' for x in mine)}); loads {[r['load'] for r in rows if r['processes'] == n]}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
