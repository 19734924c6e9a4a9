"""``python -m bench.multihost [--layouts 2x1,1x2] [--kills 3] [--spares 0]``: titan groups over namespaced nodes,
killed and healed.

Brings the dev cluster up (namespaced nodes) in a temporary state directory
and, for each layout ``NxP`` (N nodes a group, P ranks a node; 4 CPUs a task,
so two groups never share a node), runs ``titan-cpu`` with two replica
groups, SIGKILLs group 0 ``--kills`` times, each once the previous attempt
participates, and prints one JSON line per kill: kill → first committed
participating step of the next attempt, the heal's bytes (group 0's rank 0's
shard), where it was served from and over which interface, and the bytes the
serving node's link sent meanwhile (every rank of the group heals: the link
carries all of them). Then per layout the replacement's phases, in seconds after each kill
(``analysis.phases.replacement_phases``: the controller noticed the job gone, resubmitted it
(``restarted``: sbatch), the new job's ``start`` on its node, imports, TorchTitan's own phases,
heal, participating) and their medians, and one line: the median, p95, n, and the 1-minute load
average at each kill and at the end. The default compares a group of one rank
on each of two nodes with a group of two ranks on one node: the same
world size, once across the bridge and once inside a node. ``--spares 1``:
a hot spare takes each killed group over (``titan/spare.py``: on Slurm it
imports torchtitan while it waits and forks its ranks warm), with 2 CPUs a
task so that the spare's tasks fit beside the groups'; each kill waits for a
ready spare (the one submitted after the last takeover needs ~15 s).
Everything it starts it stops (each run by its controller, the cluster by PID). ``on_devcluster`` does all
this and returns the rows and the summaries (``python -m bench --only slurm`` calls it too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path


def _participating_t(run, replica: int, attempt: int):
    ts = [
        e["t"]
        for e in run.events_read
        if e["kind"] == "step"
        and e.get("replica") == replica
        and e.get("attempt") == attempt
        and e.get("committed")
        and e.get("participating")
    ]
    return min(ts) if ts else None


def _spare_ready(run) -> bool:
    """A spare said ``spare_ready`` and has not taken a group over yet (kill only then: a hot spare's figure)."""
    ready = {e.get("spare") for e in run.events_read if e["kind"] == "phase" and e.get("phase") == "spare_ready"}
    taken = {e.get("spare") for e in run.events_read if e["kind"] == "restart"}
    return bool(ready - taken - {None})


def _layout(text: str) -> tuple[int, int]:
    nodes, _, nproc = text.partition("x")
    return int(nodes), int(nproc or 1)


def phases(run):
    """The replacement's phases per kill (seconds after it), with the controller's ``noticed`` and ``restarted``."""
    from workbench import analysis
    from workbench.analysis.phases import phase_medians, replacement_phases
    from workbench.analysis.recovery import ends_process

    events = run.event_records()
    timeline = analysis.recovery_timeline(events)
    frame = replacement_phases(events, timeline)
    killed = timeline[ends_process(timeline)]
    frame.insert(4, "noticed", killed["noticed"].to_numpy())
    frame.insert(5, "restarted", killed["restarted"].to_numpy())
    return frame, phase_medians(frame)


def measure(
    wb, netns, nodes: dict, mode: str, run_root: Path, layout: tuple[int, int], kills: int, timeout: float, spares=0
) -> list[dict]:
    n_nodes, nproc = layout
    rows: list[dict] = []
    run = wb.submit(
        "titan-cpu",
        {
            "cluster": "slurm",
            "steps": 100000,
            "faults": [],
            "slurm.nodes": n_nodes,
            "nproc_per_replica": nproc,
            "slurm.cpus_per_task": 2 if spares else 4,  # with a spare, 6 tasks on the 4 nodes
            "spares": spares,
            "titan.overrides": {"training.seq_len": 64},
            "run_root": str(run_root),
        },
    )
    try:
        for r in (0, 1):
            run.wait_for(lambda x, r=r: _participating_t(x, r, 0) is not None, timeout)
        for k in range(kills):
            if spares:
                run.wait_for(_spare_ready, timeout)
            before = {n: netns.link_bytes(n) for n in nodes} if mode == "netns" else {}
            fault = run.kill(0)
            run.wait_for(lambda x, a=k + 1: _participating_t(x, 0, a) is not None, timeout)
            heal = next(
                (
                    e
                    for e in run.events_read
                    if e["kind"] == "heal" and e.get("replica") == 0 and e.get("attempt") == k + 1
                ),
                {},
            )
            source = next((n for n, a in nodes.items() if a == heal.get("served_from")), None)
            sent = (netns.link_bytes(source)["sent"] - before[source]["sent"]) if source and before else None
            row = {
                "layout": f"{n_nodes}x{nproc}" + (f"+{spares} spare" if spares else ""),
                "kill": k,
                "kill_to_participating_s": _participating_t(run, 0, k + 1) - fault["t"],
                "heal_bytes": heal.get("bytes"),
                "heal_seconds": heal.get("seconds"),
                "served_from": heal.get("served_from"),
                "interface": heal.get("interface"),
                "bytes_per_s": heal.get("bytes_per_s"),
                "source_link_sent_bytes": sent,
                "load_1m": os.getloadavg()[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        run.stop(timeout=30)
    frame, medians = phases(run)
    print(frame.round(2).to_string(), flush=True)
    print(medians.round(2).to_string(), flush=True)
    for row in rows:
        row["phase_medians"] = dict(zip(medians["milestone"], medians["median_s"].round(2)))
    return rows


def on_devcluster(
    layouts: list[str], kills: int, timeout: float = 300.0, spares: int = 0, run_root: Path | None = None
) -> dict:
    """Bring the dev cluster up in a temporary directory, ``measure`` each layout (``"NxP"``), take it down.

    Returns ``{"network": mode, "layouts": [one summary a layout], "rows": [every kill's row]}``; the runs go
    under ``run_root`` (default: ``runs`` beside the cluster's state). SLURM_CONF and SIGTERM's handler are
    restored at the end.
    """
    import signal

    import workbench as wb
    from workbench import devcluster
    from workbench.devcluster import netns

    from .recovery import median_p95

    def _exit(signum, frame):  # a timeout's SIGTERM: still stop the run and bring the cluster down
        raise SystemExit(128 + signum)

    old_handler, old_conf = signal.signal(signal.SIGTERM, _exit), os.environ.get("SLURM_CONF")
    tmp = Path(tempfile.mkdtemp(prefix="wb-multihost-"))
    summary: list[dict] = []
    every: list[dict] = []
    try:
        info = devcluster.up(tmp / "slurm")
        os.environ["SLURM_CONF"] = info["env"]["SLURM_CONF"]
        nodes, mode = info["network"]["nodes"], info["network"]["mode"]
        try:
            for text in layouts:
                rows = measure(wb, netns, nodes, mode, run_root or tmp / "runs", _layout(text), kills, timeout, spares)
                every += rows
                times = median_p95(r["kill_to_participating_s"] for r in rows)
                summary.append(
                    {
                        "layout": text + (f"+{spares} spare" if spares else ""),
                        "n": times["n"],
                        "median_kill_to_participating_s": times["median_s"],
                        "p95_kill_to_participating_s": times["p95_s"],
                        "each_s": [round(r["kill_to_participating_s"], 2) for r in rows],
                        "phase_medians_s": rows[0]["phase_medians"] if rows else None,
                        "load_1m_at_kills": [round(r["load_1m"], 2) for r in rows],
                        "median_heal_bytes": statistics.median(r["heal_bytes"] or 0 for r in rows) if rows else None,
                        "load_1m": os.getloadavg()[0],
                    }
                )
                print(json.dumps(summary[-1]), flush=True)
        finally:
            devcluster.down(tmp / "slurm")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if old_handler is None else old_handler)
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
    return {"network": mode, "layouts": summary, "rows": every}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multihost")
    ap.add_argument("--layouts", default="2x1,1x2", help="NxP,...: N nodes a group, P ranks a node")
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--spares", type=int, default=0, help="hot spares (titan/spare.py; 2 CPUs a task then)")
    args = ap.parse_args(argv)
    result = on_devcluster(args.layouts.split(","), args.kills, args.timeout, args.spares)
    print(json.dumps({"network": result["network"], "layouts": result["layouts"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
