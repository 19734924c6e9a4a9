"""``python -m bench.classroom``: the classroom run under chaos and fault-free, back to back.

Prints (and writes as JSON with ``--json``): throughput retained (useful samples/s under chaos ÷
the same configuration's fault-free useful samples/s, each over the same window from its first
committed step), the faults injected, the groups, the final loss, the dead-group queue (peak, mean,
whether relaunch and spares kept up), memory (RSS, PSS, USS) and CPU per torchft-lite group, and
the dashboard's time for one update at 32 groups (median of repeated updates, kernel side: new
events read, folded, every panel and both plots rendered to their widget state).

``--pairs K`` runs K shorter pairs instead, interleaved: chaos then fault-free, then fault-free then
chaos, and so on (each chaos half with its own ``chaos.seed``), and reports the median of the pairs'
ratios. Two 25-minute halves run one after the other here differed by 16 % in median step time with no
fault in the slower one (docs/classroom.md): the machine's drift, not the faults, decided that ratio.
Alternating the order cancels a drift that is linear in time over each two pairs, and the median
keeps one disturbed pair from deciding the figure.

Each half also says where its steps went (``where_steps_went``): executed steps/s, how many were thrown
away and why, group-seconds blocked in syncs, the run's CPU; and the chaos half prices its faults
against itself (``fault_bins``: its 10 s bins with a fault against its other bins), which the drift
between halves does not move. A half runs on past its window until the window's last inner steps are
decided by their syncs (``window_decided``).

``--scale 8,16,24,32`` measures instead how the machine holds N groups: a short fault-free run at
each N, memory and CPU per group process, step time, useful samples/s.

The config is ``configs/classroom.yaml``. Its ``ft`` section (``ft.algorithm: diloco``) is dropped,
with a note, where this tree's spec has no ``ft`` section yet; ``--set ft.algorithm=ddp`` etc.
override it where it has.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import psutil

import workbench as wb
from workbench import analysis
from workbench.analysis.useful import decided
from workbench.analysis.wallclock import Replay, useful_rate
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec, load_yaml, parse_override
from workbench.spec.models import Spec
from workbench.trainers import trainer_kind

from .sessions import _stop

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "classroom.yaml"


def classroom_spec(overrides: dict, log=print) -> Spec:
    data = load_yaml(CONFIG)
    if "ft" in data and "ft" not in Spec.model_fields:
        log(f"note: this tree's spec has no `ft` section yet: dropped ft={data.pop('ft')} (per-step DDP)")
        overrides = {k: v for k, v in overrides.items() if not k.startswith("ft.")}
    return load_spec(data, overrides)


def _sample(run) -> dict:
    """Memory and CPU time of every live process of the run, by role."""
    run.refresh()
    st = run.run_state
    groups = {v.live_proc().pid for v in st.replicas.values() if v.live_proc() is not None}
    spares = {p.pid for p in st.spares.values()}
    out = {"group": [], "spare": [], "other": []}
    for p in st.processes():
        try:
            proc = psutil.Process(p.pid)
            mem = proc.memory_full_info()
            cpu = proc.cpu_times()
        except (psutil.Error, OSError):
            continue
        role = "group" if p.pid in groups else "spare" if p.pid in spares else "other"
        out[role].append(
            {
                "pid": p.pid,
                "rss": mem.rss,
                "pss": getattr(mem, "pss", None),
                "uss": mem.uss,
                "cpu_s": cpu.user + cpu.system,
            }
        )
    out["t"] = time.time()
    return out


SETTLE_S = 60.0


def window_decided(events: list[dict], end: float) -> bool:
    """Whether every semi-synchronous group that stepped in the last 30 s before ``end`` has synced
    since (or its attempt was replaced): a DiLoCo inner step is useful only once its process's next
    sync commits, so a run stopped at ``end`` would leave the window's last inner steps undecided, and
    where the window cut the sync schedule moved a half's figure by about 1 % (one 8-minute pair:
    1.12 % of the fault-free half's steps undecided, 0.08 % of the chaos half's). Always true for a
    per-step algorithm."""
    last: dict = {}
    synced, attempt = set(), {}
    for e in events:
        if e.get("kind") != "step":
            continue
        key = (e.get("replica"), e.get("attempt") or 0)
        attempt[key[0]] = max(attempt.get(key[0], 0), key[1])
        if "inner" not in e:
            continue
        if e["t"] <= end:
            last[key] = e["t"]
        elif e.get("inner") is False:
            synced.add(key)
    return all(k in synced or k[1] < attempt[k[0]] for k, t in last.items() if t > end - 30)


def run_window(spec: Spec, window_s: float, root: Path, log=print, startup_timeout: float = 300.0) -> dict:
    """Submit, wait for the first committed step, train for ``window_s`` and until the window's steps
    are decided (``window_decided``), stop; events and samples."""
    data = spec.to_dict()
    data["run_root"] = str(root)
    load = os.getloadavg()
    t_submit = time.time()
    run = wb.submit(data)
    error, samples = None, []
    try:
        run.wait_for(
            lambda r: analysis.max_committed_step(r.events_read) > 0 or r.state() in ("failed", "stopped"),
            timeout=startup_timeout,
        )
        first = min(e["t"] for e in run.events_read if e.get("kind") == "step" and e.get("committed"))
        for frac in (0.25, 0.75):  # CPU time between two samples; memory at the later one
            run.wait_for(
                lambda r: time.time() - first >= frac * window_s or r.state() in ("failed", "stopped"),
                timeout=window_s + startup_timeout,
            )
            samples.append(_sample(run))
        run.wait_for(
            lambda r: time.time() - first >= window_s or r.state() in ("failed", "stopped", "completed"),
            timeout=window_s + startup_timeout,
        )
        try:
            run.wait_for(
                lambda r: (
                    window_decided(r.events_read, first + window_s) or r.state() in ("failed", "stopped", "completed")
                ),
                timeout=SETTLE_S,
            )
        except TimeoutError:
            log(f"  the window's last inner steps not all decided {SETTLE_S:.0f} s after it; counted as they stand")
    except TimeoutError as e:
        error = str(e)
    finally:
        _stop(run)
    events = run.event_records()
    log(
        f"  {spec.replicas} groups, chaos {'on' if spec.chaos is not None or spec.faults else 'off'}: "
        f"{sum(1 for e in events if e['kind'] == 'step')} step events, "
        f"{sum(1 for e in events if e['kind'] == 'fault' and e.get('action') != 'resume')} faults, "
        f"{time.time() - t_submit:.0f} s wall" + (f", ERROR {error}" if error else "")
    )
    return {
        "spec": spec,
        "events": events,
        "samples": samples,
        "load": load,
        "error": error,
        "run_dir": str(run.run_dir),
        "window_s": window_s,
    }


def summarize(rec: dict) -> dict:
    spec, events, window = rec["spec"], rec["events"], rec["window_s"]
    batch = trainer_kind(spec.trainer).samples_per_step(spec)
    rate = useful_rate(events, batch, window)
    first = min((e["t"] for e in events if e.get("kind") == "step" and e.get("committed")), default=None)
    end = first + window if first is not None else None
    in_window = [e for e in events if end is None or e.get("t", 0) <= end]
    faults = [e for e in in_window if e.get("kind") == "fault" and e.get("action") != "resume"]
    last_loss: dict = {}
    for e in in_window:
        if (
            e.get("kind") == "step"
            and e.get("committed")
            and e.get("participating") is not False
            and isinstance(e.get("loss"), (int, float))
        ):
            last_loss[e.get("replica")] = e["loss"]
    steps = [e for e in in_window if e.get("kind") == "step" and isinstance(e.get("step_time_s"), (int, float))]
    replay = Replay(in_window, spec.replicas, spec.steps, batch)
    out = {
        "groups": spec.replicas,
        "spares": spec.spares,
        "window_s": window,
        "useful_samples": rate["samples"],
        "useful_samples_per_s": rate["rate"],
        "faults": len(faults),
        "fault_kinds": {
            k: sum(1 for f in faults if f.get("action") == k) for k in sorted({f.get("action") for f in faults})
        },
        "final_loss_median": statistics.median(last_loss.values()) if last_loss else None,
        "step_time_s_median": statistics.median(e["step_time_s"] for e in steps) if steps else None,
        "restarts": sum(1 for e in in_window if e.get("kind") == "restart"),
        "backlog": replay.timeline.backlog(),
        "loadavg_at_start": rec["load"],
        "error": rec["error"],
        "steps": where_steps_went(events, first, window),
    }
    if len(rec["samples"]) == 2:
        a, b = rec["samples"]
        dt = b["t"] - a["t"]
        cpu_a = {p["pid"]: p["cpu_s"] for p in a["group"]}
        cpu = [(p["cpu_s"] - cpu_a[p["pid"]]) / dt for p in b["group"] if p["pid"] in cpu_a]
        mib = 2**20
        out["memory"] = {
            "group_rss_mib_median": statistics.median(p["rss"] / mib for p in b["group"]) if b["group"] else None,
            "group_pss_mib_median": statistics.median(p["pss"] / mib for p in b["group"] if p["pss"])
            if b["group"]
            else None,
            "group_uss_mib_median": statistics.median(p["uss"] / mib for p in b["group"]) if b["group"] else None,
            "run_pss_mib_total": sum((p["pss"] or p["rss"]) for role in ("group", "spare", "other") for p in b[role])
            / mib,
            "group_cpu_cores_median": statistics.median(cpu) if cpu else None,
            "run_cpu_cores_total": sum(cpu) if cpu else None,
            "processes": {role: len(b[role]) for role in ("group", "spare", "other")},
        }
    return out


def where_steps_went(events: list[dict], first: Optional[float], window_s: float) -> dict:
    """Every inner and sync step executed in the window, by fate: useful (its sync committed), lost
    because its process died before its next sync, voted down, not participating, or undecided when the
    log ends; and what the machine did meanwhile: group-seconds blocked in syncs (by part), the run's
    CPU (the controller's ``node_health``), and CPU per executed step. Compared with the fault-free
    half it says whether chaos cost executed work (the CPU idle or busy with something other than steps)
    or only threw finished work away. ``first``: the window's start, the first committed step."""
    if first is None:
        return {}
    end = first + window_s
    last_attempt: dict = {}
    for e in events:
        if e.get("kind") == "step":
            last_attempt[e.get("replica")] = max(last_attempt.get(e.get("replica"), 0), e.get("attempt") or 0)
    fate = {"useful": 0, "died_before_sync": 0, "voted_down": 0, "not_participating": 0, "undecided_at_end": 0}
    for e in decided(events):
        if e.get("kind") != "step" or not first <= e.get("t", 0) <= end:
            continue
        if e.get("committed"):
            fate["useful"] += 1
        elif e.get("participating") is False:
            fate["not_participating"] += 1
        elif e.get("undecided"):
            died = (e.get("attempt") or 0) < last_attempt[e.get("replica")]
            fate["died_before_sync" if died else "undecided_at_end"] += 1
        else:
            fate["voted_down"] += 1
    executed = sum(fate.values())
    syncs = [e for e in events if e.get("kind") == "sync" and first <= e.get("t", 0) <= end]
    cpu = [
        e.get("cpu_percent") or 0.0
        for e in events
        if e.get("kind") == "node_health" and first + 5 <= e.get("t", 0) <= end
    ]
    cores = statistics.mean(cpu) / 100 if cpu else None
    return {
        **fault_bins(events, first, window_s),
        "executed_steps_per_s": executed / window_s,
        "steps_per_s": {k: v / window_s for k, v in fate.items()},
        "syncs": len(syncs),
        "syncs_not_committed": sum(1 for e in syncs if not e.get("committed")),
        "blocked_groups_mean": {
            p: sum(e.get(p) or 0.0 for e in syncs) / window_s
            for p in ("seconds", "t_quorum_s", "t_prepare_s", "t_perform_s")
        },
        "run_cores": cores,
        "cpu_ms_per_executed_step": 1000 * cores / (executed / window_s) if cores and executed else None,
    }


def fault_bins(events: list[dict], first: float, window_s: float, bin_s: float = 10.0) -> dict:
    """The chaos half against itself: executed steps/s in the ``bin_s`` bins that hold a fault or follow
    one, against the run's other bins (the first, start-up bin left out). Two halves minutes apart
    drift by more than the 2.3 % the classroom target allows (an 8-minute pair here: 8.83 against 9.12 ms
    of CPU per executed step, the faster one the chaos half); bins interleaved in one run do not.
    ``fault_cost_share`` is the executed work the fault bins miss, over the window's."""
    faults = [
        e["t"] - first
        for e in events
        if e.get("kind") == "fault" and e.get("action") in ("kill", "hang") and first <= e["t"] <= first + window_s
    ]
    n = int(window_s // bin_s)
    if not faults or n < 3:
        return {}
    counts = np.histogram([e["t"] - first for e in events if e.get("kind") == "step"], bins=n, range=(0, n * bin_s))[0]
    hit = np.zeros(n, bool)
    for t in faults:
        hit[min(int(t // bin_s), n - 1)] = True
        hit[min(int(t // bin_s) + 1, n - 1)] = True
    other = ~hit
    other[0] = False
    if not other.any():
        return {}
    base = counts[other].mean()
    missing = float((base - counts[hit]).sum())
    return {
        "fault_bins": int(hit.sum()),
        "executed_steps_per_s_fault_bins": float(counts[hit].mean() / bin_s),
        "executed_steps_per_s_other_bins": float(base / bin_s),
        "fault_cost_share": missing / counts[1:].sum(),
        "machine_s_per_fault": float(missing / base * bin_s / len(faults)),
    }


def steps_line(chaos: dict, clean: dict) -> str:
    """``where_steps_went`` of both halves, chaos / fault-free."""
    if not chaos or not clean:
        return "steps: -"
    sc, sf = chaos["steps_per_s"], clean["steps_per_s"]
    lost = ", ".join(f"{k} {sc[k]:.1f} / {sf[k]:.1f}" for k in sc if k != "useful" and (sc[k] or sf[k]))
    return (
        f"steps/s executed {chaos['executed_steps_per_s']:.1f} / {clean['executed_steps_per_s']:.1f}, useful "
        f"{sc['useful']:.1f} / {sf['useful']:.1f}"
        + (f", lost: {lost}" if lost else "")
        + f"; groups blocked in syncs {chaos['blocked_groups_mean']['seconds']:.2f} / {clean['blocked_groups_mean']['seconds']:.2f}"
        + (
            f"; run's CPU {chaos['run_cores']:.2f} / {clean['run_cores']:.2f} cores, "
            f"{chaos['cpu_ms_per_executed_step']:.2f} / {clean['cpu_ms_per_executed_step']:.2f} ms per executed step"
            if chaos.get("run_cores") and clean.get("run_cores")
            else ""
        )
        + (
            f"; the chaos half's bins with a fault {chaos['executed_steps_per_s_fault_bins']:.1f} against its others "
            f"{chaos['executed_steps_per_s_other_bins']:.1f} executed steps/s: {chaos['fault_cost_share'] * 100:.2f} % of its "
            f"work, {chaos['machine_s_per_fault']:.2f} s of the machine per fault"
            if "fault_cost_share" in chaos
            else ""
        )
    )


def retained_over_pairs(pairs: list[tuple[dict, dict]]) -> dict:
    """Throughput retained over (chaos, fault-free) summaries: each pair's ratio, their median, and
    the pooled ratio (all useful samples under chaos ÷ all fault-free ones, per second of window)."""
    ratios = [
        c["useful_samples_per_s"] / f["useful_samples_per_s"]
        for c, f in pairs
        if c["useful_samples_per_s"] and f["useful_samples_per_s"]
    ]
    chaos = sum(c["useful_samples"] for c, _ in pairs) / sum(c["window_s"] for c, _ in pairs)
    clean = sum(f["useful_samples"] for _, f in pairs) / sum(f["window_s"] for _, f in pairs)
    return {
        "ratios": ratios,
        "median": statistics.median(ratios) if len(ratios) == len(pairs) else None,
        "pooled": chaos / clean if clean else None,
        "faults": sum(c["faults"] for c, _ in pairs),
        "final_loss_median": {
            "chaos": statistics.median(c["final_loss_median"] for c, _ in pairs),
            "fault_free": statistics.median(f["final_loss_median"] for _, f in pairs),
        },
    }


def interleaved(pairs: int, window_s: float, overrides: dict, root: Path, log=print) -> dict:
    """``pairs`` (chaos, fault-free) pairs in ABBA order (see the module docstring)."""
    chaos_spec = classroom_spec(overrides)
    seed = chaos_spec.chaos.seed
    done = []
    for i in range(pairs):
        chaos = classroom_spec({**overrides, "chaos.seed": seed + i})
        clean = classroom_spec({**overrides, "chaos": None})
        order = ("chaos", "fault-free") if i % 2 == 0 else ("fault-free", "chaos")
        got = {half: summarize(run_window(chaos if half == "chaos" else clean, window_s, root, log)) for half in order}
        done.append((got["chaos"], got["fault-free"]))
        c, f = done[-1]
        log(
            f"pair {i} ({' then '.join(order)}): retained {c['useful_samples_per_s'] / f['useful_samples_per_s']:.3f} "
            f"({c['useful_samples_per_s']:.1f} / {f['useful_samples_per_s']:.1f}), {c['faults']} faults "
            f"{c['fault_kinds']}, median step {c['step_time_s_median'] * 1000:.1f} / {f['step_time_s_median'] * 1000:.1f} ms"
        )
        log("  " + steps_line(c["steps"], f["steps"]))
    return {
        "pairs": [{"chaos": c, "fault_free": f} for c, f in done],
        **retained_over_pairs(done),
        "within_run": within_run(done, chaos_spec.chaos.mtbf_s),
    }


def within_run(pairs: list[tuple[dict, dict]], mtbf_s: float) -> Optional[dict]:
    """Throughput retained as the chaos halves' own fault bins price it (``fault_bins``), at the
    config's mean time between faults: 1 - (machine seconds per fault / mtbf_s) - the share of executed
    steps thrown away (the victim's window, syncs voted down). Immune to the drift between halves; blind
    to a cost that lasts beyond the bin after a fault's."""
    costs = [c["steps"]["machine_s_per_fault"] for c, _ in pairs if "machine_s_per_fault" in c.get("steps", {})]
    if not costs:
        return None
    thrown = [
        sum(v for k, v in c["steps"]["steps_per_s"].items() if k in ("died_before_sync", "voted_down"))
        / c["steps"]["executed_steps_per_s"]
        for c, _ in pairs
    ]
    per_fault = statistics.median(costs)
    return {
        "machine_s_per_fault": per_fault,
        "thrown_away_share": statistics.median(thrown),
        "mtbf_s": mtbf_s,
        "retained_estimate": 1 - per_fault / mtbf_s - statistics.median(thrown),
    }


def render_time(root: Path, groups: int = 32, history_steps: int = 600, reps: int = 15) -> dict:
    """One dashboard update at ``groups`` groups: each rep appends one step per group (and a fault
    every 5th) to a real run directory, then times ``Dashboard.update()`` (read, fold, render all)."""
    from workbench.widgets import Dashboard

    spec = classroom_spec({"replicas": groups, "chaos": None}, log=lambda *_: None)
    data = spec.to_dict()
    data["run_root"] = str(root)
    run_dir = rundir.create(root, f"20250101-000000-render{groups}-abcdef", data)
    ctl = EventWriter(run_dir, "controller", run="bench")
    control = EventWriter(run_dir, "control-bench", run="bench")
    ws = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="bench", replica=r, attempt=0) for r in range(groups)]
    t = time.time() - history_steps * 0.5
    ctl.emit("start", role="controller", trainer=spec.trainer, cluster="local", t=t)
    for w in ws:
        w.emit("start", role="replica", trainer=spec.trainer, world_size=1, t=t)

    def step_all(s: int, t: float) -> None:
        for r, w in enumerate(ws):
            w.emit(
                "step",
                step=s,
                loss=5.0 / (1 + s) + 0.01 * r,
                committed=True,
                participating=True,
                participants=groups,
                quorum_id=s // 50,
                step_time_s=0.4,
                tokens_per_s=640.0,
                t=t,
            )

    for s in range(1, history_steps + 1):
        step_all(s, t + s * 0.5)
        if s % 60 == 0:
            control.emit("fault", action="hang", target=s % groups, pid=1, origin="schedule", seconds=3, t=t + s * 0.5)
    dash = Dashboard(run_dir, start=False, faults=False)
    times, clock = [], []
    try:
        for i in range(reps):
            step_all(history_steps + 1 + i, time.time())
            if i % 5 == 0:
                control.emit("fault", action="hang", target=i % groups, pid=1, origin="schedule", seconds=3)
            t0 = time.perf_counter()
            dash.update()
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dash._render_classroom(force=True)
            clock.append(time.perf_counter() - t0)
    finally:
        dash.stop()
    return {
        "groups": groups,
        "points_per_group": history_steps + reps,
        "reps": reps,
        "update_s_median": statistics.median(times),
        "update_s_max": max(times),
        "grid_and_clock_s_median": statistics.median(clock),
        "loadavg": os.getloadavg(),
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.classroom", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="each half's window (chaos, then fault-free)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--pairs",
        type=int,
        default=None,
        help="K interleaved pairs of --minutes halves (chaos/fault-free, then fault-free/chaos, ...): "
        "the median of their ratios",
    )
    ap.add_argument("--scale", default=None, help="comma-separated group counts: measure memory/CPU/step time instead")
    ap.add_argument("--scale-window", type=float, default=40.0)
    ap.add_argument(
        "--half",
        choices=("chaos", "fault-free"),
        default=None,
        help="run only one half (write it with --json); --retained combines two halves' files",
    )
    ap.add_argument("--retained", nargs=2, metavar=("CHAOS_JSON", "FAULT_FREE_JSON"), default=None)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--render-groups", type=int, default=32)
    ap.add_argument("--render-history", type=int, default=600, help="steps per group already in the log")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--run-root", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args(argv)
    os.nice(10)
    overrides = dict(parse_override(o) for o in args.overrides)
    results: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "nproc": os.cpu_count(),
        "mem_total_gib": psutil.virtual_memory().total / 2**30,
    }
    with tempfile.TemporaryDirectory(prefix="wb-bench-classroom-") as tmp:
        root = Path(args.run_root or tmp)
        if args.scale:
            results["scale"] = []
            for n in [int(x) for x in args.scale.split(",")]:
                spec = classroom_spec({**overrides, "replicas": n, "chaos": None})
                s = summarize(run_window(spec, args.scale_window, root))
                print(
                    json.dumps(
                        {
                            k: s[k]
                            for k in (
                                "groups",
                                "useful_samples_per_s",
                                "step_time_s_median",
                                "memory",
                                "loadavg_at_start",
                            )
                        },
                        default=str,
                    )
                )
                results["scale"].append(s)
        elif args.pairs:
            got = interleaved(args.pairs, args.minutes * 60, overrides, root)
            results["interleaved"] = got
            first = got["pairs"][0]["chaos"]
            print(
                f"throughput retained, median of {args.pairs} interleaved pairs {got['median']:.3f} "
                f"(target >= 0.977; pairs {', '.join(f'{r:.3f}' for r in got['ratios'])}; pooled {got['pooled']:.3f}); "
                f"{got['faults']} faults in {args.pairs} x {args.minutes * 60:.0f} s, {first['groups']} groups + "
                f"{first['spares']} spares, final loss {got['final_loss_median']['chaos']:.4f} "
                f"(fault-free {got['final_loss_median']['fault_free']:.4f})"
            )
            w = got["within_run"]
            if w:
                print(
                    f"within the chaos halves: {w['machine_s_per_fault']:.2f} s of the machine per fault (median), "
                    f"{w['thrown_away_share'] * 100:.2f} % of executed steps thrown away: at one fault every "
                    f"{w['mtbf_s']:g} s, retained ~{w['retained_estimate']:.3f} (an estimate; not back to back)"
                )
        elif args.half:
            window = args.minutes * 60
            spec = classroom_spec(overrides if args.half == "chaos" else {**overrides, "chaos": None})
            results[args.half.replace("-", "_")] = summarize(run_window(spec, window, root))
            print(json.dumps(results[args.half.replace("-", "_")], default=str))
        elif not args.render_only:
            window = args.minutes * 60
            if args.retained:
                chaos, clean = (
                    json.loads(Path(f).read_text())[k] for f, k in zip(args.retained, ("chaos", "fault_free"))
                )
                window = chaos["window_s"]
            else:
                chaos = summarize(run_window(classroom_spec(overrides), window, root))
                clean = summarize(run_window(classroom_spec({**overrides, "chaos": None}), window, root))
            retained = (
                chaos["useful_samples_per_s"] / clean["useful_samples_per_s"]
                if chaos["useful_samples_per_s"] and clean["useful_samples_per_s"]
                else None
            )
            results.update(chaos=chaos, fault_free=clean, throughput_retained=retained)
            print(
                f"throughput retained {retained:.3f} (target >= 0.977): {chaos['useful_samples_per_s']:.1f} / "
                f"{clean['useful_samples_per_s']:.1f} useful samples/s; {chaos['faults']} faults "
                f"{chaos['fault_kinds']} in {window:.0f} s, {chaos['groups']} groups + {chaos['spares']} spares, "
                f"final loss {chaos['final_loss_median']:.4f} (fault-free {clean['final_loss_median']:.4f}); "
                f"dead-group queue peak {chaos['backlog']['peak']}, mean {chaos['backlog']['mean']:.2f}, "
                f"kept up: {chaos['backlog']['kept_up']}"
            )
        if args.half:
            r = None
        else:
            r = render_time(root, args.render_groups, args.render_history)
            results["render"] = r
        if r:
            print(
                f"dashboard update at {r['groups']} groups: median {r['update_s_median'] * 1000:.0f} ms "
                f"(max {r['update_s_max'] * 1000:.0f} ms; grid + wall-clock plots {r['grid_and_clock_s_median'] * 1000:.0f} ms), "
                f"{r['points_per_group']} points per group, load {r['loadavg'][0]:.2f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
