"""``workbench cluster up|down|status [--dir DIR] [--json]``: the dev cluster from a shell.

``restart-slurmd NODE`` starts a node's slurmd again unless it runs: the command the state file records
for the ``slurmd_kill`` fault's undo (:mod:`workbench.cluster.slurm.statedir`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from workbench.cluster.slurm.statedir import DEFAULT_STATE_DIR, ENV_STATE_DIR, resolve_state_dir
from workbench.devcluster.layout import DevClusterError, Layout
from workbench.devcluster.lifecycle import down, restart_slurmd, status, up


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``workbench cluster up|down|status|restart-slurmd [NODE] [--dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="workbench cluster",
        description="A local Slurm cluster (4 nodes on this host, each in its own network namespace) "
        "for demos and tests.",
    )
    parser.add_argument("action", choices=("up", "down", "status", "restart-slurmd"))
    parser.add_argument("node", nargs="?", help="restart-slurmd: the node whose slurmd to start again")
    parser.add_argument(
        "--dir",
        dest="state_dir",
        default=None,
        help=f"state directory (default ${ENV_STATE_DIR} or {DEFAULT_STATE_DIR})",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--logical",
        action="store_true",
        help="up: no network namespaces; every node on 127.0.0.1 (the fallback where none can be made)",
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            info = up(args.state_dir, namespaces=not args.logical, say=lambda line: print(line, file=sys.stderr))
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                verb = "started" if info["started"] else "already up"
                print(f"dev Slurm cluster {verb} in {info['seconds']:.1f}s: {info['state_dir']}")
                print(f"partition={info['partition']} account={info['account']} nodes={','.join(info['nodes'])}")
                net = info.get("network") or {}
                if net:
                    addrs = " ".join(f"{n}={a}" for n, a in net["nodes"].items())
                    print(f"network={net['mode']} head={net['head']} {addrs}")
                for key, value in info["env"].items():
                    print(f"export {key}={value}")
            return 0
        if args.action == "restart-slurmd":
            if not args.node:
                parser.error("restart-slurmd needs a NODE")
            restart_slurmd(str(Layout(resolve_state_dir(args.state_dir)).slurm_conf), args.node)
            return 0
        if args.action == "down":
            stopped = down(args.state_dir)
            print(json.dumps(stopped) if args.json else f"stopped: {' '.join(stopped) or 'nothing was running'}")
            return 0
        info = status(args.state_dir)
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"{info['state_dir']}: {'up' if info['up'] else 'not up'}")
            for name, d in info["daemons"].items():
                print(f"  {name:<12} {'alive' if d['alive'] else 'dead':<6} pid={d['pid']}")
            net = info["network"]
            for node, node_state in info["nodes"].items():
                where = net["nodes"].get(node, {})
                extra = f" {where['address']}" if where else ""
                extra += f" netns={where['netns']}" if where.get("netns") else ""
                print(f"  node {node}: {node_state}{extra}")
        return 0 if info["up"] else 1
    except DevClusterError as e:
        print(f"workbench cluster {args.action}: {e}", file=sys.stderr)
        return 1
