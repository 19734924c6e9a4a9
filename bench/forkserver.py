"""The fork server against submitit's LocalExecutor: kill → participating, submit → first committed step.

``python -m bench.forkserver [--reps 3]``: the same torchft-lite demo spec (3 groups, replica 1
killed at step 60, no spare), run with ``WORKBENCH_FORK_SERVER=1`` and ``=0`` back to back,
alternating, ``reps`` times each; per run the recovery timeline's kill → participating (the
replacement is a fresh process either way: forked, or a new interpreter) and the run's
submit → first committed step (``analysis.summary``), with the 1-minute load average at
each run's start. ``measure`` returns the rows, ``render`` the report's lines.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

import workbench as wb
from workbench import analysis

SPEC = {"steps": 220, "faults": [{"action": "kill", "target": 1, "at_step": 60}], "spares": 0}
PATHS = {"fork server": "1", "submitit LocalExecutor": "0"}


def one(path: str, root: Path) -> dict:
    os.environ["WORKBENCH_FORK_SERVER"] = PATHS[path]
    os.environ["WORKBENCH_RUN_ROOT"] = str(root)
    load = os.getloadavg()[0]
    run = wb.submit("demo", SPEC)
    try:
        run.wait(300)
    finally:
        run.stop(timeout=20)
    events = run.event_records()
    timeline = analysis.recovery_timeline(events)
    summary = analysis.summary(events, run.spec, timeline)
    row = timeline.iloc[0] if len(timeline) else {}
    fault_t = next((e["t"] for e in events if e["kind"] == "fault"), None)
    ready = next(
        (
            e["t"]
            for e in events
            if e["kind"] == "phase"
            and e.get("phase") == "model_ready"
            and e.get("replica") == 1
            and e.get("attempt") == 1
        ),
        None,
    )
    return {
        "model_ready_s": None if None in (fault_t, ready) else ready - fault_t,
        "path": path,
        "run_dir": str(run.run_dir),
        "state": run.state(),
        "load_1m": load,
        "kill_to_participating_s": row.get("participating"),
        "replacement_started_s": row.get("replacement_started"),
        "imports_done_s": row.get("imports_done"),
        "submit_to_first_step_s": summary["submit_to_first_step_s"],
    }


def measure(reps: int = 3, root: Path | None = None) -> pd.DataFrame:
    old = {k: os.environ.get(k) for k in ("WORKBENCH_FORK_SERVER", "WORKBENCH_RUN_ROOT")}
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="wb-bench-fork-") as tmp:
            for i in range(reps):
                for path in PATHS if i % 2 == 0 else reversed(list(PATHS)):
                    rows.append({"rep": i, **one(path, Path(root or tmp))})
                    print(f"[fork server] {rows[-1]}", flush=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return pd.DataFrame(rows)


def render(df: pd.DataFrame) -> list[str]:
    cols = [
        "kill_to_participating_s",
        "replacement_started_s",
        "imports_done_s",
        "model_ready_s",
        "submit_to_first_step_s",
    ]
    med = df.groupby("path")[cols + ["load_1m"]].median()
    lines = [
        "## Fork server vs submitit's LocalExecutor (local backend)",
        "",
        f"Medians over {df.groupby('path').size().min()} runs each, back to back (alternating); "
        "seconds; `load_1m` the median 1-minute load average at each run's start.",
        "",
        "| path | kill → participating | replacement started | imports done | model ready | "
        "submit → first step | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for path, r in med.iterrows():
        lines.append(f"| {path} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + f" | {r['load_1m']:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.forkserver", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    t0 = time.time()
    df = measure(args.reps)
    print("\n".join(render(df)))
    print(f"({time.time() - t0:.0f} s)")
    return 0 if (df["state"] == "completed").all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
