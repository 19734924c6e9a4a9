"""``workbench``: the same loop as the notebook API, from a shell.

Every command exits non-zero with a one-line reason on bad input, before
anything is submitted.

This package is the command line's grammar (:func:`build_parser`) and its
entry point (:func:`main`, the ``workbench`` console script; ``python -m
workbench.apps.cli`` runs it too). The commands are in one module per group:
:mod:`.runs` (one run: demo, submit, validate, status, wait, stop, metrics,
summary, kill, replay), :mod:`.why` (why each attempt ended), :mod:`.experiments` (sweep, matrix, drill, ls),
:mod:`.views` (serve-metrics, report, classroom), :mod:`.project`, and
:mod:`.plugins`, the table of commands named as ``"module:function"`` and
imported only when run (``cluster``: development tooling that no production
module may import).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from workbench.apps.classroom import DEFAULT_PORT
from workbench.apps.cli.experiments import cmd_drill, cmd_ls, cmd_matrix, cmd_sweep
from workbench.apps.cli.plugins import PLUGINS, cmd_plugin, load
from workbench.apps.cli.project import PROJECT_FLAGS, cmd_project
from workbench.apps.cli.runs import (
    cmd_demo,
    cmd_kill,
    cmd_metrics,
    cmd_replay,
    cmd_status,
    cmd_stop,
    cmd_submit,
    cmd_summary,
    cmd_validate,
    cmd_wait,
)
from workbench.apps.cli.views import cmd_classroom, cmd_report, cmd_serve_metrics
from workbench.apps.cli.why import cmd_why
from workbench.errors import ControllerGone, FaultError, SpecError
from workbench.faults import kinds as faultkinds
from workbench.run.handle import KILL_ALIASES


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

    s = sub.add_parser("why", help="why each attempt of a run ended: cause, exception, the job's last lines")
    s.add_argument("run", help="run directory")
    s.add_argument("--replica", type=int, default=None, help="only this replica group's ends")
    s.add_argument("--attempt", type=int, default=None, help="only this attempt's end")
    s.add_argument("--lines", type=int, default=20, help="last lines of each of the job's log files (default 20)")
    s.set_defaults(fn=cmd_why)

    s = sub.add_parser("kill", help="inject a fault into a replica group (or the lighthouse)")
    s.add_argument("run")
    s.add_argument("--replica", type=int, default=None)
    s.add_argument(
        "--how",
        choices=(*faultkinds.names(), *KILL_ALIASES),
        default="kill",
        metavar="KIND",
        help="a fault kind the run's backend injects: "
        + "; ".join(
            f"{k.name} ({', '.join(k.backends) + ' only, ' if k.backends else ''}{k.summary})"
            for k in faultkinds.KINDS.values()
        ),
    )
    s.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="how long a fault that lasts lasts (a hang: 5 s; partition, slow_link, straggler, freeze: 10 s)",
    )
    s.set_defaults(fn=cmd_kill)

    s = sub.add_parser("serve-metrics", help="expose a run's metrics for Prometheus (loopback by default)")
    s.add_argument("run")
    s.add_argument("--port", type=int, default=9464, help="TCP port (default 9464; 0: any free port, printed)")
    s.add_argument(
        "--addr",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); one that is not loopback needs --allow-remote",
    )
    s.add_argument(
        "--allow-remote",
        action="store_true",
        help="let --addr be an address other machines reach: the endpoint has no authentication",
    )
    s.add_argument(
        "--otlp",
        default=None,
        metavar="URL",
        help="also push the same series to an OpenTelemetry collector (OTLP/HTTP metrics URL)",
    )
    s.add_argument("--otlp-every", type=float, default=10.0, metavar="S", help="OTLP push interval (default 10 s)")
    s.set_defaults(fn=cmd_serve_metrics)

    s = sub.add_parser("report", help="write a self-contained HTML report into a run (or sweep) directory")
    s.add_argument("run")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("sweep", help="one run per point: key=v1,v2 sweeps a key; prints the sweep dir")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*", help="key=value (fixed) or key=v1,v2,... (swept; the grid is their product)")
    s.add_argument("--max-parallel", type=int, default=None, help="runs at a time (default: 1 locally, all on Slurm)")
    s.add_argument("--detach", action="store_true", help="return once the sweep controller is started")
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("matrix", help="fault kinds × setups (or trainers × backends), N runs each: rates and phases")
    s.add_argument("config", nargs="?", default=None, help="the config trainers × backends run over")
    s.add_argument("overrides", nargs="*", help="key=value for every trial")
    s.add_argument("--faults", default="kill,hang,preempt,abort", help="comma-separated fault kinds, or all")
    s.add_argument("--setups", default=None, help="a named list of setups (real: titan, titan-restart, maxtext)")
    s.add_argument(
        "--setup",
        action="append",
        default=None,
        help="one setup: 'CONFIG key=value ... [label=...] [window=A:B]' (repeat for each row)",
    )
    s.add_argument(
        "--attach", action="append", default=None, help="a matrix directory (repeatable): show it, start nothing"
    )
    s.add_argument("--markdown", default=None, help="write the table as markdown to this file (e.g. docs/matrix.md)")
    s.add_argument("--title", default=None, help="the markdown page's title")
    s.add_argument("--note", default=None, help="a paragraph for the page: the machine, its load, what else ran")
    s.add_argument("--lock", default=None, help="a file to hold a flock on while each run goes (take turns)")
    s.add_argument("--lock-turn", type=float, default=0.0, help="with --lock: keep it across runs for this many s")
    s.add_argument("--trainers", default=None, help="comma-separated trainers (default: the config's)")
    s.add_argument("--backends", default=None, help="comma-separated backends (default: the config's cluster)")
    s.add_argument("--trials", type=int, default=10, help="runs per cell")
    s.add_argument("--window", default=None, help="FIRST:LAST step the fault is drawn from (default: steps/5:steps/2)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--seconds", type=float, default=None, help="how long a hang lasts (default: the kind's)")
    s.add_argument("--max-parallel", type=int, default=None, help="runs at a time (default: 1 locally, all on Slurm)")
    s.add_argument("--detach", action="store_true", help="return once the sweep controller is started")
    s.set_defaults(fn=cmd_matrix)

    s = sub.add_parser("drill", help="probe jobs: what preemption, --signal, requeue and arrays do on this Slurm")
    s.add_argument("--partition", default=None)
    s.add_argument("--timeout", type=float, default=120.0, help="seconds each probe may take to start or come back")
    s.set_defaults(fn=cmd_drill)

    s = sub.add_parser("replay", help="rerun RUN with its resolved spec and faults; prints the new run dir")
    s.add_argument("run")
    s.add_argument("--detach", action="store_true")
    s.set_defaults(fn=cmd_replay)

    s = sub.add_parser("ls", help="runs and sweeps under RUN_ROOT (default $WORKBENCH_RUN_ROOT or ./runs)")
    s.add_argument("run_root", nargs="?")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_ls)

    s = sub.add_parser("project", help="project RUN to cluster scale: goodput of checkpoint-restart, elastic, DiLoCo")
    s.add_argument("run")
    for flag, name, typ, helptext in PROJECT_FLAGS:
        s.add_argument(flag, dest=name, type=typ, default=None, help=helptext)
    s.add_argument("--baseline", default=None, help="a fault-free run to measure the per-step overhead against")
    s.add_argument("--measured-costs", action="store_true", help="carry the run's measured recovery times to scale")
    s.add_argument("--replicates", type=int, default=32, help="Monte-Carlo replicates")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_project)

    s = sub.add_parser("classroom", help="the live dashboard as a page with no code (Voilà, 127.0.0.1, token)")
    s.add_argument(
        "run", nargs="?", help="run directory (default: the newest run under the run root, at each page load)"
    )
    s.add_argument(
        "--run-root", default=None, help="where to look for the newest run (default $WORKBENCH_RUN_ROOT or ./runs)"
    )
    s.add_argument("--port", type=int, default=DEFAULT_PORT)
    s.add_argument("--faults", action="store_true", help="show the fault buttons (off unless given)")
    s.add_argument("--config", default=None, help="submit this config first (configs/classroom.yaml) and serve its run")
    s.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of --config's spec (repeatable)",
    )
    s.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="with --config: stop the run after S seconds (default: its chaos schedule's length)",
    )
    s.set_defaults(fn=cmd_classroom)

    for name, (_, helptext) in PLUGINS.items():
        s = sub.add_parser(name, help=helptext)
        s.add_argument("rest", nargs=argparse.REMAINDER)
        s.set_defaults(fn=cmd_plugin)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in PLUGINS:  # its own parser: its --help, and options before its positionals
        return load(PLUGINS[given[0]][0])(given[1:])
    args = build_parser().parse_args(given)
    try:
        return args.fn(args)
    except (SpecError, FaultError, ValueError, TimeoutError, ControllerGone) as e:
        print(f"workbench {args.command}: {e}", file=sys.stderr)
        return 2
