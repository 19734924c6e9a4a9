"""``python -m bench.multihost [--nodes 2] [--kills 3]``: a titan group over N namespaced nodes, killed and healed.

Brings the dev cluster up (namespaced nodes) in a temporary state directory,
runs ``titan-cpu`` with two replica groups of ``--nodes`` nodes each (4 CPUs
a task, so the groups never share a node), SIGKILLs group 0 ``--kills``
times, each once the previous attempt participates, and prints one JSON line
per kill: kill → first committed participating step of the next attempt, the
heal's bytes, where it was served from and over which interface, and the
bytes the serving node's link sent meanwhile; then the median and ``uptime``.
Everything it starts it stops (the run by its controller, the cluster by PID).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path


def _participating_t(run, replica: int, attempt: int):
    ts = [e["t"] for e in run._events if e["kind"] == "step" and e.get("replica") == replica
          and e.get("attempt") == attempt and e.get("committed") and e.get("participating")]
    return min(ts) if ts else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.multihost")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)

    import workbench as wb
    from workbench import devcluster
    from workbench.devcluster import netns

    tmp = Path(tempfile.mkdtemp(prefix="wb-multihost-"))
    info = devcluster.up(tmp / "slurm")
    os.environ["SLURM_CONF"] = info["env"]["SLURM_CONF"]
    nodes = info["network"]["nodes"]
    rows = []
    run = None
    try:
        run = wb.submit("titan-cpu", {
            "cluster": "slurm", "steps": 100000, "faults": [], "slurm.nodes": args.nodes,
            "slurm.cpus_per_task": 4, "titan.overrides": {"training.seq_len": 64}, "run_root": str(tmp / "runs"),
        })
        for r in (0, 1):
            run.wait_for(lambda x, r=r: _participating_t(x, r, 0) is not None, args.timeout)
        for k in range(args.kills):
            before = {n: netns.link_bytes(n) for n in nodes} if info["network"]["mode"] == "netns" else {}
            fault = run.kill(0)
            run.wait_for(lambda x, a=k + 1: _participating_t(x, 0, a) is not None, args.timeout)
            heal = next((e for e in run._events if e["kind"] == "heal" and e.get("replica") == 0
                         and e.get("attempt") == k + 1), {})
            source = next((n for n, a in nodes.items() if a == heal.get("served_from")), None)
            sent = (netns.link_bytes(source)["sent"] - before[source]["sent"]) if source and before else None
            row = {"nodes": args.nodes, "kill": k, "kill_to_participating_s": _participating_t(run, 0, k + 1) - fault["t"],
                   "heal_bytes": heal.get("bytes"), "served_from": heal.get("served_from"),
                   "interface": heal.get("interface"), "bytes_per_s": heal.get("bytes_per_s"),
                   "source_link_sent_bytes": sent}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if run is not None:
            run.stop(timeout=30)
        devcluster.down(tmp / "slurm")
    times = [r["kill_to_participating_s"] for r in rows]
    print(json.dumps({"nodes": args.nodes, "median_kill_to_participating_s": statistics.median(times) if times else None,
                      "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
