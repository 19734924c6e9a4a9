"""``python -m bench.titan_restart [--window-s S] [--every-s S]``: elastic TorchTitan against its own checkpoint-restart.

The seed's claim ("minutes lost, not hours") on TorchTitan itself, under one recorded fault trace:

1. elastic: ``configs/titan-cpu.yaml`` (2 replica groups of one rank, TorchTitan + TorchFT), trained for
   ``window_s`` after its first committed step with a SIGKILL of group 1 every ``every_s`` s, half a
   period in (``at_s``: from the first committed step);
2. the trace: the times its ``fault`` events were written, from its first committed step;
3. checkpoint-restart: ``configs/titan-restart-cpu.yaml`` (one job of 2 FSDP ranks: the same model,
   TOML and global batch, torchft off, a DCP checkpoint every ``checkpoint_interval`` steps) with a
   SIGKILL of rank 1 at each time of that trace, trained for the same window.

Per run, from its events (``workbench.analysis.breakeven.throughput``): useful samples/s (each
committed step once per group or rank: the steps a restart redoes count once), the steady-state rate
and goodput (useful over what the steady rate would have trained in the window); kill → first
committed step of the victim again (``analysis.recovery_timeline``'s ``participating``), median over
the kills. The ratio is elastic's useful samples/s over checkpoint-restart's. One run per variant
(n = 1 for the ratio; the recovery medians are over that run's kills), the load average beside each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench import sessions
from bench.algorithms import write_section

REPO = Path(__file__).resolve().parent.parent
MARK_BEGIN, MARK_END = "<!-- bench.titan_restart: begin -->", "<!-- bench.titan_restart: end -->"
ELASTIC, RESTART = "titan-cpu", "titan-restart-cpu"
SETTINGS = dict(window_s=270.0, every_s=60.0, checkpoint_interval=10, target=1)
QUICK = {**SETTINGS, "window_s": 130.0}


def settings(quick: bool) -> dict:
    return dict(QUICK if quick else SETTINGS)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def run_for(config: str, overrides: dict, window_s: float, root: Path, log=print) -> dict:
    """One run of ``config``, stopped ``window_s`` after its first committed step; its events and load."""
    import workbench as wb

    overrides = {"steps": sessions.BIG, "run_root": str(root), "max_restarts": 1000, **overrides}
    load_start, t0 = _load(), time.time()
    run = wb.submit(config, overrides)
    progress = sessions._ProgressWatch()
    error = None
    try:
        run.wait_for(
            lambda r: progress.first_t(r.events_read) is not None or r.state() in ("failed", "stopped"), timeout=300
        )
        first = progress.first_t(run.events_read)
        if first is None:
            error = f"run {run.id} ended ({run.state()}) before its first step"
        else:
            run.wait_for(
                lambda r: time.time() - first >= window_s or r.state() in ("failed", "stopped", "completed"),
                timeout=window_s + 300,
            )
    except TimeoutError as e:
        error = str(e)
    finally:
        sessions._stop(run)
    events = run.event_records()
    out = {
        "config": config,
        "run_dir": str(run.run_dir),
        "spec": run.spec,
        "events": events,
        "first_t": progress.first_t(events),
        "load_start": load_start,
        "load_end": _load(),
        "wall_s": time.time() - t0,
        "error": error,
    }
    log(
        f"  {config}: {sum(1 for e in events if e['kind'] == 'fault')} faults, {out['wall_s']:.0f} s wall, "
        f"load {load_start} -> {out['load_end']}" + (f", ERROR {error}" if error else "")
    )
    return out


def figures(record: dict) -> dict:
    """The bench's figures of one run (module docstring)."""
    from workbench import analysis
    from workbench.analysis.breakeven import fault_cost, throughput

    events, spec = record["events"], record["spec"]
    t = throughput(events, spec)
    cost = fault_cost((events, spec))
    timeline = analysis.recovery_timeline(events)
    back = [float(x) for x in timeline["participating"].dropna()] if len(timeline) else []
    return {
        "trainer": spec.trainer,
        "faults": cost["faults"],
        "useful_samples_per_s": t["useful_samples_per_s"],
        "rate_samples_per_s": t["rate_samples_per_s"],
        "goodput": t["goodput"],
        "rolled_back_steps": t.get("rolled_back_steps"),
        "kill_to_participating_s": statistics.median(back) if back else None,
        "kill_to_participating_each_s": back,
        "checkpoint_period_s": cost.get("checkpoint_period_s"),
        "load_start": record["load_start"],
        "load_end": record["load_end"],
        "run_dir": record["run_dir"],
        "error": record["error"],
    }


def trace_of(record: dict) -> list[float]:
    """The recorded trace: each ``fault`` event's time after the run's first committed step, in s."""
    return [round(e["t"] - record["first_t"], 2) for e in record["events"] if e["kind"] == "fault"]


def measure(root: Path, window_s: float, every_s: float, checkpoint_interval: int, target: int = 1, log=print) -> dict:
    """Run both variants (module docstring) under ``root``; returns their figures and the trace."""
    t0, started = time.time(), time.strftime("%Y-%m-%d %H:%M %Z")
    planned = [
        {"action": "kill", "target": target, "at_s": every_s * (i + 0.5)} for i in range(int(window_s // every_s))
    ]
    log(f"[titan restart] elastic {ELASTIC}, {window_s:g} s window, a kill every {every_s:g} s")
    elastic = run_for(ELASTIC, {"faults": planned}, window_s, root, log)
    trace = trace_of(elastic) if elastic["first_t"] is not None else [f["at_s"] for f in planned]
    replayed = [{"action": "kill", "target": target, "at_s": s} for s in trace]
    log(f"[titan restart] checkpoint-restart {RESTART}, every {checkpoint_interval} steps, the trace {trace}")
    restart = run_for(
        RESTART, {"faults": replayed, "titan.checkpoint_interval": checkpoint_interval}, window_s, root, log
    )
    e, r = figures(elastic), figures(restart)
    ratio = (
        e["useful_samples_per_s"] / r["useful_samples_per_s"]
        if e["useful_samples_per_s"] and r["useful_samples_per_s"]
        else None
    )
    used = dict(window_s=window_s, every_s=every_s, checkpoint_interval=checkpoint_interval, target=target)
    return {
        "elastic": e,
        "restart": r,
        "ratio": ratio,
        "trace_s": trace,
        "seconds": time.time() - t0,
        "started": started,
        "settings": used,
    }


def _cell(v, fmt: str = "{:.3g}") -> str:
    return "–" if v is None else fmt.format(v)


def render(result: dict) -> list[str]:
    """The report's section, without its markers (``bench.__main__._write_marked`` adds them)."""
    e, r, settings, started = result["elastic"], result["restart"], result["settings"], result["started"]
    rows = []
    for name, f in ((f"elastic ({ELASTIC})", e), (f"checkpoint-restart ({RESTART})", r)):
        rows.append(
            f"| {name} | {f['faults']} | {_cell(f['useful_samples_per_s'])} | {_cell(f['rate_samples_per_s'])} "
            f"| {_cell(f['goodput'], '{:.1%}')} | {_cell(f['kill_to_participating_s'], '{:.1f}')} "
            f"| {f['rolled_back_steps']} | {f['load_start']} → {f['load_end']} |"
        )
    return [
        "## TorchTitan elastic vs TorchTitan checkpoint-restart, one recorded fault trace "
        "(`python -m bench --only titan_restart`)",
        "",
        f"{started}; {result['seconds']:.0f} s. The llama3 debug model (6.2M parameters, float32, gloo, CPU), "
        "the global batch of 2 × 4 sequences in both: elastic is 2 TorchTitan + TorchFT replica groups of "
        "one rank; checkpoint-restart one job of 2 FSDP ranks with torchft off and a DCP checkpoint every "
        f"{settings['checkpoint_interval']} steps. Each trained {settings['window_s']:g} s from its first "
        f"committed step. The trace: elastic with a SIGKILL of group {settings['target']} every "
        f"{settings['every_s']:g} s, half a period in; its `fault` events were at {result['trace_s']} s after "
        f"its first committed step, and checkpoint-restart got a SIGKILL of rank {settings['target']} at those "
        "times. One run per variant (n = 1); kill → participating is the median over that run's kills. "
        "A sample is what `analysis.goodput` counts for TorchTitan: one committed step of one group (elastic) or "
        "rank (checkpoint-restart), 4 sequences; useful counts a step redone after a restore once (`rolled "
        "back`: the rank-steps trained and then lost). Steady: the run's own fault-free stretches. Elastic also "
        "writes TorchTitan's checkpoint every 50 steps (the TOML's), which it never needs here.",
        "",
        "| variant | kills | useful samples/s | steady samples/s | goodput | kill → participating s (median) "
        "| rolled back | load (1 min) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"**Useful-throughput ratio, elastic / checkpoint-restart: {_cell(result['ratio'], '{:.2f}')}×.** "
        f"Kill → participating each, elastic {[round(x, 1) for x in e['kill_to_participating_each_s']]} s, "
        f"checkpoint-restart {[round(x, 1) for x in r['kill_to_participating_each_s']]} s; "
        f"checkpoint-restart's measured checkpoint period {_cell(r['checkpoint_period_s'], '{:.1f}')} s.",
    ]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.titan_restart", description=__doc__.splitlines()[0])
    ap.add_argument("--window-s", type=float, default=SETTINGS["window_s"])
    ap.add_argument("--every-s", type=float, default=SETTINGS["every_s"])
    ap.add_argument("--checkpoint-interval", type=int, default=SETTINGS["checkpoint_interval"])
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--run-root", default=None, help="where the runs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    os.nice(10)
    used = {**SETTINGS, "window_s": args.window_s, "every_s": args.every_s}
    used["checkpoint_interval"] = args.checkpoint_interval
    with tempfile.TemporaryDirectory(prefix="wb-bench-titan-restart-") as tmp:
        result = measure(Path(args.run_root or tmp), **used)
    text = "\n".join([MARK_BEGIN, *render(result), MARK_END]) + "\n"
    print(text)
    write_section(Path(args.out), text, MARK_BEGIN, MARK_END)
    return 1 if result["elastic"]["error"] or result["restart"]["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
