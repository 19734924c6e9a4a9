"""``python -m bench.algorithms [--quick]``: ``ft.algorithm`` as an ablation axis under one recorded fault trace.

Three steps, all through the workbench's own machinery:

1. a fault-free sweep (``workbench.experiments.sweep``) of ``configs/algorithms.yaml`` over ddp and, at each of two
   sync periods, localsgd, diloco and streaming_diloco (2 fragments, ``fragment_sync_delay`` 1);
2. the trace: a ddp run with scheduled kills (``faults``, at committed steps), recorded in its ``run.json``;
3. the same faults over the semi-synchronous points: a sweep whose base is that run's replay spec
   (``workbench.run.replay.replay_spec``), so every point is hit at the same training steps.

Per point: fault-free useful samples/s relative to ddp, bytes per useful group-step relative to ddp
(the ``bytes`` each ``step`` event carries, counted at the process group's all-reduce, summed over the
groups, divided by the useful steps of :mod:`workbench.analysis.useful`), goodput under the trace
(``analysis.goodput``), final loss (``compare.final_loss``, fault-free and under the trace), survivor
stall and kill → rejoined (``analysis.summary``: max and median over the kills).

A point's per-algorithm settings are given explicitly (``torchft.use_async_quorum``,
``lighthouse.join_timeout_ms``): a sweep point is the base's resolved spec plus the point, so what the
spec derives for one algorithm would otherwise carry over to the next.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
CONFIG = "algorithms"
MARK_BEGIN, MARK_END = "<!-- bench.algorithms: begin -->", "<!-- bench.algorithms: end -->"

# Steps: a replacement is training ~5-8 s after a kill here, and a semi-synchronous survivor steps in
# ~10-15 ms (ddp ~16 ms): a run must outlast that by far, or its survivor finishes before the victim
# is back and the replacement trains alone from scratch. Both kills hit group 1: a survivor is a group
# never killed (workbench.analysis.recovery), so with 2 groups killed once each the stall column was empty.
FULL = dict(steps=3000, kill_steps=(500, 1800), kill_targets=(1, 1), periods=(4, 16), timeout_s=1800.0)
QUICK = dict(steps=1000, kill_steps=(200,), kill_targets=(1,), periods=(4, 16), timeout_s=900.0)


def points(periods) -> list[dict]:
    """ddp, then localsgd, diloco, streaming_diloco at each sync period, with their settings spelled out."""
    per_step = {"torchft.use_async_quorum": True, "lighthouse.join_timeout_ms": 1000}
    out = [{"ft.algorithm": "ddp", **per_step}]
    for p in periods:
        out += [
            {
                "ft.algorithm": "localsgd",
                "ft.sync_every": p,
                "torchft.use_async_quorum": True,
                "lighthouse.join_timeout_ms": 30_000,
            },
            {
                "ft.algorithm": "diloco",
                "ft.sync_every": p,
                "torchft.use_async_quorum": False,
                "lighthouse.join_timeout_ms": 30_000,
            },
            {
                "ft.algorithm": "streaming_diloco",
                "ft.sync_every": p,
                "ft.fragments": 2,
                "ft.fragment_sync_delay": 1,
                "torchft.use_async_quorum": False,
                "lighthouse.join_timeout_ms": 30_000,
            },
        ]
    return out


def label(point: dict) -> str:
    a = point["ft.algorithm"]
    return a if a == "ddp" else f"{a} /{point['ft.sync_every']}"


def run_figures(run) -> dict:
    """The bench's figures of one finished run, from its event log."""
    from workbench import analysis
    from workbench.analysis import compare
    from workbench.analysis.useful import decided

    events = run.event_records()
    good = analysis.goodput(events, run.spec)
    steps = [e for e in decided(events) if e.get("kind") == "step"]
    useful = sum(1 for e in steps if e.get("committed") and e.get("participating") is not False)
    timeline = analysis.recovery_timeline(events)
    s = analysis.summary(events, run.spec, timeline)
    return {
        "run_dir": str(run.run_dir),
        "state": s["state"],
        "useful_samples_per_s": good["useful_samples"] / good["T_s"] if good.get("T_s") else None,
        "bytes_per_step": sum(e.get("bytes") or 0 for e in steps) / useful if useful else None,
        "goodput": good["goodput"],
        "final_loss": compare.final_loss(compare.committed_losses(events)),
        "survivor_stall_s": s["survivor_stall_s"],
        "kill_to_rejoin_s": s["kill_to_rejoin_s"],
        "faults": s["faults"],
        "steps_lost": s["steps_redone"],
    }


def _finish(sweep, timeout_s: float, log) -> list:
    try:
        sweep.wait(timeout=timeout_s)
    finally:
        if sweep.state() not in ("completed", "failed", "stopped"):
            log(f"[algorithms] sweep {sweep.dir if hasattr(sweep, 'dir') else ''} over time: stopping it")
            sweep.stop()
    runs = sweep.runs()
    return [runs.get(i) for i in range(len(sweep.points))]


def measure(cfg: dict, root: Path, log=print) -> dict:
    """Run the three steps (module docstring) under ``root``; returns the table and what it came from."""
    import workbench as wb
    from workbench.run.replay import replay_spec

    pts = points(cfg["periods"])
    base = [
        f"steps={cfg['steps']}",
        f"run_root={root}",
        "faults=[]",
        "ft.algorithm=ddp",
        "torchft.use_async_quorum=true",
        "lighthouse.join_timeout_ms=1000",
    ]
    t0 = time.time()
    log(f"[algorithms] fault-free sweep: {len(pts)} points, {cfg['steps']} steps each")
    clean = _finish(wb.sweep(CONFIG, base, points=pts), cfg["timeout_s"], log)
    faults = [{"action": "kill", "target": t, "at_step": s} for t, s in zip(cfg["kill_targets"], cfg["kill_steps"])]
    log(f"[algorithms] the trace: ddp with {faults}")
    original = wb.submit(
        CONFIG,
        [
            *base[:2],
            "ft.algorithm=ddp",
            "torchft.use_async_quorum=true",
            "lighthouse.join_timeout_ms=1000",
            "faults=" + json.dumps(faults),
        ],
    )
    original.wait(timeout=cfg["timeout_s"] / 3)
    trace, _ = replay_spec(original)
    log(f"[algorithms] its replay over {len(pts) - 1} semi-synchronous points")
    faulted = [original] + _finish(wb.sweep(trace, points=pts[1:]), cfg["timeout_s"], log)
    rows = []
    for p, c, f in zip(pts, clean, faulted):
        fc, ff = (run_figures(c) if c is not None else {}), (run_figures(f) if f is not None else {})
        rows.append(
            {
                "algorithm": label(p),
                "samples_per_s": fc.get("useful_samples_per_s"),
                "bytes_per_step": fc.get("bytes_per_step"),
                "final_loss": fc.get("final_loss"),
                "goodput_trace": ff.get("goodput"),
                "final_loss_trace": ff.get("final_loss"),
                "survivor_stall_s": ff.get("survivor_stall_s"),
                "kill_to_rejoin_s": ff.get("kill_to_rejoin_s"),
                "steps_lost_trace": ff.get("steps_lost"),
                "faults": ff.get("faults"),
                "state_clean": fc.get("state"),
                "state_trace": ff.get("state"),
                "run_clean": fc.get("run_dir"),
                "run_trace": ff.get("run_dir"),
            }
        )
    df = pd.DataFrame(rows)
    ddp = df.iloc[0]
    df.insert(2, "samples_per_s_vs_ddp", df["samples_per_s"] / ddp["samples_per_s"])
    df.insert(4, "bytes_per_step_vs_ddp", df["bytes_per_step"] / ddp["bytes_per_step"])
    return {"table": df, "faults": faults, "seconds": time.time() - t0, "trace_run": str(original.run_dir)}


def markdown(result: dict, info: dict) -> str:
    df = result["table"]
    cols = [
        "algorithm",
        "samples_per_s_vs_ddp",
        "bytes_per_step_vs_ddp",
        "goodput_trace",
        "final_loss",
        "final_loss_trace",
        "survivor_stall_s",
        "kill_to_rejoin_s",
        "steps_lost_trace",
    ]

    def cell(v) -> str:
        if v is None or (isinstance(v, float) and v != v):
            return "–"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = [
        MARK_BEGIN,
        "## ft.algorithm under one recorded fault trace (`python -m bench.algorithms`)",
        "",
        f"{info['started']}, {info['mode']} settings ({result['settings']}); load average (1 min) "
        f"{info['load_start']} at start, {info['load_end']} at end; {result['seconds']:.0f} s. "
        f"2 groups of the tiny decoder (`configs/algorithms.yaml`), one run per cell (n = 1: no medians). "
        f"The trace: a ddp run with {result['faults']}, replayed over the semi-synchronous points. "
        "Fault-free columns from a sweep of the same points without faults. `/k`: sync every k inner steps; "
        "streaming_diloco: 2 fragments, `fragment_sync_delay` 1. samples/s: useful (a semi-synchronous step "
        "once its sync committed) over first → last committed step; bytes: at the process group's all-reduce "
        "per useful group-step; stall and kill → rejoined in s.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
        *("| " + " | ".join(cell(r[c]) for c in cols) + " |" for _, r in df.iterrows()),
        "",
        f"ddp fault-free: {cell(df.iloc[0]['samples_per_s'])} samples/s, {cell(df.iloc[0]['bytes_per_step'])} "
        "bytes per group-step.",
        MARK_END,
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str, begin: str = MARK_BEGIN, end: str = MARK_END) -> None:
    """Replace one bench's section of ``path`` (between its markers ``begin``/``end``), or append it."""
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        a, b = old.index(begin), old.index(end) + len(end) + 1
        new = old[:a] + text + old[b:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def load() -> str:
    return "{:.2f}".format(os.getloadavg()[0])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.algorithms", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs, one kill")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--run-root", default=None, help="where the runs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    os.nice(10)
    cfg = QUICK if args.quick else FULL
    info = {
        "started": time.strftime("%Y-%m-%d %H:%M %Z"),
        "mode": "quick" if args.quick else "full",
        "load_start": load(),
    }
    with tempfile.TemporaryDirectory(prefix="wb-bench-alg-") as tmp:
        result = measure(cfg, Path(args.run_root or tmp))
    result["settings"] = {k: v for k, v in cfg.items() if k != "timeout_s"}
    info["load_end"] = load()
    text = markdown(result, info)
    print(text)
    print(result["table"].to_string())
    write_section(Path(args.out), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
