"""The survivor stall under chaos, and the live groups the lighthouse evicted meanwhile.

``python -m bench.stall [--minutes 30] [--hb MS] [--beside demo|none] [--mtbf 30]`` (``make bench``:
``python -m bench --only stall``, its length ``--set stall_minutes=N``): the demo (``configs/demo.yaml``,
3 torchft-lite groups) under a ``chaos`` section of SIGKILLs, one every ``mtbf`` s on average (a Poisson
process from the seed, bounded at ``minutes × 60 / mtbf`` faults, on groups 1 and 2: group 0 is the
survivor whose stall is read, as in every kill benchmark), for ``minutes`` after its first
committed step, with a second demo run training beside it, fault-free (``--beside demo``: the two
cores shared by two runs, 6 groups, 2 lighthouses, 2 controllers). Per kill, the recovery timeline's
``survivor_stall_s`` (``analysis.recovery``); over the run, the evictions of live groups
(``analysis.evictions.live_evictions``: a quorum without a group that was alive and unfaulted) in both
runs, and the survivors' discarded steps (attempts voted down) in the fault-free run beside it, where
every one is a false failure (one that outlasted ``torchft.pg_timeout_ms``).

``--sweep 200,300,500,1000 --minutes 3``: one such run per ``lighthouse.heartbeat_timeout_ms``, in
turn; the table it writes is what the spec's default was chosen from (``LighthouseSpec``). With
``--save DIR`` each run's figures go to ``DIR/<hb>.json`` and no section is written;
``--render-sweep DIR`` writes the sweep's section from them (one run per held lock).

Both write their own section of ``--out`` (``docs/benchmarks.md``), replaced in place by the next run.
Every process of both runs is killed by PID when the window is over; the 1-minute load average is
sampled every poll and its median written beside the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

import workbench as wb
from workbench import analysis
from workbench.analysis.evictions import live_evictions

REPO = Path(__file__).resolve().parent.parent
BIG = 10_000_000


def _stop(run) -> None:
    try:
        run.stop(timeout=30)
    except Exception:
        pass
    for pid in run.pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _first_step(run) -> Optional[float]:
    return next((e["t"] for e in run.events_read if e["kind"] == "step" and e.get("committed")), None)


def measure(
    minutes: float,
    root: Path,
    hb_ms: Optional[int] = None,
    beside: str = "demo",
    mtbf_s: float = 30.0,
    seed: int = 0,
    log=print,
) -> dict:
    """One chaos run of the demo (and the run beside it); its figures."""
    n_faults = max(1, int(minutes * 60 / mtbf_s))
    hb = {} if hb_ms is None else {"lighthouse.heartbeat_timeout_ms": hb_ms}
    common = {"steps": BIG, "faults": [], "run_root": str(root), **hb}
    other = None
    loads: list[float] = []
    t0 = time.time()
    if beside == "demo":
        other = wb.submit("demo", {**common, "name": "beside"})
    run = None
    try:
        if other is not None:
            other.wait_for(lambda r: _first_step(r) is not None or r.state() in ("failed", "stopped"), 300, 1.0)
        chaos = {
            "mtbf_s": mtbf_s,
            "actions": ["kill"],
            "targets": [1, 2],
            "start_s": 10.0,
            "max_faults": n_faults,
            "seed": seed,
        }
        run = wb.submit("demo", {**common, "chaos": chaos, "max_restarts": n_faults + 10})
        run.wait_for(lambda r: _first_step(r) is not None or r.state() in ("failed", "stopped"), 300, 1.0)
        first = _first_step(run)
        if first is None:
            raise RuntimeError(f"run {run.id} ended ({run.state()}) before its first step")

        def done(r) -> bool:
            loads.append(os.getloadavg()[0])
            return time.time() - first >= minutes * 60 or r.state() in ("failed", "stopped", "completed")

        run.wait_for(done, minutes * 60 + 120, 2.0)
    finally:
        for r in (run, other):
            if r is not None:
                _stop(r)
    events = run.event_records()
    timeline = analysis.recovery_timeline(events)
    kills = timeline[analysis.ends_process(timeline)]
    stalls = kills["survivor_stall_s"].dropna().to_numpy()
    out = {
        "hb_ms": run.spec.lighthouse.heartbeat_timeout_ms,
        "pg_timeout_ms": run.spec.pg_timeout_ms,  # in effect, set or not
        "minutes": minutes,
        "run_id": run.id,
        "faults": int(len(kills)),
        "stalls": [round(float(s), 3) for s in stalls],
        "stall_median_s": float(np.median(stalls)) if len(stalls) else math.nan,
        "stall_p95_s": float(np.percentile(stalls, 95)) if len(stalls) else math.nan,
        "stall_max_s": float(stalls.max()) if len(stalls) else math.nan,
        "participating_median_s": float(kills["participating"].median()) if len(kills) else math.nan,
        "evictions": live_evictions(events),
        "survivor_steps_discarded": analysis.survivor_steps(events)[1],
        "load_median": statistics.median(loads) if loads else os.getloadavg()[0],
        "load_max": max(loads) if loads else os.getloadavg()[0],
        "beside": beside,
        "wall_s": time.time() - t0,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
        "mtbf_s": mtbf_s,
    }
    if other is not None:
        other_events = other.event_records()
        out["beside_evictions"] = live_evictions(other_events)
        out["beside_discarded"] = analysis.survivor_steps(other_events)[1]
        out["beside_steps"] = sum(1 for e in other_events if e["kind"] == "step" and e.get("committed"))
    log(
        f"  hb {out['hb_ms']} ms: {out['faults']} kills, stall median {out['stall_median_s']:.3f} s "
        f"p95 {out['stall_p95_s']:.3f} s, evictions {len(out['evictions'])} (+{len(out.get('beside_evictions', []))}"
        f" beside), load median {out['load_median']:.1f}"
    )
    return out


def _row(m: dict) -> str:
    beside = (
        f"{len(m['beside_evictions'])} | {m['beside_discarded']} of {m['beside_steps']}"
        if "beside_evictions" in m
        else "- | -"
    )
    return (
        f"| {m['hb_ms']} | {m['minutes']:g} | {m['faults']} | {m['stall_median_s']:.3f} | {m['stall_p95_s']:.3f} | "
        f"{m['stall_max_s']:.3f} | {len(m['evictions'])} | {beside} | {m['load_median']:.1f} / {m['load_max']:.1f} |"
    )


HEADER = [
    "| heartbeat timeout (ms) | minutes | kills | survivor stall median (s) | p95 (s) | max (s) | evictions of live "
    "groups | evictions beside | steps voted down beside (of committed) | load median / max |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def render(m: dict) -> list[str]:
    return [
        "## Survivor stall under chaos (the demo at its default config)",
        "",
        f"`python -m bench.stall --minutes {m['minutes']:g} --mtbf {m.get('mtbf_s', 30):g}` (started "
        f"{m.get('started', '?')}): the demo (`lighthouse.heartbeat_timeout_ms` {m['hb_ms']}"
        + (f", `torchft.pg_timeout_ms` {m['pg_timeout_ms']}" if m.get("pg_timeout_ms") else "")
        + ") under chaos, a SIGKILL of group 1 or 2 every "
        f"~{m.get('mtbf_s', 30):g} s, beside it: "
        + ("a second demo run, fault-free. " if m["beside"] == "demo" else "nothing. ")
        + "A survivor's stall: its longest gap around the kill beyond its median step. An eviction of a live group: "
        "a quorum without a group whose process was alive and unfaulted (`analysis.evictions`).",
        "",
        *HEADER,
        _row(m),
        "",
        f"Every stall (s): {', '.join(f'{s:.2f}' for s in m['stalls'])}. Kill → participating median "
        f"{m['participating_median_s']:.2f} s.",
    ]


def render_sweep(ms: list[dict]) -> list[str]:
    return [
        "## Survivor stall against the heartbeat timeout (how the default was chosen)",
        "",
        f"`python -m bench.stall --minutes {ms[0]['minutes']:g} --mtbf {ms[0].get('mtbf_s', 30):g} --hb H --save DIR` "
        f"for H in {', '.join(str(m['hb_ms']) for m in ms)} (one after the other, the first started "
        f"{min(m.get('started', '?') for m in ms)}), then `--render-sweep DIR`: one chaos run of the demo per "
        "`lighthouse.heartbeat_timeout_ms` (`torchft.pg_timeout_ms` unset: then the same), a SIGKILL of group 1 or 2 "
        f"every ~{ms[0].get('mtbf_s', 30):g} s, a second demo run training beside each, fault-free.",
        "",
        *HEADER,
        *(_row(m) for m in ms),
    ]


def write(out: Path, name: str, lines: list[str]) -> None:
    from bench import algorithms

    begin, end = f"<!-- bench.{name}: begin -->", f"<!-- bench.{name}: end -->"
    algorithms.write_section(out, "\n".join([begin, *lines, end]) + "\n", begin, end)


def _save(folder: Optional[str], m: dict) -> None:
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{m['hb_ms']}.json").write_text(json.dumps(m, indent=1))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.stall", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--hb", type=int, default=None, help="lighthouse.heartbeat_timeout_ms (default: the spec's)")
    ap.add_argument("--sweep", default=None, help="comma-separated heartbeat timeouts (ms), one run each")
    ap.add_argument("--beside", choices=("demo", "none"), default="demo")
    ap.add_argument("--mtbf", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--save", default=None, help="write each run's figures to DIR/<hb>.json instead of a section")
    ap.add_argument("--render-sweep", default=None, help="write the sweep section from DIR/*.json and exit")
    ap.add_argument("--render-run", default=None, help="write the run's section from a saved FILE.json and exit")
    args = ap.parse_args(argv)
    if args.render_run:
        write(Path(args.out), "stall", render(json.loads(Path(args.render_run).read_text())))
        return 0
    if args.render_sweep:
        saved = [json.loads(p.read_text()) for p in Path(args.render_sweep).glob("*.json")]
        write(Path(args.out), "stall_sweep", render_sweep(sorted(saved, key=lambda m: m["hb_ms"])))
        return 0
    os.nice(10)
    with tempfile.TemporaryDirectory(prefix="wb-bench-stall-") as tmp:
        if args.sweep:
            ms = [
                measure(args.minutes, Path(tmp), int(hb), args.beside, args.mtbf, args.seed)
                for hb in args.sweep.split(",")
            ]
            for m in ms:
                _save(args.save, m)
            if not args.no_write and not args.save:
                write(Path(args.out), "stall_sweep", render_sweep(ms))
            return 0
        m = measure(args.minutes, Path(tmp), args.hb, args.beside, args.mtbf, args.seed)
        print("evictions:", m["evictions"], "beside:", m.get("beside_evictions"))
        _save(args.save, m)
        if not args.no_write and not args.save:
            write(Path(args.out), "stall", render(m))
        return 1 if m["evictions"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
