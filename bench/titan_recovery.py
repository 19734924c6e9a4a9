"""TorchTitan kill → participating, and where the replacement's seconds go (``--only titan_recovery``).

``python -m bench.titan_recovery [--config titan-cpu] [--kills 6] [--every 15]``: ``configs/titan-cpu.yaml``
(two groups of the llama3 debug model on this machine's CPU, one node; ``--config titan-cpu-light``: the
classroom's tiny Llama, several steps a second) with replica 1 SIGKILLed every ``every`` seconds,
``kills`` times, for each variant: one rank per group with its ranks forked warm from the job (the
default, ``trainers/forked.py``), two ranks per group forked warm, one rank per group with a hot spare (a
job started and ready before the kill takes the group over: ``titan/spare.py``), and one rank per group exec'd as fresh
interpreters (``WORKBENCH_TITAN_WARM_RANKS=0``, the path before warm ranks, for comparison). Per kill the
recovery timeline's kill → participating and the replacement's phases
(``workbench.analysis.phases``): seconds after the kill to its start, imports, config, distributed
rendezvous, model built, trainer built, first quorum, heal and first participating step. The 1-minute load
average is read at each run's start and end, and each row names its config. ``measure`` returns the rows,
``render`` the report's lines; ``measure_section`` is what ``make bench`` runs: every variant on
``titan-cpu``, then the hot spare and the warm relaunch on ``titan-cpu-light``.
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
from workbench.analysis.phases import phase_medians, replacement_phases

VARIANTS = {  # name -> (nproc_per_replica, WORKBENCH_TITAN_WARM_RANKS, spares)
    "1 rank/group, warm": (1, "1", 0),
    "2 ranks/group, warm": (2, "1", 0),
    "1 rank/group, hot spare": (1, "1", 1),
    "1 rank/group, exec": (1, "0", 0),
}
TARGETS = {"1 rank/group, warm": 5.0, "2 ranks/group, warm": 8.0, "1 rank/group, hot spare": 2.0}  # seconds
FIRST_KILL_S = 20.0
CONFIG = "titan-cpu"
# The classroom's config, several steps a second: where a spare's gain is not hidden behind two slow steps.
CLASSROOM = ("titan-cpu-light", ("1 rank/group, hot spare", "1 rank/group, warm"))
META = ["config", "variant", "run_dir", "load_start", "load_end"]


def one(variant: str, kills: int, every: float, root: Path, config: str = CONFIG) -> pd.DataFrame:
    nproc, warm, spares = VARIANTS[variant]
    os.environ["WORKBENCH_TITAN_WARM_RANKS"] = warm
    os.environ["WORKBENCH_RUN_ROOT"] = str(root)
    faults = [{"action": "kill", "target": 1, "at_s": FIRST_KILL_S + i * every} for i in range(kills)]
    load = os.getloadavg()[0]
    run = wb.submit(config, {"steps": 100_000, "nproc_per_replica": nproc, "spares": spares, "faults": faults})
    try:
        deadline = time.time() + FIRST_KILL_S + kills * every + 240
        while time.time() < deadline and run.state() not in ("completed", "failed", "stopped"):
            timeline = analysis.recovery_timeline(run.event_records())
            if len(timeline) >= kills and timeline["participating"].notna().sum() >= kills:
                break
            time.sleep(2.0)
    finally:
        run.stop(timeout=30)
    events = run.event_records()
    frame = replacement_phases(events, analysis.recovery_timeline(events))
    return frame.assign(
        config=config, variant=variant, run_dir=str(run.run_dir), load_start=load, load_end=os.getloadavg()[0]
    )


def measure(
    kills: int = 6, every: float = 15.0, root: Path | None = None, variants=None, config: str = CONFIG
) -> pd.DataFrame:
    old = {k: os.environ.get(k) for k in ("WORKBENCH_TITAN_WARM_RANKS", "WORKBENCH_RUN_ROOT")}
    frames = []
    try:
        with tempfile.TemporaryDirectory(prefix="wb-bench-titan-") as tmp:
            for variant in variants or VARIANTS:
                frames.append(one(variant, kills, every, Path(root or tmp), config))
                print(f"[titan recovery] {config}, {variant}:\n{frames[-1].round(2).to_string()}", flush=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return pd.concat(frames, ignore_index=True)


def measure_section(kills: int = 6, every: float = 15.0, root: Path | None = None) -> pd.DataFrame:
    """The report's section (``make bench``): every variant on ``titan-cpu``, then the classroom config's."""
    config, variants = CLASSROOM
    return pd.concat(
        [measure(kills, every, root), measure(kills, every, root, variants=variants, config=config)], ignore_index=True
    )


def render(df: pd.DataFrame) -> list[str]:
    df = df.assign(config=df["config"].fillna(CONFIG)) if "config" in df else df.assign(config=CONFIG)
    df = df.assign(row=df["variant"] + " · " + df["config"])
    lines = [
        "## TorchTitan kill → participating, and where the seconds go (local backend, one node)",
        "",
        "`configs/titan-cpu.yaml` (two groups of the llama3 debug model, CPU) or `configs/titan-cpu-light.yaml` "
        "(the classroom's tiny Llama, several steps a second), as each row's config says, replica 1 SIGKILLed "
        "every 15 s; per variant the medians over its kills of each milestone, in seconds after the kill (Δ: from "
        "the milestone before). *warm*: the job forks its ranks from itself, forked warm by the fork server "
        "(`trainers/forked.py`); *exec*: each rank a fresh interpreter (`WORKBENCH_TITAN_WARM_RANKS=0`). "
        "The healing step takes no part (torchft's asynchronous quorum counts only the groups at the newest "
        "step), and a step counts at its commit, so participating is the heal plus about two steps.",
        "",
        "| variant | config | kills | kill → participating: median | max | target | warm | load (start–end) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (variant, config), g in df.groupby(["variant", "config"], sort=False):
        done = g["participating"].dropna()
        target = TARGETS.get(str(variant))
        lines.append(
            f"| {variant} | {config} | {len(done)} of {len(g)} | {done.median():.2f} | {done.max():.2f} | "
            f"{'≤ %g' % target if target else '–'} | {', '.join(sorted({str(w) for w in g['warm'].dropna()}))} | "
            f"{g['load_start'].median():.2f}–{g['load_end'].median():.2f} |"
        )
    lines += ["", "| milestone | " + " | ".join(f"{v} (Δ)" for v in df["row"].unique()) + " |"]
    lines.append("|---|" + "---|" * df["row"].nunique())
    medians = {v: phase_medians(g.drop(columns=[*META, "row"])) for v, g in df.groupby("row", sort=False)}
    milestones = list(dict.fromkeys(m for f in medians.values() for m in f["milestone"]))
    for m in milestones:
        cells = []
        for f in medians.values():
            r = f[f["milestone"] == m]
            ok = not r.empty and r["n"].iloc[0] > 0
            cells.append(f"{r['median_s'].iloc[0]:.2f} ({r['delta_s'].iloc[0]:+.2f})" if ok else "–")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Where the seconds after the kill go. (1) The first quorum (`quorum_done`) forms about 1 s after the "
        "kill however early the replacement is ready: torchft's lighthouse (`quorum_compute`) holds it until the "
        "dead group's last heartbeat is `heartbeat_timeout_ms` (1000) old or the survivor has waited "
        "`join_timeout_ms` (1000) since it joined, so a spare gains on a warm relaunch only what the relaunch "
        "needs beyond that second. (2) The heal: hundredths of a second on one node. (3) The two steps named "
        "above, `heal_done` to `participating`: over a second on `titan-cpu`, so a spare's ≤ 2 s is out of "
        "reach there whatever it saves; about a tenth on `titan-cpu-light`.",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.titan_recovery", description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=CONFIG, help="a shipped config, run by name (default: %(default)s)")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--every", type=float, default=15.0)
    ap.add_argument("--variant", action="append", choices=list(VARIANTS), help="only these (default: all)")
    ap.add_argument("--root", type=Path, help="keep the runs under this run root (default: a temporary one)")
    args = ap.parse_args(argv)
    t0 = time.time()
    df = measure(args.kills, args.every, variants=args.variant, config=args.config, root=args.root)
    print("\n".join(render(df)))
    print(f"({time.time() - t0:.0f} s)")
    return 0 if df["participating"].notna().all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
