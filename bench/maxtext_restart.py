"""MaxText restart → first step on the local backend, one process: warm (a standby) against cold, with its phases.

``python -m bench.maxtext_restart [--kills 5]``: one ``maxtext-cpu-tiny`` run with the standby (the default) and
one with ``WORKBENCH_MAXTEXT_STANDBY=0`` (cold: a fresh interpreter per attempt), back to back; each is killed
``kills`` times (SIGKILL of the job, ``Run.kill``), every kill ``SETTLE_S`` after the attempt's first step (the
standby for the next attempt starts at that step and imports for about 5 s). Per kill, the replacement's phases in
seconds after the kill (:func:`workbench.analysis.phases.replacement_phases`: job started, MaxText launched, its
interpreter up, imports done, JAX backend ready, restore done (``heal_done``), train step compiled, first step
(``participating``)), with the compile-cache hits of the ``compiled`` phase and the 1-minute load average at the
kill. ``measure`` returns the rows, ``render`` the report's lines (medians per variant).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import pandas as pd

import workbench as wb
from workbench import analysis
from workbench.analysis.phases import replacement_phases

SETTLE_S = 10.0
VARIANTS = {"standby (warm)": "1", "cold": "0"}
PHASES = (
    "replacement_started",
    "launched",
    "interpreter_up",
    "imports_done",
    "backend_ready",
    "heal_done",
    "compiled",
    "participating",
)


def _phase(run, name: str, attempt: int):
    return next(
        (e for e in run.events_read if e["kind"] == "phase" and e["phase"] == name and e.get("attempt") == attempt),
        None,
    )


def one(variant: str, kills: int, root: Path) -> pd.DataFrame:
    old = os.environ.get("WORKBENCH_MAXTEXT_STANDBY")
    os.environ["WORKBENCH_MAXTEXT_STANDBY"] = VARIANTS[variant]
    try:
        run = wb.submit("maxtext-cpu-tiny", ["steps=1000000", f"max_restarts={kills + 2}", f"run_root={root}"])
    finally:
        if old is None:
            os.environ.pop("WORKBENCH_MAXTEXT_STANDBY", None)
        else:
            os.environ["WORKBENCH_MAXTEXT_STANDBY"] = old
    loads = []
    try:
        for attempt in range(kills):
            run.wait_for(lambda r: _phase(r, "first_step", attempt), timeout=300)
            first = _phase(run, "first_step", attempt)["t"]
            run.wait_for(lambda r: max((e["t"] for e in r.events_read), default=0) >= first + SETTLE_S, 120)
            loads.append(os.getloadavg()[0])
            run.kill(0)
        run.wait_for(lambda r: _phase(r, "first_step", kills), timeout=300)
    finally:
        run.stop(timeout=60)
    events = run.event_records()
    timeline = analysis.recovery_timeline(events)
    df = replacement_phases(events, timeline)
    compiled = {e.get("attempt"): e for e in events if e.get("kind") == "phase" and e.get("phase") == "compiled"}
    df["compile_cache_hits"] = [compiled.get(a, {}).get("compile_cache_hits") for a in df["attempt"]]
    df["compile_cache_misses"] = [compiled.get(a, {}).get("compile_cache_misses") for a in df["attempt"]]
    df["load_1m"] = loads[: len(df)]
    df["variant"] = variant
    df["run_dir"] = str(run.run_dir)
    return df


def measure(kills: int = 5, root: Path | None = None) -> pd.DataFrame:
    with tempfile.TemporaryDirectory(prefix="wb-bench-maxtext-") as tmp:
        frames = []
        for variant in VARIANTS:
            frames.append(one(variant, kills, Path(root or tmp)))
            print(f"[maxtext restart] {variant}:\n{frames[-1][[*PHASES, 'warm', 'load_1m']]}", flush=True)
    return pd.concat(frames, ignore_index=True)


def render(df: pd.DataFrame) -> list[str]:
    cols = [c for c in PHASES if c in df.columns]
    med = df.groupby("variant", sort=False)[[*cols, "load_1m"]].median()
    n = df.groupby("variant", sort=False).size()
    warm = df.groupby("variant", sort=False)["warm"].apply(lambda w: int(w.fillna(False).astype(bool).sum()))
    hits = df.groupby("variant", sort=False)["compile_cache_misses"].apply(lambda m: int((m.fillna(1) == 0).sum()))
    lines = [
        "## MaxText restart → first step (local backend, one process)",
        "",
        "`maxtext-cpu-tiny` killed (SIGKILL of the job) every "
        f"{SETTLE_S:.0f} s after each attempt's first step; the controller relaunches it and MaxText restores "
        "its last checkpoint. Medians per kill, seconds after the kill; `load` the median 1-minute load average "
        "at the kills. *Standby*: the attempt's MaxText is forked from an interpreter that imported jax and "
        "MaxText before the kill (`trainers/maxtext/standby.py`); *cold*: a fresh interpreter "
        "(`WORKBENCH_MAXTEXT_STANDBY=0`). Both compile from the run's persistent compilation cache "
        "(`jax_cache_dir`, every compile cached).",
        "",
        "| variant | kills | warm | all-hit compiles | " + " | ".join(cols) + " | load |",
        "|---|---|---|---|" + "---|" * len(cols) + "---|",
    ]
    for variant, r in med.iterrows():
        lines.append(
            f"| {variant} | {n[variant]} | {warm[variant]} | {hits[variant]} | "
            + " | ".join(f"{r[c]:.2f}" for c in cols)
            + f" | {r['load_1m']:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.maxtext_restart", description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=5)
    args = ap.parse_args(argv)
    df = measure(args.kills)
    print("\n".join(render(df)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
