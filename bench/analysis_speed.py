"""How long ``analysis.summary`` + ``analysis.goodput`` take on a long run's log.

``python -m bench.analysis_speed [--events 100000] [--faults 20] [--module PATH]``
writes a synthetic torchft-lite-like log with a real :class:`EventWriter`
(3 replica groups stepping in lockstep, a ``commit`` and a ``step`` event per
group and step, heartbeats; kills, hangs and lighthouse kills spread evenly)
and prints the median of 5 timings, of the two called alone and of the two
given one precomputed timeline. ``--module`` times another copy of the
analysis (a file or package directory), for before/after comparisons.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import sys
import tempfile
import time
from pathlib import Path

from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.spec.load import load_spec

BASE = 1_700_000_000.0
DT = 0.05
REPLICAS = 3


def synthetic_log(run_dir: Path, events: int = 100_000, faults: int = 20) -> list[dict]:
    """A run of ``REPLICAS`` groups with ``faults`` faults (kill, hang, lighthouse_kill), about ``events`` events.

    A kill: the victim stops; the survivors' next step is voted down, then they form a quorum
    without it; its next attempt starts 1 s later, finishes imports at 2 s, rejoins at 3 s with a
    heal and one non-participating step. A hang: the same, but the process resumes after 2 s.
    A lighthouse kill: seen down at 0.2 s, up at 1 s; steps pause meanwhile.
    """
    ticks = int(events / (2 * REPLICAS + 0.15) * 1.02)  # + heartbeats, quorums; - the faults' gaps
    every = max(1, ticks // (faults + 1))
    control = EventWriter(run_dir, "control", run="s")
    controller = EventWriter(run_dir, "controller", run="s", role="controller")
    controller.emit("start", t=BASE - 5, role="controller")
    attempt = [0] * REPLICAS
    writers = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="s", replica=r, attempt=0) for r in range(REPLICAS)]
    for w in writers:
        w.emit("start", t=BASE - 3, trainer="torchft-lite", role="replica")
        w.emit("quorum", t=BASE - 1, quorum_id=0)
    down_until = [-1] * REPLICAS  # tick at which a down group rejoins
    healing = [False] * REPLICAS
    vote_down = False
    paused_until = -1
    step, quorum_id, n_fault = 0, 0, 0
    for k in range(ticks):
        t = BASE + k * DT
        if k == paused_until:
            paused_until = -1
        if paused_until > k:
            continue
        for r in range(REPLICAS):
            if down_until[r] == k:
                down_until[r] = -1
                healing[r] = True
                quorum_id += 1
                for w in writers:
                    w.emit("quorum", t=t - 0.01, quorum_id=quorum_id)
                writers[r].emit("heal", t=t - 0.005, step=step, seconds=0.004, bytes=4096)
        up = [r for r in range(REPLICAS) if down_until[r] < 0]
        participants = sum(1 for r in up if not healing[r])
        for r in up:
            w = writers[r]
            w.emit("commit", t=t, step=step, commit_result=not vote_down)
            w.emit(
                "step",
                t=t + 0.001 * (r + 1),
                step=step + (0 if vote_down else 1),
                loss=1.0,
                committed=not vote_down,
                participating=not healing[r],
                participants=participants,
                quorum_id=quorum_id,
                step_time_s=DT,
            )
            if k % 20 == 0:
                w.emit("heartbeat", t=t + 0.002, step=step)
        if vote_down:
            quorum_id += 1
            for r in up:
                writers[r].emit("quorum", t=t + 0.01, quorum_id=quorum_id)
        else:
            step += 1
        vote_down = False
        healing = [False] * REPLICAS
        if k and k % every == 0 and n_fault < faults:
            tf = t + 0.02
            action = "lighthouse_kill" if n_fault % 10 == 9 else "hang" if n_fault % 7 == 6 else "kill"
            target = 1 + n_fault % 2
            n_fault += 1
            if action == "lighthouse_kill":
                control.emit("fault", t=tf, action=action, target="lighthouse", origin="schedule")
                controller.emit("lighthouse", t=tf + 0.2, state="down")
                controller.emit("lighthouse", t=tf + 1.0, state="up", pid=1)
                paused_until = k + int(1.2 / DT)
                continue
            control.emit(
                "fault",
                t=tf,
                action=action,
                target=target,
                origin="schedule",
                seconds=2.0 if action == "hang" else None,
            )
            vote_down = True
            down_until[target] = k + int(3.0 / DT)
            if action == "hang":
                control.emit("fault", t=tf + 2.0, action="resume", target=target, origin="schedule")
                continue
            attempt[target] += 1
            controller.emit("restart", t=tf + 0.5, replica=target, attempt=attempt[target])
            writers[target] = EventWriter(
                run_dir, f"replica-{target}.attempt-{attempt[target]}", run="s", replica=target, attempt=attempt[target]
            )
            writers[target].emit("start", t=tf + 1.0, trainer="torchft-lite", role="replica")
            writers[target].emit("phase", t=tf + 2.0, phase="imports_done", seconds=1.0)
    return sorted(EventReader(run_dir).poll(), key=lambda e: e["t"])


def load_analysis(path: str | None):
    if path is None:
        from workbench import analysis

        return analysis
    p = Path(path)
    init = p / "__init__.py" if p.is_dir() else p
    spec = importlib.util.spec_from_file_location(
        "analysis_under_test", init, submodule_search_locations=[str(p)] if p.is_dir() else None
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.analysis_speed", description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--module", default=None, help="an analysis module file or package directory to time instead")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    analysis = load_analysis(args.module)
    spec = load_spec(trainer="torchft-lite", replicas=REPLICAS)
    with tempfile.TemporaryDirectory() as d:
        events = synthetic_log(Path(d), args.events, args.faults)
    n_faults = sum(1 for e in events if e["kind"] == "fault" and e.get("action") != "resume")

    def timed(run) -> list[float]:
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return times

    def shared():
        timeline = analysis.recovery_timeline(events)
        analysis.summary(events, spec, timeline)
        analysis.goodput(events, spec, timeline)

    results = {"summary + goodput": timed(lambda: (analysis.summary(events, spec), analysis.goodput(events, spec)))}
    if "timeline" in inspect.signature(analysis.goodput).parameters:
        results["timeline, then summary + goodput given it"] = timed(shared)
    for name, times in results.items():
        print(
            f"{len(events)} events, {n_faults} faults: {name}: median {statistics.median(times):.3f} s "
            f"(of {args.reps}: {', '.join(f'{x:.3f}' for x in times)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
