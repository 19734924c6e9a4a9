"""``python -m bench.maxtext_slurm [--reps 3] [--processes 1,2] [--spares 0,1] [--out FILE]``: MaxText restart -> first step on Slurm.

For each repetition, one ``maxtext-cpu-tiny`` run of one process (``slurm.nodes=1``) and one of
two (``slurm.nodes=2``, one JAX program: ``jax.distributed``, gloo), in alternating order. Each
trains to step 25, its (first) node is set DOWN (``node_down``), the controller resubmits the job,
and MaxText restores its last checkpoint. Figures, all from the run's events: fault -> the new
job's wrapper ``start``, -> MaxText's ``restored`` phase, -> its ``first_step`` phase, and the
replacement's phases (``analysis.phases.replacement_phases``, seconds after the fault: the controller
noticed the job gone and resubmitted it (``restarted``: sbatch), the job started, MaxText launched, its
interpreter up, imports done, JAX backend ready, restored, compiled (with its compile-cache hits and
misses; process 1's from its console log), first step). One JSON line per run (with ``/proc/loadavg``
beside it) is appended to ``--out``; per process count the median, p95 and n of fault -> first step
and the median of each phase at the end.
``--processes 2`` runs only the two-process job. ``--spares 0,1`` runs each job without and with a hot
spare (``spares: 1``, ``trainers/maxtext/spare.py``: a second job of as many nodes, its processes' imports
done), alternating; with one, the fault waits until the spare is ready (``spare_ready``).

Brings up its own dev cluster (``workbench.devcluster``) in a temporary directory and takes it down.
``measure`` returns the rows and ``summarize`` the figures (``python -m bench --only slurm`` calls both).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

import workbench as wb
from workbench import analysis, devcluster
from workbench.analysis.phases import replacement_phases
from workbench.analysis.recovery import ends_process
from workbench.trainers.maxtext.output import marker_fact

from .recovery import median_p95

FIRST_FAULT_STEP = 25


def _of(run, kind: str, attempt: int) -> list[dict]:
    return [e for e in run.events_read if e["kind"] == kind and e.get("replica") == 0 and e.get("attempt") == attempt]


def _phase(run, name: str, attempt: int):
    return next((e for e in _of(run, "phase", attempt) if e["phase"] == name), None)


def _rank_compiled(run, rank: int, t0: float) -> dict | None:
    """Rank ``rank``'s ``compiled`` phase of attempt 1 (only rank 0's phases are events): from its console log."""
    log = Path(run.run_dir) / "maxtext" / f"attempt-1.rank-{rank}.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        fact = marker_fact(line) or {}
        if fact.get("phase") == "compiled":
            return {**{k: v for k, v in fact.items() if k not in ("phase", "at")}, "at_s": fact["at"] - t0}
    return None


def _spare_ready(run) -> bool:
    return any(e["kind"] == "phase" and e.get("phase") == "spare_ready" for e in run.events_read)


def one(nodes: int, run_root: Path, spares: int = 0) -> dict:
    run = wb.submit(
        "maxtext-cpu-tiny",
        [
            "cluster=slurm",
            f"slurm.nodes={nodes}",
            "steps=100000",
            "max_restarts=2",
            f"spares={spares}",
            f"run_root={run_root}",
        ],
    )
    try:
        run.wait_for(lambda r: any(e["step"] >= FIRST_FAULT_STEP for e in _of(r, "step", 0)), timeout=300)
        if spares:
            run.wait_for(_spare_ready, timeout=300)
        load = Path("/proc/loadavg").read_text().split()[:3]
        fault = run.fault("node_down", target=0, seconds=15)
        run.wait_for(lambda r: _phase(r, "first_step", 1), timeout=300)
        start = _of(run, "start", 1)[0]
        events = run.event_records()
        timeline = analysis.recovery_timeline(events)
        phases = replacement_phases(events, timeline).iloc[0]
        killed = timeline[ends_process(timeline)].iloc[0]
        compiled = _phase(run, "compiled", 1) or {}
        row = {
            "processes": nodes,
            "spares": spares,
            "from_spare": start.get("from_spare"),
            "load": " ".join(load),
            "fault_to_start_s": start["t"] - fault["t"],
            "fault_to_restored_s": _phase(run, "restored", 1)["t"] - fault["t"],
            "fault_to_first_step_s": _phase(run, "first_step", 1)["t"] - fault["t"],
            "from_step": _phase(run, "restored", 1)["from_step"],
            "phases": {
                "noticed": float(killed["noticed"]),
                "restarted": float(killed["restarted"]),
                **{k: float(v) for k, v in phases.items() if k not in ("t", "target", "attempt", "warm") and v == v},
            },
            "warm": None if phases["warm"] is None or phases["warm"] != phases["warm"] else bool(phases["warm"]),
            "compile_cache_hits": compiled.get("compile_cache_hits"),
            "compile_cache_misses": compiled.get("compile_cache_misses"),
            "rank1_compiled": _rank_compiled(run, 1, fault["t"]) if nodes > 1 else None,
            "run_dir": str(run.run_dir),
        }
        run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("resumed") == "node_down" for e in r.events_read), 60)
        return row
    finally:
        run.stop(timeout=60)


def measure(
    reps: int, processes=(1, 2), spares=(0,), first: int = 1, on_row=None, run_root: Path | None = None
) -> list[dict]:
    """Bring the dev cluster up in a temporary directory, ``one`` run per repetition, process count and spare
    count (the orders alternating from one repetition to the next), take the cluster down; the rows, each also
    given to ``on_row`` as it comes. The runs go under ``run_root`` (default: the temporary directory)."""
    rows: list[dict] = []
    old_conf = os.environ.get("SLURM_CONF")
    with tempfile.TemporaryDirectory(prefix="wb-bench-maxtext-") as tmp:
        state = Path(tmp) / "slurm"
        info = devcluster.up(state)
        os.environ["SLURM_CONF"] = info["env"]["SLURM_CONF"]
        try:
            order = [n for n in (first, 3 - first) if n in processes]
            spare_counts = list(spares)
            for rep in range(reps):
                for nodes in order if rep % 2 == 0 else order[::-1]:
                    for n_spares in spare_counts if rep % 2 == 0 else spare_counts[::-1]:
                        row = one(nodes, run_root or Path(tmp) / "runs", n_spares)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                        if on_row is not None:
                            on_row(row)
        finally:
            devcluster.down(state)
            if old_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old_conf
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per process count and spare count present in ``rows``: n, median and p95 of fault -> first step, each,
    the loads, and each phase's median (s after the fault, in the order they came)."""
    out = []
    for n, spares in [(n, s) for n in (1, 2) for s in (0, 1)]:
        mine = [r for r in rows if r["processes"] == n and r.get("spares", 0) == spares]
        if not mine:
            continue
        names = list(dict.fromkeys(k for r in mine for k in r.get("phases", {})))
        medians = {k: statistics.median(r["phases"][k] for r in mine if k in r.get("phases", {})) for k in names}
        out.append(
            {
                "processes": n,
                "spares": spares,
                **median_p95(r["fault_to_first_step_s"] for r in mine),
                "each_s": [r["fault_to_first_step_s"] for r in mine],
                "loads": [r["load"] for r in mine],
                "phase_medians_s": dict(sorted(medians.items(), key=lambda kv: kv[1])),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.maxtext_slurm", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--first", type=int, choices=(1, 2), default=1, help="process count of the first run")
    ap.add_argument("--processes", default="1,2", help="which jobs: 1, 2 or 1,2 (processes, one per node)")
    ap.add_argument("--spares", default="0", help="0, 1 or 0,1: without and/or with a hot spare")
    ap.add_argument("--out", default="maxtext-slurm-restart.jsonl")
    args = ap.parse_args(argv)
    out = Path(args.out)

    def _append(row: dict) -> None:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")

    measure(
        args.reps,
        [int(n) for n in args.processes.split(",")],
        [int(n) for n in args.spares.split(",")],
        args.first,
        on_row=_append,
    )
    for s in summarize([json.loads(line) for line in out.read_text().splitlines()]):
        print(
            f"{s['processes']} process(es), spares {s['spares']}: node_down -> first step "
            f"median {s['median_s']:.1f} s, "
            f"p95 {s['p95_s']:.1f} s over {s['n']} ({', '.join(f'{x:.1f}' for x in s['each_s'])}); loads {s['loads']}"
        )
        print(
            "  phase medians (s after the fault): " + ", ".join(f"{k} {v:.2f}" for k, v in s["phase_medians_s"].items())
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
