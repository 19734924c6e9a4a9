"""``python -m bench [--quick] [--out docs/benchmarks.md] [--only SECTIONS] [--set KEY=VALUE]``: run the benchmarks, write the report.

Order: the fault-free comparison (torchft-lite, ddp-restart and, in full mode,
torchft-lite without step events, interleaved; that one's window starts at its
first heartbeat past step 0, since it writes no step events), torchft-lite kill
recovery (full mode), the hot spare, the kill-every-period comparison
(torchft-lite and ddp-restart, interleaved), torchft's structured logs routed
on / off (interleaved), the per-step cost broken down against plain DDP
(``stepcost``), heal bandwidth at ~250 MB (``heal``), the event pipeline, then ``ft.algorithm``
under one recorded fault trace (``algorithms``: :mod:`bench.algorithms`, its own section of the report),
the live loss plot in the kernel and in chromium (``live_plot``: :mod:`bench.live_plot`), and the fork server
against submitit's LocalExecutor (``forkserver``: :mod:`bench.forkserver`), and how fast a semi-synchronous round
gets over a fault (``syncfaults``: :mod:`bench.syncfaults`), and the straggler score fault-free and under a
``straggler`` fault (``straggler``: :mod:`bench.straggler`), and TorchTitan's kill → participating with the
replacement's phases (``titan_recovery``: :mod:`bench.titan_recovery`), and MaxText's restart → first step with
its phases, standby against cold (``maxtext_restart``: :mod:`bench.maxtext_restart`), and TorchTitan elastic
against TorchTitan's own checkpoint-restart under one recorded kill trace (``titan_restart``:
:mod:`bench.titan_restart`), and on the dev Slurm cluster TorchTitan's kill → participating (2 nodes × 1 rank)
and MaxText's restart → first step (2 processes), each without and with a hot spare (``slurm``: :mod:`bench.slurm`,
which brings its own dev clusters up and takes them down), each its own section.
The survivor stall under chaos and the live groups evicted meanwhile (``stall``: :mod:`bench.stall`,
``--set stall_minutes=N``) is its own section too.
``--only`` runs a subset and replaces only those sections of ``--out``. A run
or section that fails is listed at the end and the exit status is 1. The
process renices itself (and so every run it starts) by 10: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

from . import (
    algorithms,
    forkserver,
    heal,
    live_plot,
    machine,
    maxtext_restart,
    pipeline,
    recovery,
    report,
    sessions,
    slurm,
    stall,
    stepcost,
    straggler,
    syncfaults,
    titan_recovery,
    titan_restart,
    torchft_logs,
)
from .sessions import TORCHFT, TORCHFT_NO_EVENTS, TORCHFT_SPARE, ddp_restart

REPO = Path(__file__).resolve().parent.parent

# Full / quick settings: fault-free window and repetitions, kill-recovery run, kill period.
FULL = dict(
    clean_window_s=30.0,
    clean_reps=3,
    writer_ab=True,
    recovery_window_s=75.0,
    recovery_every_s=12.5,
    kill_every_s=60.0,
    kill_window_s=180.0,
    checkpoint_every_s=10.0,
    log_route_reps=3,
    log_route_window_s=20.0,
    stepcost_reps=5,
    stepcost_window_s=16.0,
    stepcost_pair_reps=5,
    stall_minutes=30.0,
)
QUICK = dict(
    clean_window_s=15.0,
    clean_reps=1,
    writer_ab=False,
    recovery_window_s=0.0,
    recovery_every_s=0.0,
    kill_every_s=20.0,
    kill_window_s=40.0,
    checkpoint_every_s=5.0,
    log_route_reps=1,
    log_route_window_s=10.0,
    stepcost_reps=1,
    stepcost_window_s=10.0,
    stepcost_pair_reps=0,
    stall_minutes=3.0,
)


SECTIONS = (
    "clean",
    "recovery",
    "spare",
    "faulted",
    "log_route",
    "pipeline",
    "stepcost",
    "heal",
    "algorithms",
    "live_plot",
    "forkserver",
    "syncfaults",
    "straggler",
    "stall",
    "titan_recovery",
    "maxtext_restart",
    "titan_restart",
    "slurm",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: short windows, one repetition (~3-5 min)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--run-root", default=None, help="where the benchmark runs go (default: a temporary folder)")
    ap.add_argument(
        "--only",
        default=None,
        help=f"comma-separated subset of {','.join(SECTIONS)}: run only these and replace only their "
        "sections of --out (the rest of the document stays as the last full run wrote it)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting of the mode (e.g. clean_window_s=10, writer_ab=true)",
    )
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    unknown = only - set(SECTIONS)
    if unknown:
        ap.error(f"--only: unknown section(s) {', '.join(sorted(unknown))}; allowed: {', '.join(SECTIONS)}")
    os.nice(10)
    warnings.filterwarnings("ignore", message=".*replicas is 1.*")
    cfg = dict(QUICK if args.quick else FULL)
    for kv in args.set:
        key, _, value = kv.partition("=")
        if key not in cfg:
            ap.error(f"--set: unknown setting {key!r}; allowed: {', '.join(cfg)}")
        cfg[key] = json.loads(value.lower()) if value.lower() in ("true", "false") else type(cfg[key])(float(value))
    out = Path(args.out)
    img = out.parent / "img"
    img.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    info = {
        **machine.describe(),
        "mode": "quick" if args.quick else "full",
        "settings": cfg,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "only": sorted(only) if args.only else None,
        "set": args.set,
    }
    print(f"bench ({info['mode']}): {info['nproc']} CPUs, {info['cpu_model']}, load {info['loadavg_at_start']}")

    clean, kill_runs, spare_runs, faulted, log_route, step_cost, heal_bw, alg, lp, fork, sync = (
        [],
        [],
        [],
        [],
        None,
        None,
        None,
        None,
        None,
        None,
        None,
    )
    crashed: list[dict] = []
    strag = None
    stall_m = None
    titan = None
    mt_restart = None
    titan_rs = None
    slurm_m = None
    with tempfile.TemporaryDirectory(prefix="wb-bench-runs-") as tmp:
        root = Path(args.run_root or tmp)
        ddp = ddp_restart(cfg["checkpoint_every_s"])
        if "clean" in only:
            clean_variants = [TORCHFT, ddp] + ([TORCHFT_NO_EVENTS] if cfg["writer_ab"] else [])
            clean = sessions.interleaved(clean_variants, cfg["clean_reps"], cfg["clean_window_s"], root)
        if "recovery" in only and cfg["recovery_window_s"]:
            v = TORCHFT.kills(cfg["recovery_every_s"], cfg["recovery_window_s"], targets=[1, 2])
            print(f"[kill recovery] {v.name}, {cfg['recovery_window_s']:g} s window")
            kill_runs.append(sessions.run_variant(v, cfg["recovery_window_s"] + 5, root))
        if "spare" in only:
            spare_window, spare_every = cfg["recovery_window_s"] or 40.0, cfg["recovery_every_s"] or 12.5
            v = TORCHFT_SPARE.kills(spare_every, spare_window, targets=[1, 2])
            print(f"[kill recovery, hot spare] {v.name}, {spare_window:g} s window")
            spare_runs = [sessions.run_variant(v, spare_window + 5, root)]
        if "faulted" in only:
            every, window = cfg["kill_every_s"], cfg["kill_window_s"]
            faulted = sessions.interleaved(
                [TORCHFT.kills(every, window, targets=[1, 2]), ddp.kills(every, window, targets=[1, 2])],
                1,
                window,
                root,
            )
        if "log_route" in only:
            log_route = torchft_logs.measure(cfg["log_route_reps"], cfg["log_route_window_s"], root)
        if "stepcost" in only:
            step_cost = _section(
                crashed,
                "stepcost",
                stepcost.measure,
                cfg["stepcost_reps"],
                cfg["stepcost_window_s"],
                root,
                ddp,
                pair_reps=cfg["stepcost_pair_reps"],
            )
        if "heal" in only:
            print("[heal bandwidth] ~250 MB of state, one kill")
            heal_bw = _section(crashed, "heal", heal.measure, root)
        if "forkserver" in only:
            print("[fork server] kill -> participating, submit -> first step, fork server vs LocalExecutor")
            fork = _section(crashed, "forkserver", forkserver.measure, 1 if args.quick else 3, root)
        if "syncfaults" in only:
            print(
                "[sync faults] kill inside a sync's all-reduce (drop_failed_pg), a group stopped mid-window (catch_up)"
            )
            sync = _section(crashed, "syncfaults", syncfaults.measure, 1 if args.quick else 3, root)
        if "straggler" in only:
            print("[straggler score] three groups fault-free (5 min; --quick 1 min), then each throttled in turn")
            strag = _section(crashed, "straggler", straggler.measure, 60.0 if args.quick else 300.0, root)
        if "titan_recovery" in only:
            print("[titan recovery] kill -> participating and the replacement's phases, titan-cpu and titan-cpu-light")
            titan = _section(
                crashed, "titan_recovery", titan_recovery.measure_section, 3 if args.quick else 6, 15.0, root
            )
        if "maxtext_restart" in only:
            print("[maxtext restart] restart -> first step and its phases, standby vs cold, one process")
            mt_restart = _section(crashed, "maxtext_restart", maxtext_restart.measure, 3 if args.quick else 5, root)
        if "titan_restart" in only:
            print("[titan restart] TorchTitan elastic vs its own checkpoint-restart, one recorded kill trace")
            titan_rs = _section(
                crashed, "titan_restart", titan_restart.measure, root, **titan_restart.settings(args.quick)
            )
        if "slurm" in only:
            print(
                "[slurm] dev Slurm cluster: TorchTitan 2x1 kill -> participating, "
                "MaxText 2 processes restart -> first step"
            )
            slurm_m = _section(crashed, "slurm", slurm.measure, 1 if args.quick else 5, root)
            if slurm_m is not None:
                crashed += [{"variant": f"section slurm ({k})", "error": v} for k, v in slurm_m["errors"].items()]
        if "stall" in only:
            print(f"[survivor stall] the demo under chaos for {cfg['stall_minutes']:g} min, a second demo beside it")
            stall_m = _section(crashed, "stall", stall.measure, cfg["stall_minutes"], root)
        if "live_plot" in only:
            print("[live plot] kernel-side update cost at 100k points, event -> drawn in chromium")
            lp = _section(
                crashed,
                "live_plot",
                live_plot.run,
                100_000,
                50 if args.quick else 200,
                15.0 if args.quick else 30.0,
                10.0,
            )
        if "algorithms" in only:
            alg_cfg = algorithms.QUICK if args.quick else algorithms.FULL
            alg_info = {
                "started": time.strftime("%Y-%m-%d %H:%M %Z"),
                "mode": info["mode"],
                "load_start": algorithms.load(),
            }
            alg = _section(crashed, "algorithms", algorithms.measure, alg_cfg, root)
            alg_info["load_end"] = algorithms.load()
    torchft_faulted = [r for r in kill_runs + faulted if r.spec.trainer == "torchft-lite"]
    stepping = [r for r in clean if sessions.writes_steps(r)]  # events off: only the writer A/B reads it

    results = {
        "machine": info,
        "recoveries": recovery.kill_recoveries(torchft_faulted),
        "spare_recoveries": recovery.kill_recoveries(spare_runs),
        "restart_recoveries": recovery.kill_recoveries([r for r in faulted if r.spec.trainer == "ddp-restart"]),
        "survivors": recovery.survivor_steps(torchft_faulted),
        "throughput": recovery.throughputs(stepping + faulted),
        "startup": recovery.startup(stepping + kill_runs + faulted),
        "writer_ab": recovery.writer_ab(clean),
        "breakeven": report.breakeven_of(clean, faulted),
        "log_route": log_route,
        "step_cost": step_cost,
        "heal": heal_bw,
        "errors": [
            {"variant": r.variant, "error": r.error} for r in clean + kill_runs + spare_runs + faulted if r.error
        ]
        + [{"variant": r["variant"], "error": r["error"]} for r in (step_cost or {}).get("runs", []) if r["error"]]
        + ([{"variant": heal_bw["variant"], "error": heal_bw["error"]}] if heal_bw and heal_bw["error"] else [])
        + crashed,
    }
    if "pipeline" in only:
        thr = results["throughput"]
        ft_steps = thr.query("variant == 'torchft-lite'")["median_step_time_s"].dropna() if len(thr) else []
        results["pipeline"] = pipeline.run_all(args.quick, img, float(ft_steps.median()) if len(ft_steps) else None)
    if fork is not None:
        results["forkserver"] = fork
    if lp is not None:
        results["live_plot"] = lp
    if titan is not None:
        results["titan_recovery"] = titan
    if slurm_m is not None:
        results["slurm"] = slurm_m
    results["machine"]["loadavg_at_end"] = machine.loadavg()
    results["machine"]["bench_wall_s"] = time.time() - t_start
    if args.only:
        report.write_sections(results, out, img)
        name = "benchmarks-" + "-".join(sorted(only)) + ".json"
    else:
        before = out.read_text() if out.exists() else ""
        report.write(results, out, img)
        name = "benchmarks.json"
    if fork is not None:
        _write_marked(out, "forkserver", forkserver.render(fork))
    if sync is not None:
        _write_marked(out, "syncfaults", syncfaults.render(sync))
    if strag is not None:
        _write_marked(out, "straggler", straggler.render(strag))
    if stall_m is not None:
        _write_marked(out, "stall", stall.render(stall_m))
    if titan is not None:
        _write_marked(out, "titan_recovery", titan_recovery.render(titan))
    if mt_restart is not None:
        _write_marked(out, "maxtext_restart", maxtext_restart.render(mt_restart))
    if titan_rs is not None:
        _write_marked(out, "titan_restart", titan_restart.render(titan_rs))
    if slurm_m is not None:
        _write_marked(out, "slurm", slurm.render(slurm_m))
    if lp is not None:
        _write_marked(
            out,
            "live_plot",
            [
                "## Live loss plot (kernel side and in chromium)",
                "",
                *(f"- {line}" for line in live_plot.report_lines(lp)),
            ],
        )
    if alg is not None:
        alg["settings"] = {k: v for k, v in alg_cfg.items() if k != "timeout_s"}
        algorithms.write_section(out, algorithms.markdown(alg, alg_info))
    if not args.only:
        _keep_unwritten_sections(out, before)
    (img / name).write_text(json.dumps(report.jsonable(results), indent=1, default=str))
    for e in results["errors"]:
        print(f"ERROR in {e['variant']}: {e['error']}")
    print(f"wrote {out} in {time.time() - t_start:.0f} s")
    return 1 if results["errors"] else 0


def _write_marked(out: Path, name: str, lines: list[str]) -> None:
    """A bench's own section of the report, between markers, replaced in place by the next run."""
    begin, end = f"<!-- bench.{name}: begin -->", f"<!-- bench.{name}: end -->"
    algorithms.write_section(out, "\n".join([begin, *lines, end]) + "\n", begin, end)


def _keep_unwritten_sections(out: Path, before: str) -> None:
    """Put back the marked sections of the old report that this run did not write: a full run rebuilds the
    report from scratch, and figures measured by hand (``bench.slurm_recovery``, ``bench.stall_sweep``) would
    be lost with it. Each goes back after the section that preceded it in the old report (before the first
    one if none did), so a report keeps its order over full runs."""
    marked = r"<!-- bench\.(\w+): begin -->.*?<!-- bench\.\1: end -->\n?"
    now = out.read_text()
    after = None  # the end marker of the last old section that is in the new report
    for block in re.finditer(marked, before, re.S):
        begin, end = f"<!-- bench.{block[1]}: begin -->", f"<!-- bench.{block[1]}: end -->"
        if begin in now:
            after = end
            continue
        text = block[0].rstrip("\n") + "\n"
        if after is not None:
            at = now.index(after) + len(after) + 1
        else:
            first = re.search(marked, now, re.S)
            at = first.start() if first else len(now)
        head, tail = now[:at].rstrip("\n"), now[at:].lstrip("\n")
        now = head + "\n\n" + text + ("\n" + tail if tail else "")
        after = end
    out.write_text(now)


def _section(crashed: list, name: str, fn, *args, **kwargs):
    """One section's measurement; an exception is recorded (and ends in exit 1), not fatal to the others."""
    import traceback

    try:
        return fn(*args, **kwargs)
    except Exception as e:
        traceback.print_exc()
        crashed.append({"variant": f"section {name}", "error": f"{type(e).__name__}: {e}"})
        return None


if __name__ == "__main__":
    sys.exit(main())
