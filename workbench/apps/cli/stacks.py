"""``workbench stacks RUN [--replica R | --controller]``: where a run's groups (or its controller) are stuck.

Every process of each group (or of group ``R``), or the controller, is sampled with py-spy through
``Run.stacks`` (``workbench.run.stacks``): one file under ``<run_dir>/stacks/`` and one ``stacks`` event
(origin ``cli``) a group. Printed: each process's ``where`` and the file. A plugin (``plugins.PLUGINS``):
it gets the rest of the command line and returns the exit status: 0 when every process asked for was
sampled, 1 when one was not (why is printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from workbench.errors import ControllerGone, FaultError, SpecError
from workbench.run.handle import attach
from workbench.run.stacks import CONTROLLER


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench stacks", description=__doc__.splitlines()[0])
    p.add_argument("run", help="run directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--replica", type=int, default=None, help="only this replica group (default: every group)")
    which.add_argument("--controller", action="store_true", help="the run's controller instead of its groups")
    return p


def lines(run_dir, event: dict) -> list[str]:
    """What is printed of one ``stacks`` event: the target, then one line a process, then the file."""
    target = event["target"]
    head = "controller" if target == CONTROLLER else f"replica {target} attempt {event.get('attempt')}"
    out = [f"{head}:"]
    for p in event.get("processes") or []:
        rank = "" if p.get("rank") is None else f" rank {p['rank']}"
        where = p.get("where") or "(no frame of its own code)"
        out.append(f"  pid {p['pid']}{rank}: {where}   [innermost: {p.get('innermost')}]")
    if event.get("error"):
        out.append(f"  not sampled: {event['error']}")
    out.append(f"  {run_dir / event['path']}")
    return out


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        run = attach(args.run)
        events = run.stacks(CONTROLLER if args.controller else args.replica, origin="cli")
    except (SpecError, FaultError, ValueError, ControllerGone, FileNotFoundError) as e:
        print(f"workbench stacks: {e}", file=sys.stderr)
        return 2
    failed = False
    for e in events:
        if e is None:
            print("workbench stacks: the run's event log took no write", file=sys.stderr)
            failed = True
            continue
        print("\n".join(lines(run.run_dir, e)))
        failed = failed or bool(e.get("error")) or not e.get("processes")
    return 1 if failed else 0
