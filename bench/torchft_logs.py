"""The per-step cost of routing torchft's structured logs into the event log, and what it loses.

``python -m bench.torchft_logs [--reps N] [--window S]`` (also a section of ``python -m bench``).
torchft-lite with ``torchft.structured_logs`` on and off, back to back and
interleaved (on, off, on, off, ...), each a fault-free window after its first
committed step. The cost is in ``step_time_s``: the commit record is written
inside ``should_commit``, which the trainer's step timer spans (the quorum
record is written on torchft's quorum thread, overlapping the forward pass).
Per run: the median step time of committed, participating steps, the load
average at its start (``uptime``'s three numbers), and with the route on,
how many committed steps have no commit record (lost; should be 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from .sessions import TORCHFT, Variant, interleaved

ROUTE_OFF = Variant("torchft-lite structured_logs=false", {"trainer": "torchft-lite", "torchft.structured_logs": False})


def _lost(events: list[dict]) -> tuple[int, int]:
    """(committed steps, committed steps without their commit record) of one run."""
    voted = {
        (e["replica"], e["attempt"], e["step"] + 1)
        for e in events
        if e.get("kind") == "commit" and e.get("commit_result")
    }
    committed = [
        (e["replica"], e["attempt"], e["step"]) for e in events if e.get("kind") == "step" and e.get("committed")
    ]
    return len(committed), sum(1 for c in committed if c not in voted)


def measure(reps: int, window_s: float, root: Path, log=print) -> dict:
    rows = []
    for rec in interleaved([TORCHFT, ROUTE_OFF], reps, window_s, root, log):
        steps = [
            e["step_time_s"]
            for e in rec.events
            if e.get("kind") == "step"
            and e.get("committed")
            and e.get("participating", True)
            and e.get("step_time_s") is not None
        ]
        committed, lost = _lost(rec.events)
        rows.append(
            {
                "variant": rec.variant,
                "route": rec.variant == TORCHFT.name,
                "loadavg": rec.loadavg,
                "steps": len(steps),
                "median_step_s": statistics.median(steps) if steps else None,
                "commit_records": sum(1 for e in rec.events if e.get("kind") == "commit"),
                "committed": committed,
                "lost": lost if rec.variant == TORCHFT.name else None,
                "error": rec.error,
            }
        )
    on = [r["median_step_s"] for r in rows if r["route"] and r["median_step_s"]]
    off = [r["median_step_s"] for r in rows if not r["route"] and r["median_step_s"]]
    on_m, off_m = (statistics.median(on) if on else None), (statistics.median(off) if off else None)
    return {
        "reps": reps,
        "window_s": window_s,
        "runs": rows,
        "median_on_s": on_m,
        "median_off_s": off_m,
        "cost_s": on_m - off_m if on_m and off_m else None,
        "lost": sum(r["lost"] or 0 for r in rows if r["route"]),
        "uptime": _uptime(),
        "record": record_cost(),
    }


def record_cost(n: int = 20_000) -> dict:
    """Seconds per record through the handler (``logger.info`` → one event line written and flushed),
    and per record with the route off (torchft's loggers at their default level: dropped), median of 5."""
    from workbench.events.writer import EventWriter
    from workbench.trainers.torchft.logs import TorchftLogHandler

    logger = logging.getLogger("torchft_commits")
    extra = {
        "job_id": "unknown",
        "replica_id": "replica_0:uuid",
        "rank": 0,
        "quorum_id": 3,
        "step": 1,
        "commit_result": True,
    }

    def per_record() -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            logger.info("", extra=extra)
        return (time.perf_counter() - t0) / n

    off = statistics.median(per_record() for _ in range(5))
    with tempfile.TemporaryDirectory(prefix="wb-bench-logs-") as tmp:
        handler = TorchftLogHandler(EventWriter(tmp, "replica-0.attempt-0", run="bench", replica=0)).install()
        try:
            on = statistics.median(per_record() for _ in range(5))
        finally:
            handler.uninstall()
            handler.writer.close()
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
    return {"on_s": on, "off_s": off, "records": n}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def lines(res: dict) -> list[str]:
    ms = lambda s: "n/a" if s is None else f"{s * 1e3:.2f} ms"
    out = [
        "",
        "## torchft's structured logs as events: per-step cost",
        "",
        f"torchft-lite (3 groups), `torchft.structured_logs` on / off, {res['reps']} interleaved pairs of "
        f"{res['window_s']:g} s windows. Median step time of committed steps: on **{ms(res['median_on_s'])}**, "
        f"off **{ms(res['median_off_s'])}**, difference {ms(res['cost_s'])}; committed steps without their "
        f"commit record: **{res['lost']}**. `uptime` after: `{res['uptime']}`.",
        "",
        f"One record through the handler (`logger.info` → one event line, written and flushed): "
        f"**{res['record']['on_s'] * 1e6:.1f} µs** (route off: {res['record']['off_s'] * 1e6:.2f} µs, dropped at "
        f"the logger's level); per torchft-lite step that is one commit record plus a quorum record per "
        f"quorum change.",
        "",
        "| run | route | load (1, 5, 15 min) at start | committed steps | commit records | median step |",
        "|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(res["runs"]):
        out.append(
            f"| {i + 1} | {'on' if r['route'] else 'off'} | {', '.join(f'{x:.2f}' for x in r['loadavg'])} | "
            f"{r['committed']} | {r['commit_records']} | {ms(r['median_step_s'])} |"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.torchft_logs", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=float, default=20.0, help="seconds of training per run")
    args = ap.parse_args(argv)
    os.nice(10)  # the machine is shared, as in python -m bench
    with tempfile.TemporaryDirectory(prefix="wb-bench-logs-") as tmp:
        res = measure(args.reps, args.window, Path(tmp))
    print("\n".join(lines(res)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
