"""``workbench``: the same loop as the notebook API, from a shell.

Every command exits non-zero with a one-line reason on bad input, before
anything is submitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from workbench.errors import ControllerGone, FaultError, SpecError
from workbench.faults import kinds as faultkinds
from workbench.run.handle import ENDED, KILL_ALIASES, attach, submit
from workbench.spec.load import load_spec
from workbench.spec.preflight import preflight


def _print_summary(summary: dict) -> None:
    def fmt(v, unit=""):
        return "n/a" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}")

    print(f"run {summary['run_dir']}")
    print(f"  state                 {summary['state']}  ({summary['trainer']}, {summary['replicas']} replica groups)")
    print(f"  steps                 {summary['steps_completed']} / {summary['steps_target']}")
    print(f"  faults / restarts     {summary['faults']} / {summary['restarts']}   heals: {summary['heals']}")
    print(
        f"  survivor steps lost   {summary['survivor_steps_lost']}   (discarded attempts: {summary['survivor_steps_discarded']})"
    )
    print(f"  survivor stall        {fmt(summary['survivor_stall_s'], ' s')} beyond a normal step")
    print(f"  kill -> rejoin        {fmt(summary['kill_to_rejoin_s'], ' s')}")
    heal_bytes = summary["heal_bytes"]
    print(
        f"  heal transfer         {fmt(summary['heal_seconds'], ' s')}, "
        f"{'n/a' if heal_bytes is None else f'{heal_bytes / 1e6:.2f} MB'}"
    )
    print(f"  submit -> first step  {fmt(summary['submit_to_first_step_s'], ' s')}")


def cmd_demo(args) -> int:
    run = submit("demo", args.overrides)
    print(
        f"demo: 3 replica groups; replica 1 is SIGKILLed at step 150 and relaunched. run dir: {run.run_dir}", flush=True
    )
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
        print(
            f"{run.id}: {st['state']}  step {st['step']}/{st['steps_target']}  faults {st['faults']}  restarts {st['restarts']}"
            + (f"  bad event lines {st['bad_lines']}" if st["bad_lines"] else "")
        )
        for r, s in st["replicas"].items():
            print(f"  replica {r}: {s['state']:<13} attempt {s['attempt']}  step {s['step']}")
        ck = st.get("checkpoints")
        if ck is not None:
            last = ck["last_durable"]
            print(
                "  last durable checkpoint: "
                + (
                    f"step {last['step']}  {last['path']}"
                    + ("" if last["marker_present"] else "  (commit marker missing on disk)")
                    if last
                    else "none"
                )
            )
            for flag in ("incomplete", "skipped"):
                if ck[flag]:
                    print(f"  {flag} save at step {', '.join(map(str, ck[flag]))}")
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


def cmd_serve_metrics(args) -> int:
    """Serve the run's metrics for Prometheus until SIGINT/SIGTERM."""
    import signal
    import threading

    from workbench.apps import exporter

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: {args.port}; allowed: 0-65535 (0: any free port)")
    if args.otlp and not args.otlp.startswith(("http://", "https://")):
        raise ValueError(f"--otlp: {args.otlp!r}; allowed: an OTLP/HTTP metrics URL (http://HOST:4318/v1/metrics)")
    if not 0.1 <= args.otlp_every <= 3600:
        raise ValueError(f"--otlp-every: {args.otlp_every}; allowed: 0.1-3600 seconds")
    run = attach(args.run)
    collector = exporter.RunCollector(run)
    try:
        server, _ = exporter.serve(collector, args.port, args.addr)
    except OSError as e:
        raise ValueError(f"--port: cannot listen on {args.addr}:{args.port} ({e.strerror or e})") from None
    provider = None
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=args.otlp), export_interval_millis=args.otlp_every * 1000
        )
        provider = exporter.otel_meter_provider(collector, [reader])
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    print(
        f"serving metrics of {run.id} on http://{args.addr}:{server.server_port}/metrics"
        + (f"; pushing OTLP to {args.otlp} every {args.otlp_every:g} s" if args.otlp else ""),
        flush=True,
    )
    done.wait()
    server.shutdown()
    if provider is not None:
        provider.shutdown()
    return 0


def cmd_summary(args) -> int:
    summary = attach(args.run).summary()
    _print_summary(summary)
    print(json.dumps(summary))
    return 0


def cmd_report(args) -> int:
    from workbench.apps.report import write_report

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
    from workbench.experiments.sweep import sweep
    from workbench.spec.load import parse_override

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


def cmd_matrix(args) -> int:
    from workbench.experiments.matrix import OUTCOMES, matrix

    window = None
    if args.window:
        lo, _, hi = args.window.partition(":")
        try:
            window = (int(lo), int(hi))
        except ValueError:
            raise SpecError(f"window: expected FIRST:LAST steps such as 5:15, got {args.window!r}") from None
    mx = matrix(
        args.config,
        args.overrides,
        faults=args.faults,
        trainers=args.trainers,
        backends=args.backends,
        trials=args.trials,
        window=window,
        seed=args.seed,
        seconds=args.seconds,
        max_parallel=args.max_parallel,
    )
    print(mx.matrix_dir, flush=True)
    if not _follow(mx.sweep, args.detach):
        return 0
    table = mx.table()
    cols = [
        "fault",
        "trainer",
        "backend",
        "status",
        "trials",
        *OUTCOMES,
        "rate",
        "ci_low",
        "ci_high",
        *[c for c in table.columns if c.endswith("_median_s") or c.endswith("_p95_s")],
    ]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


def cmd_drill(args) -> int:
    from workbench.cluster.slurm.drill import drill

    table = drill(partition=args.partition, timeout_s=args.timeout)
    print(table.to_string(index=False))
    return 0


def cmd_replay(args) -> int:
    from workbench.analysis.compare import replay_comparison
    from workbench.run.replay import replay

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

    from workbench.analysis.compare import runs_listing
    from workbench.experiments.sweep import attach_sweep, list_sweeps

    root = args.run_root or os.environ.get("WORKBENCH_RUN_ROOT", "runs")
    runs = runs_listing(root)
    sweeps = []
    for d in list_sweeps(root):
        sw = attach_sweep(d)
        states = sw.point_states()
        sweeps.append(
            {
                "sweep_id": sw.id,
                "state": sw.state(),
                "points": len(states),
                "keys": ",".join(sw.params),
                **{s: states.count(s) for s in sorted(set(states))},
                "sweep_dir": str(sw.sweep_dir),
            }
        )
    if args.json:
        print(json.dumps({"runs": runs.to_dict(orient="records"), "sweeps": sweeps}, default=str))
        return 0

    def age(s):
        return (
            ""
            if s is None or s != s
            else f"{s / 60:.0f}m"
            if s < 7200
            else f"{s / 3600:.0f}h"
            if s < 172800
            else f"{s / 86400:.0f}d"
        )

    if runs.empty:
        print(f"no runs under {root}")
    else:
        runs = runs.assign(
            steps=runs["step"].astype(str) + "/" + runs["steps_target"].astype(str), age=runs["age_s"].map(age)
        )
        print(runs[["run_id", "state", "trainer", "steps", "faults", "restarts", "age"]].to_string(index=False))
    for sw in sweeps:
        counts = " ".join(
            f"{k}={v}" for k, v in sw.items() if k not in ("sweep_id", "state", "points", "keys", "sweep_dir")
        )
        print(f"sweep {sw['sweep_id']}: {sw['state']}  {sw['points']} points over {sw['keys']}  {counts}")
    return 0


PROJECT_FLAGS = (  # flag, input, type, help (units)
    ("--gpus", "gpus", int, "accelerators"),
    ("--groups", "groups", int, "replica groups"),
    ("--device-mtbf-h", "device_mtbf_h", float, "per-device MTBF, hours (default: Meta's published MTTF at --gpus)"),
    ("--params", "params", float, "model parameters"),
    ("--step-s", "step_s", float, "fault-free step time, s"),
    ("--days", "horizon_s", float, "wall window projected, days"),
    ("--ckpt-period-s", "period_s", float, "checkpoint period, s of training (default: Daly's optimum)"),
    ("--ckpt-gbps", "write_gbps", float, "checkpoint write bandwidth, GB/s aggregate"),
    ("--restart-s", "restart_s", float, "restart after a failure, s (both strategies)"),
    ("--overhead", "overhead", float, "elastic per-step overhead, fraction of the step (default: from --cross-gbps)"),
    ("--cross-gbps", "cross_gbps", float, "elastic all-reduce bandwidth between groups, GB/s per accelerator"),
    ("--spares", "spares", int, "spare groups"),
    ("--replacement-s", "replacement_s", float, "a new node, s"),
    ("--heal-gbps", "heal_gbps", float, "heal bandwidth per accelerator, GB/s"),
    ("--sync-steps", "sync_steps", int, "DiLoCo inner steps between outer steps"),
)


def cmd_project(args) -> int:
    from workbench.projection.calibrate import project

    inputs = {name: getattr(args, name) for _, name, _, _ in PROJECT_FLAGS if getattr(args, name) is not None}
    if "horizon_s" in inputs:
        inputs["horizon_s"] *= 86400.0
    bad = [k for k, v in inputs.items() if v <= 0 and k not in ("overhead", "spares")] + [
        k for k in ("overhead", "spares") if inputs.get(k, 0) < 0
    ]
    if bad:
        flag = next(f for f, n, _, _ in PROJECT_FLAGS if n == bad[0])
        raise ValueError(f"{flag}: must be > 0 (>= 0 for --overhead, --spares)")
    baseline = attach(args.baseline) if args.baseline else None
    out = project(
        attach(args.run), baseline=baseline, measured_costs=args.measured_costs, replicates=args.replicates, **inputs
    )
    if args.json:
        print(json.dumps(out, default=float))
        return 0
    rep, job = out["reproduced"], out["inputs"]["job"]
    print(f"run {out['run_dir']}")
    print(f"  reproduced ({rep['strategy']})  predicted {rep['predicted']:.3f}   measured {rep['measured']:.3f}")
    proj = out["projection"]
    print(
        f"projection: {job['gpus']} accelerators in {job['groups']} groups, {job['params'] / 1e9:.0f}B parameters, "
        f"job MTBF {proj['job_mtbf_s'] / 3600:.2f} h"
    )
    for s in ("checkpoint-restart", "elastic", "diloco"):
        r = proj[s]
        bad_parts = ", ".join(f"{k} {v:.3f}" for k, v in r["badput"].items() if v > 5e-4)
        print(f"  {s:19s} goodput {r['goodput']:.3f} ± {r['stderr']:.3f}   badput: {bad_parts or 'none'}")
    cr = proj["checkpoint-restart"]
    print(
        f"  checkpoint period {cr['period_s']:.0f} s (Daly {cr['daly_period_s']:.0f} s, Young {cr['young_period_s']:.0f} s),"
        f" write {cr['write_s']:.1f} s"
    )
    return 0


def cmd_classroom(args) -> int:
    from workbench.apps.classroom import ClassroomError, require_port, run_for, serve

    run = None
    try:
        if args.config:
            if args.run:
                raise ClassroomError("RUN and --config: give one (--config submits a new run and serves it)")
            require_port(args.port)
            run = submit(args.config, args.overrides)
            args.run = str(run.run_dir)
            print(f"classroom: submitted {run.run_dir}", flush=True)
        timer = run_for(run, args.stop_after) if run is not None else None
        try:
            return serve(args.run, root=args.run_root, port=args.port, faults=args.faults)
        finally:
            if timer is not None:
                timer.cancel()
    except ClassroomError as e:
        print(f"workbench classroom: {e}", file=sys.stderr)
        return 2


def cmd_cluster(args) -> int:
    from workbench import devcluster

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
    s.add_argument("--addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
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

    s = sub.add_parser("matrix", help="fault kinds × trainers × backends, N runs each: recovery rates and phases")
    s.add_argument("config")
    s.add_argument("overrides", nargs="*", help="key=value for every trial")
    s.add_argument("--faults", default="kill,hang,preempt,abort", help="comma-separated fault kinds")
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

    from workbench.apps.classroom import DEFAULT_PORT

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
