"""``workbench``: the same loop as the notebook API, from a shell.

Every command exits non-zero with a one-line reason on bad input, before
anything is submitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import faultkinds
from .faults import FaultError
from .run import ENDED, KILL_ALIASES, ControllerGone, attach, submit
from .spec import SpecError
from .spec_load import load_spec
from .preflight import preflight


def _print_summary(summary: dict) -> None:
    def fmt(v, unit=""):
        return "n/a" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}")

    print(f"run {summary['run_dir']}")
    print(f"  state                 {summary['state']}  ({summary['trainer']}, {summary['replicas']} replica groups)")
    print(f"  steps                 {summary['steps_completed']} / {summary['steps_target']}")
    print(f"  faults / restarts     {summary['faults']} / {summary['restarts']}   heals: {summary['heals']}")
    print(f"  survivor steps lost   {summary['survivor_steps_lost']}   (discarded attempts: {summary['survivor_steps_discarded']})")
    print(f"  survivor stall        {fmt(summary['survivor_stall_s'], ' s')} beyond a normal step")
    print(f"  kill -> rejoin        {fmt(summary['kill_to_rejoin_s'], ' s')}")
    heal_bytes = summary["heal_bytes"]
    print(f"  heal transfer         {fmt(summary['heal_seconds'], ' s')}, "
          f"{'n/a' if heal_bytes is None else f'{heal_bytes / 1e6:.2f} MB'}")
    print(f"  submit -> first step  {fmt(summary['submit_to_first_step_s'], ' s')}")


def cmd_demo(args) -> int:
    run = submit("demo", args.overrides)
    print(f"demo: 3 replica groups; replica 1 is SIGKILLed at step 150 and relaunched. run dir: {run.run_dir}", flush=True)
    try:
        run.wait(timeout=args.timeout)
    finally:
        if run.state() not in ENDED:
            run.stop()
    summary = run.summary()
    _print_summary(summary)
    print(json.dumps(summary))
    return 0 if summary["state"] == "completed" else 1


def _follow(handle, detach: bool) -> bool:
    """Wait for a run or sweep unless detached; Ctrl-C stops it. True if it was waited for."""
    if detach:
        return False
    try:
        handle.wait()
    except KeyboardInterrupt:
        handle.stop()
    return True


def cmd_submit(args) -> int:
    run = submit(args.config, args.overrides)
    print(run.run_dir, flush=True)
    if not _follow(run, args.detach):
        return 0
    summary = run.summary()
    _print_summary(summary)
    return 0 if summary["state"] == "completed" else 1


def cmd_validate(args) -> int:
    spec = load_spec(args.config, args.overrides)
    for w in preflight(spec):
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(spec.to_dict(), indent=2))
    return 0


def cmd_status(args) -> int:
    run = attach(args.run)
    st = run.status()
    if args.json:
        print(json.dumps(st))
    else:
        print(f"{run.id}: {st['state']}  step {st['step']}/{st['steps_target']}  faults {st['faults']}  restarts {st['restarts']}"
              + (f"  bad event lines {st['bad_lines']}" if st["bad_lines"] else ""))
        for r, s in st["replicas"].items():
            print(f"  replica {r}: {s['state']:<13} attempt {s['attempt']}  step {s['step']}")
    return 0


def cmd_kill(args) -> int:
    run = attach(args.run)
    event = run.kill(replica=args.replica, how=args.how, seconds=args.seconds, origin="cli")
    print(json.dumps(event))
    return 0


def cmd_wait(args) -> int:
    run = attach(args.run)
    st = run.wait(timeout=args.timeout)
    print(st["state"])
    return 0 if st["state"] == "completed" else 1


def cmd_stop(args) -> int:
    print(attach(args.run).stop()["state"])
    return 0


def cmd_metrics(args) -> int:
    df = attach(args.run).metrics()
    if args.csv:
        df.to_csv(sys.stdout, index=False)
    else:
        print(df.to_string(max_rows=40))
    return 0


def cmd_summary(args) -> int:
    summary = attach(args.run).summary()
    _print_summary(summary)
    print(json.dumps(summary))
    return 0


def cmd_report(args) -> int:
    from .report import write_report

    print(write_report(args.run))
    return 0


def split_values(raw: str) -> list[str]:
    """``500,1000`` -> ``["500", "1000"]``; commas inside brackets, braces or quotes do not split."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in raw:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


def cmd_sweep(args) -> int:
    from .spec_load import parse_override
    from .sweep import sweep

    fixed, grid = {}, {}
    for item in args.overrides:
        key, _, raw = item.partition("=")
        values = [parse_override(f"{key}={v}")[1] for v in split_values(raw)] if "=" in item else None
        if values is None:
            parse_override(item)  # raises the usual "expected key=value"
        elif len(values) == 1:
            fixed[key.strip()] = values[0]
        else:
            grid[key.strip()] = values
    if not grid:
        raise SpecError("sweep: no key with several values; give e.g. lighthouse.heartbeat_timeout_ms=500,1000,5000")
    sw = sweep(args.config, fixed, grid=grid, max_parallel=args.max_parallel)
    print(sw.sweep_dir, flush=True)
    if not _follow(sw, args.detach):
        return 0
    table = sw.table()
    print(table.drop(columns=["run_dir"], errors="ignore").to_string(index=False))
    return 0 if (table["state"] == "completed").all() else 1


def cmd_replay(args) -> int:
    from .compare import replay_comparison
    from .replay import replay

    run = replay(args.run)
    print(run.run_dir, flush=True)
    if args.detach:
        return 0
    try:
        run.wait()
    except KeyboardInterrupt:
        run.stop()
    both = replay_comparison(args.run, run)
    print(both["table"].drop(columns=["run_dir"], errors="ignore").to_string(index=False))
    print(both["faults"].to_string(index=False))
    return 0 if run.state() == "completed" else 1


def cmd_ls(args) -> int:
    import os

    from .compare import runs_listing
    from .sweep import attach_sweep, list_sweeps

    root = args.run_root or os.environ.get("WORKBENCH_RUN_ROOT", "runs")
    runs = runs_listing(root)
    sweeps = []
    for d in list_sweeps(root):
        sw = attach_sweep(d)
        states = sw.point_states()
        sweeps.append({"sweep_id": sw.id, "state": sw.state(), "points": len(states),
                       "keys": ",".join(sw.params), **{s: states.count(s) for s in sorted(set(states))},
                       "sweep_dir": str(sw.sweep_dir)})
    if args.json:
        print(json.dumps({"runs": runs.to_dict(orient="records"), "sweeps": sweeps}, default=str))
        return 0

    def age(s):
        return "" if s is None or s != s else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h" if s < 172800 else f"{s / 86400:.0f}d"

    if runs.empty:
        print(f"no runs under {root}")
    else:
        runs = runs.assign(steps=runs["step"].astype(str) + "/" + runs["steps_target"].astype(str),
                           age=runs["age_s"].map(age))
        print(runs[["run_id", "state", "trainer", "steps", "faults", "restarts", "age"]].to_string(index=False))
    for sw in sweeps:
        counts = " ".join(f"{k}={v}" for k, v in sw.items() if k not in ("sweep_id", "state", "points", "keys", "sweep_dir"))
        print(f"sweep {sw['sweep_id']}: {sw['state']}  {sw['points']} points over {sw['keys']}  {counts}")
    return 0


def cmd_cluster(args) -> int:
    from . import devcluster

    return devcluster.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("demo", help="headless demo: 3 replica groups, one killed, healed")
    s.add_argument("overrides", nargs="*", help="key=value spec overrides")
    s.add_argument("--timeout", type=float, default=600)
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("submit", help="submit CONFIG with overrides; prints the run dir")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--detach", action="store_true", help="return once submitted")
    s.set_defaults(fn=cmd_submit)

    s = sub.add_parser("validate", help="resolve and check a spec; submits nothing")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*")
    s.set_defaults(fn=cmd_validate)

    for name, fn, helptext in (
        ("status", cmd_status, "state of a run"),
        ("wait", cmd_wait, "block until the run ends"),
        ("stop", cmd_stop, "stop every job of the run"),
        ("metrics", cmd_metrics, "per-step metrics"),
        ("summary", cmd_summary, "headline figures of a run"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("run", help="run directory")
        if name == "status":
            s.add_argument("--json", action="store_true")
        if name == "wait":
            s.add_argument("--timeout", type=float, default=None)
        if name == "metrics":
            s.add_argument("--csv", action="store_true")
        s.set_defaults(fn=fn)

    s = sub.add_parser("kill", help="inject a fault into a replica group (or the lighthouse)")
    s.add_argument("run")
    s.add_argument("--replica", type=int, default=None)
    s.add_argument("--how", choices=(*faultkinds.names(), *KILL_ALIASES), default="kill", metavar="KIND",
                   help="a fault kind the run's backend injects: "
                        + "; ".join(f"{k.name} ({', '.join(k.backends) + ' only, ' if k.backends else ''}{k.summary})"
                                    for k in faultkinds.KINDS.values()))
    s.add_argument("--seconds", type=float, default=None, help="how long a fault that lasts lasts (a hang: 5 s; partition, slow_link, straggler, freeze: 10 s)")
    s.set_defaults(fn=cmd_kill)

    s = sub.add_parser("report", help="write a self-contained HTML report into a run (or sweep) directory")
    s.add_argument("run")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("sweep", help="one run per point: key=v1,v2 sweeps a key; prints the sweep dir")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*", help="key=value (fixed) or key=v1,v2,... (swept; the grid is their product)")
    s.add_argument("--max-parallel", type=int, default=None, help="runs at a time (default: 1 locally, all on Slurm)")
    s.add_argument("--detach", action="store_true", help="return once the sweep controller is started")
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("replay", help="rerun RUN with its resolved spec and faults; prints the new run dir")
    s.add_argument("run")
    s.add_argument("--detach", action="store_true")
    s.set_defaults(fn=cmd_replay)

    s = sub.add_parser("ls", help="runs and sweeps under RUN_ROOT (default $WORKBENCH_RUN_ROOT or ./runs)")
    s.add_argument("run_root", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser("cluster", help="local Slurm cluster: up | down | status")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_cluster)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (SpecError, FaultError, ValueError, TimeoutError, ControllerGone) as e:
        print(f"workbench {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
