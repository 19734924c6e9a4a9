"""How fast a semi-synchronous round gets over a fault: the speed figures tests/test_algorithms.py only bounds.

``python -m bench.syncfaults [--reps 3]`` (``make bench``: ``python -m bench --only syncfaults``). Per repetition:

- ``kill_in_allreduce`` with ``torchft.drop_failed_pg``: four DiLoCo groups (``sync_every`` 10,
  ``pg_timeout_ms`` 20000); group 3 is held before its sync's all-reduce and SIGKILLed while the other three
  wait inside it. Seconds from the kill to each survivor's sync event (the round voted down): "every
  survivor leaves at once" (0.02-0.10 s measured on an idle machine), where without the drop the third
  waits out the 20 s timeout. The test asserts under a quarter of that timeout, which a loaded machine keeps.
- ``ft.catch_up``: three DiLoCo groups (``sync_every`` 40, steps of ~0.1 s); group 2 is stopped (SIGSTOP)
  for 2 s five steps into a window. Seconds its peers spent in their next sync, with and without
  ``catch_up``, beside their median sync before the stop: with it, a normal sync's time (under 1 s, the
  lighthouse's heartbeat timeout); without, about the 2 s group 2 is behind. The test tells the two
  apart at 1.5 s.

Each run is stopped by its controller, and whatever it left killed by PID. The 1-minute load average at
each run's start is beside its figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd

import workbench as wb

DROP = [
    "replicas=4",
    "min_replicas=2",
    "ft.sync_every=10",
    "torchft.pg_timeout_ms=20000",
    "torchft.drop_failed_pg=true",
    "steps=100000",
    "faults=[]",
]
CATCH_UP = [
    "ft.algorithm=diloco",
    "ft.sync_every=40",
    "replicas=3",
    "min_replicas=2",
    "model.step_delay_s=0.1",
    "heartbeat_s=0.3",
    "torchft.pg_timeout_ms=8000",
    "steps=100000",
    "faults=[]",
]


def _syncs(run, replicas, after=None, together=None) -> list[dict]:
    return [
        e
        for e in run.events_read
        if e["kind"] == "sync"
        and e.get("replica") in replicas
        and (after is None or e["t"] > after)
        and (together is None or (e.get("committed") and e.get("participants") == together and not e.get("join")))
    ]


def _finish(run) -> None:
    try:
        run.stop(timeout=20)
    finally:
        for pid in run.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def drop_failed_pg() -> dict:
    load = os.getloadavg()[0]
    run = wb.submit("algorithms", DROP)
    try:
        run.wait_for(lambda r: all(len(_syncs(r, (g,), together=4)) >= 2 for g in range(4)), timeout=300)
        run.kill(replica=3, how="kill_in_allreduce")
        killed = lambda r: [e for e in r.events_read if e["kind"] == "fault" and e.get("action") == "kill_in_allreduce"]
        run.wait_for(killed, timeout=60)
        fault = killed(run)[0]
        run.wait_for(lambda r: all(_syncs(r, (g,), after=fault["t"]) for g in range(3)), timeout=120)
        left = sorted(_syncs(run, (g,), after=fault["t"])[0]["t"] - fault["t"] for g in range(3))
    finally:
        _finish(run)
    return {
        "what": "kill_in_allreduce, drop_failed_pg",
        "load_1m": load,
        "last_left_s": left[-1],
        "first_left_s": left[0],
    }


def catch_up(on: bool) -> dict:
    load = os.getloadavg()[0]
    run = wb.submit("algorithms", [*CATCH_UP, f"ft.catch_up={str(on).lower()}"])
    try:
        run.wait_for(lambda r: len(_syncs(r, (0, 1, 2), together=3)) >= 3, timeout=300)
        n = len(run.events_read)
        run.wait_for(
            lambda r: any(
                e["kind"] == "step" and e.get("replica") == 2 and e["step"] % 40 == 5 for e in r.events_read[n:]
            ),
            timeout=60,
        )
        normal = statistics.median(e["seconds"] for e in _syncs(run, (0, 1), together=3))
        fault = run.kill(replica=2, how="hang", seconds=2)
        after = lambda r: [s for s in _syncs(r, (0, 1, 2), together=3) if s["t"] > fault["t"] + 2]
        run.wait_for(lambda r: {s["replica"] for s in after(r)} == {0, 1, 2}, timeout=120)
        first: dict = {}
        for s in after(run):
            first.setdefault(s["replica"], s)
    finally:
        _finish(run)
    return {
        "what": f"stopped 2 s mid-window, catch_up={str(on).lower()}",
        "load_1m": load,
        "peers_in_next_sync_s": max(first[r]["seconds"] for r in (0, 1)),
        "normal_sync_s": normal,
    }


def measure(reps: int = 3, root: Path | None = None) -> pd.DataFrame:
    old = os.environ.get("WORKBENCH_RUN_ROOT")
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="wb-bench-syncfaults-") as tmp:
            os.environ["WORKBENCH_RUN_ROOT"] = str(root or tmp)
            for i in range(reps):
                for one in (drop_failed_pg, lambda: catch_up(True), lambda: catch_up(False)):
                    rows.append({"rep": i, **one()})
                    print(f"[sync faults] {rows[-1]}", flush=True)
    finally:
        if old is None:
            os.environ.pop("WORKBENCH_RUN_ROOT", None)
        else:
            os.environ["WORKBENCH_RUN_ROOT"] = old
    return pd.DataFrame(rows)


def render(df: pd.DataFrame) -> list[str]:
    med = df.groupby("what", sort=False).median(numeric_only=True)
    fmt = lambda v: "" if pd.isna(v) else f"{v:.2f}"
    lines = [
        "## Faults in a semi-synchronous round (DiLoCo)",
        "",
        f"Medians over {df.groupby('what').size().min()} runs each; seconds; `load` the 1-minute load average at "
        "each run's start. A kill inside the sync's all-reduce with `torchft.drop_failed_pg`: kill → each "
        "survivor out of the round (first and last of three; without the drop the last waits out the 20 s "
        "`pg_timeout_ms`). A group stopped 2 s mid-window: its peers' time in their next sync, beside their "
        "median sync before the stop.",
        "",
        "| case | first survivor out | last survivor out | peers in next sync | normal sync | load |",
        "|---|---|---|---|---|---|",
    ]
    for what, r in med.iterrows():
        cells = [r.get(c) for c in ("first_left_s", "last_left_s", "peers_in_next_sync_s", "normal_sync_s")]
        lines.append(f"| {what} | " + " | ".join(fmt(v) for v in cells) + f" | {r['load_1m']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.syncfaults", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    t0 = time.time()
    df = measure(args.reps)
    print("\n".join(render(df)))
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
