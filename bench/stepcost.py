"""The per-step cost of fault tolerance, broken down: torchft-lite against plain DDP in one session.

``python -m bench --only stepcost`` (a section of ``python -m bench``). Interleaved, fault-free, each a
window after its first step:

- ``ddp-restart`` without checkpoints in the window: plain ``torch.nn.parallel.DistributedDataParallel``
  over gloo, the same model, batch and 3 processes: the baseline;
- ``torchft-lite``, as the demo runs it;
- ``torchft-lite step_timing``: the same with ``torchft.step_timing: true``, whose step events carry
  per-phase seconds (``trainers/torchft_lite.py`` ``_install_timing``): zero_grad (+ the batch; starts the async
  quorum), forward, backward (with the gradient all-reduce hook inside: ``allreduce``, through
  torchft's ``Manager.allreduce`` and its process-group wrapper, and any ``quorum_wait``),
  optimizer step (``commit_vote``: ``should_commit``, then ``inner_step``: AdamW), ``quorum_rtt``
  (the quorum round trip on torchft's thread, overlapping the step), and ``workbench``: what the
  trainer adds after the step (commit record, loss, checksum every 10 steps, the event write);
- ``torchft-lite bare``: step events and the torchft log route off (heartbeats only): torchft's own
  cost without the workbench's telemetry;
- ``torchft.local_commit_vote: false``: torchft's commit vote as a gRPC round trip to the group's
  ManagerServer, against the workbench's in-process answer for a group of one rank
  (``trainers/commit_vote.py``), paired with torchft-lite like DDP is.
- ``torchft.tokio_worker_threads: null``: tokio's default of one worker per core in each of the
  Manager's runtimes, against the workbench's 1 (``spec.TorchftSpec`` says why).
- ``torchft.pg_timeout_only: false``: torchft's own timer on every collective's future (armed and
  cancelled on its TimeoutManager's thread), against the workbench's process-group timeout alone
  (``trainers/collective_failure.py``).
- ``torchft.rust_log: info``: torchft's default Rust log level (four lines a quorum in each group, seven
  in the lighthouse), against the workbench's ``warn``.
- ``torchft.lean_ddp_hook: false``: torchft's DDP gradient hook and its future chain, against the
  workbench's hook that waits the same way without it (``trainers/ddp_hook.py``).

Rates come from heartbeats (every variant writes them), so that the bare run is measured the same
way; ``step_time_s`` (zero_grad → optimizer step, the same span in both trainers) where step events exist.
Two figures less at the mercy of the machine than a rate, since samples/s of the same variant moves by
tens of percent between runs here (3 processes in lockstep on 2 cores, and the VM's neighbours):

- the torchft/DDP ratio per repetition (the two ran back to back, DDP first in even repetitions and
  last in odd ones: ``interleaved(alternate=True)``), and the median of those ratios, over the
  repetitions of all variants and ``pair_reps`` more of just these two;
- CPU per group-step: the run's trainer processes' CPU (the controller's ``node_health`` samples,
  ``cpu_percent`` of each part's process tree, every 2 s) over the window, divided by the group-steps
  done meanwhile (from the same heartbeat rate). Neither run fills the 2 cores (measured 1.5-1.7
  cores), so throughput is bound by lockstep latency, which the scheduler moves; CPU per step is what
  a variant costs. It leaves out the lighthouse (about 0.04 cores with 3 groups).
"""

from __future__ import annotations

import statistics

import numpy as np

from .recovery import heartbeat_rate
from .sessions import TORCHFT, Variant, interleaved

TIMED = Variant("torchft-lite step_timing", {"trainer": "torchft-lite", "torchft.step_timing": True})
BARE = Variant(
    "torchft-lite bare", {"trainer": "torchft-lite", "write_events": False, "torchft.structured_logs": False}
)
RPC_VOTE = Variant("torchft-lite commit vote over RPC", {"trainer": "torchft-lite", "torchft.local_commit_vote": False})
TOKIO_DEFAULT = Variant(
    "torchft-lite tokio workers per core", {"trainer": "torchft-lite", "torchft.tokio_worker_threads": None}
)
FUTURE_TIMERS = Variant("torchft-lite future timers", {"trainer": "torchft-lite", "torchft.pg_timeout_only": False})
RUST_INFO = Variant("torchft-lite rust_log=info", {"trainer": "torchft-lite", "torchft.rust_log": "info"})
TORCHFT_HOOK = Variant("torchft-lite torchft's DDP hook", {"trainer": "torchft-lite", "torchft.lean_ddp_hook": False})
OVERHEAD_LIMIT = 0.05  # the target: torchft-lite's samples/s at most 5 % below plain DDP's (paired median)
PHASES = (
    "zero_grad",
    "forward",
    "backward",
    "allreduce",
    "quorum_wait",
    "optimizer_step",
    "commit_vote",
    "inner_step",
    "quorum_rtt",
    "workbench",
)


def plain_ddp() -> Variant:
    return Variant("ddp (plain, no checkpoint)", {"trainer": "ddp-restart", "checkpoint.every_s": 3600.0})


def measure(reps: int, window_s: float, root, ddp=None, log=print, pair_reps: int = 0) -> dict:
    """``reps`` repetitions of every variant, then ``pair_reps`` more of plain DDP and torchft-lite alone:
    the target's comparison. Two runs of one variant here differ by up to 45 % in samples/s, and one
    slow stretch of the machine can take a whole pair (a full run's first repetition: torchft-lite at
    804 samples/s between runs at 1,057 and 1,164), so the median over 5 pairs moved from 8.9 to 5.5 %
    between two full runs and was -2.4 % in a third session of the same code."""
    base = plain_ddp()
    variants = [base, TORCHFT, TIMED, BARE, RPC_VOTE, TOKIO_DEFAULT, FUTURE_TIMERS, RUST_INFO, TORCHFT_HOOK]
    records = interleaved(variants, reps, window_s, root, log, alternate=True)
    if pair_reps:
        records += interleaved([base, TORCHFT], pair_reps, window_s, root, log, alternate=True)
    runs = []
    for rec in records:
        steps = [
            e
            for e in rec.events
            if e.get("kind") == "step"
            and e.get("committed")
            and e.get("participating", True)
            and e.get("step_time_s") is not None
        ]
        rate = heartbeat_rate(rec.events, rec.spec)
        cores = trainer_cores(rec.events)
        runs.append(
            {
                "variant": rec.variant,
                "loadavg_1m": rec.loadavg[0],
                "error": rec.error,
                "heartbeat_rate": rate,
                "median_step_time_s": statistics.median(e["step_time_s"] for e in steps) if steps else None,
                "steps": len(steps),
                "trainer_cores": cores,
                "cpu_ms_per_step": cores / (rate / rec.spec.model.batch_size) * 1e3 if cores and rate else None,
            }
        )
    timed = [
        e
        for rec in records
        if rec.variant == TIMED.name
        for e in rec.events
        if e.get("kind") == "step" and e.get("committed") and e.get("participating", True)
    ]
    phases = {}
    for p in PHASES:
        vals = [e.get(f"t_{p}_s", 0.0) for e in timed[3:]]  # the first steps include warm-up
        if vals:
            phases[p] = {
                "median_s": float(np.median(vals)),
                "mean_s": float(np.mean(vals)),
                "p90_s": float(np.percentile(vals, 90)),
            }
    step_med = float(np.median([e["step_time_s"] for e in timed[3:]])) if len(timed) > 3 else None

    def med(variant, col):
        vals = [r[col] for r in runs if r["variant"] == variant and r[col]]
        return statistics.median(vals) if vals else None

    out = {
        "reps": reps,
        "pair_reps": pair_reps,
        "window_s": window_s,
        "runs": runs,
        "phases": phases,
        "timed_step_s": step_med,
        "timed_steps": len(timed),
    }
    for v in variants:
        out[v.name] = {
            "rate": med(v.name, "heartbeat_rate"),
            "step_s": med(v.name, "median_step_time_s"),
            "cpu_ms_per_step": med(v.name, "cpu_ms_per_step"),
        }
    out["paired"] = paired(runs, base.name, TORCHFT.name)
    out["paired_tokio"] = paired(runs, TOKIO_DEFAULT.name, TORCHFT.name)
    out["paired_vote"] = paired(runs, RPC_VOTE.name, TORCHFT.name)
    out["paired_future_timers"] = paired(runs, FUTURE_TIMERS.name, TORCHFT.name)
    out["paired_rust_log"] = paired(runs, RUST_INFO.name, TORCHFT.name)
    out["paired_ddp_hook"] = paired(runs, TORCHFT_HOOK.name, TORCHFT.name)
    return out


def trainer_cores(events: list[dict]) -> float | None:
    """Mean cores the run's trainer processes used, from ``node_health`` (summed over nodes), over the
    samples from 3 s after the first heartbeat (as ``heartbeat_rate``) to the last one before the run stopped."""
    beats = [e["t"] for e in events if e.get("kind") == "heartbeat" and e.get("replica") is not None]
    health = sorted((e["t"], e.get("cpu_percent") or 0.0) for e in events if e.get("kind") == "node_health")
    if not beats or len(health) < 3:
        return None
    start, end = min(beats) + 3, max(beats)
    busy = span = 0.0
    for (t0, _), (t1, pct) in zip(health, health[1:]):
        if t0 >= start and t1 <= end and t1 > t0:
            busy += pct / 100 * (t1 - t0)
            span += t1 - t0
    return busy / span if span else None


def paired(runs: list[dict], base: str, other: str) -> dict:
    """Per repetition (``interleaved`` runs every variant once per repetition, in order): how much lower
    ``other``'s samples/s and how much more CPU per step it used than ``base``, its neighbour in that repetition."""
    a = [r for r in runs if r["variant"] == base]
    b = [r for r in runs if r["variant"] == other]
    lower = [
        1 - y["heartbeat_rate"] / x["heartbeat_rate"]
        for x, y in zip(a, b)
        if x["heartbeat_rate"] and y["heartbeat_rate"]
    ]
    more_cpu = [
        y["cpu_ms_per_step"] / x["cpu_ms_per_step"] - 1
        for x, y in zip(a, b)
        if x["cpu_ms_per_step"] and y["cpu_ms_per_step"]
    ]
    return {
        "rate_lower": lower,
        "rate_lower_median": statistics.median(lower) if lower else None,
        "cpu_more": more_cpu,
        "cpu_more_median": statistics.median(more_cpu) if more_cpu else None,
    }


def lines(sc: dict) -> list[str]:
    import pandas as pd

    from .report import _apart, _f, table

    base, ft, bare, timed = (
        sc.get("ddp (plain, no checkpoint)"),
        sc.get(TORCHFT.name),
        sc.get(BARE.name),
        sc.get(TIMED.name),
    )
    out = [
        "## 6. Per-step cost, broken down (torchft-lite vs plain DDP)",
        "",
        f"Fault-free, 3 groups / 3 ranks, interleaved, {sc['reps']} repetition(s) of a {sc['window_s']:g} s window "
        + (f"and {sc['pair_reps']} more of plain DDP and torchft-lite alone " if sc.get("pair_reps") else "")
        + "(`bench/stepcost.py` says what each variant and phase is). Rates in samples/s from heartbeats.",
        "",
        table(pd.DataFrame(sc["runs"]).drop(columns=["error"])),
        "",
    ]

    def over(a, b, col):
        return (b[col] / a[col] - 1) if a and b and a.get(col) and b.get(col) else None

    def slower(a, b):  # rate: b slower than a by
        return (1 - b["rate"] / a["rate"]) if a and b and a.get("rate") and b.get("rate") else None

    by_variant: dict = {}
    for r in sc["runs"]:
        if r["heartbeat_rate"]:
            by_variant.setdefault(r["variant"], []).append(r["heartbeat_rate"])
    spread = max((max(v) / min(v) - 1 for v in by_variant.values() if len(v) > 1), default=None)
    loads = [r["loadavg_1m"] for r in sc["runs"]]
    if spread is not None:
        out += [
            f"Noise: the same variant's runs differ by up to **{spread * 100:.0f} %** in samples/s here (load "
            f"{min(loads):.1f}–{max(loads):.1f} on {len(loads)} runs); a difference between variants smaller than "
            "that is not a measurement. The per-phase table (one run's own steps, each step timed) is the robust part.",
            "",
        ]
    pr = sc.get("paired") or {}
    if pr.get("rate_lower"):
        out += [
            "- torchft-lite vs plain DDP, paired (each repetition's two runs back to back): samples/s lower by "
            + _percents(pr["rate_lower"])
            + f" (median **{_apart(pr['rate_lower_median'] * 100, OVERHEAD_LIMIT * 100)} %**)"
            + (
                (
                    "; CPU per group-step more by "
                    + _percents(pr["cpu_more"])
                    + f" (median **{pr['cpu_more_median'] * 100:.1f} %**; plain DDP "
                    f"{_f(base.get('cpu_ms_per_step'), '{:.1f}')} ms, torchft-lite {_f(ft.get('cpu_ms_per_step'), '{:.1f}')} ms "
                    "of CPU per group-step, medians)"
                )
                if pr.get("cpu_more")
                else ""
            )
        ]
    out += [
        f"- torchft-lite vs plain DDP: samples/s **{_f(_pct(slower(base, ft)))} % lower**, median step time "
        f"{_f(_pct(over(base, ft, 'step_s')))} % longer",
        f"- torchft-lite bare (no step events, no log route) vs plain DDP: samples/s {_f(_pct(slower(base, bare)))} % lower "
        "— torchft's own cost",
        f"- what the workbench's telemetry adds (torchft-lite vs bare): samples/s {_f(_pct(slower(bare, ft)))} % lower",
        f"- the timing mode's own cost (step_timing vs torchft-lite): median step {_f(_pct(over(ft, timed, 'step_s')))} %",
        f"- torchft's commit vote over RPC (`torchft.local_commit_vote: false`) vs plain DDP: samples/s "
        f"{_f(_pct(slower(base, sc.get(RPC_VOTE.name))))} % lower; the in-process vote"
        + _paired_with(sc.get("paired_vote"), cpu=True)
        + " (async quorum is on in every torchft run)",
        f"- tokio's default of a worker per core in each of the Manager's runtimes (`torchft.tokio_worker_threads: null`) "
        f"vs plain DDP: samples/s {_f(_pct(slower(base, sc.get(TOKIO_DEFAULT.name))))} % lower; the workbench's 1 worker"
        + _paired_with(sc.get("paired_tokio")),
        f"- torchft's timer on every collective's future (`torchft.pg_timeout_only: false`) vs plain DDP: samples/s "
        f"{_f(_pct(slower(base, sc.get(FUTURE_TIMERS.name))))} % lower; the process group's timeout alone"
        + _paired_with(sc.get("paired_future_timers"), cpu=True),
        f"- torchft's default Rust log level (`torchft.rust_log: info`) vs plain DDP: samples/s "
        f"{_f(_pct(slower(base, sc.get(RUST_INFO.name))))} % lower; the workbench's `warn`"
        + _paired_with(sc.get("paired_rust_log"), cpu=True),
        f"- torchft's DDP gradient hook (`torchft.lean_ddp_hook: false`) vs plain DDP: samples/s "
        f"{_f(_pct(slower(base, sc.get(TORCHFT_HOOK.name))))} % lower; the workbench's hook"
        + _paired_with(sc.get("paired_ddp_hook"), cpu=True),
        "",
    ]
    if sc["phases"]:
        step = sc["timed_step_s"]
        rows = [
            {
                "phase": p,
                "median_ms": v["median_s"] * 1e3,
                "mean_ms": v["mean_s"] * 1e3,
                "p90_ms": v["p90_s"] * 1e3,
                "share_of_median_step": (v["mean_s"] / step) if step else None,
            }
            for p, v in sc["phases"].items()
        ]
        out += [
            f"Per phase (step_timing runs, {sc['timed_steps']} committed steps, median step {_f(step * 1e3 if step else None, '{:.1f}')} ms; "
            "allreduce and quorum_wait are inside backward, commit_vote and inner_step inside optimizer_step, "
            "quorum_rtt overlaps the step, workbench follows it):",
            "",
            table(pd.DataFrame(rows)),
            "",
        ]
    return out


def _paired_with(pr, cpu: bool = False) -> str:
    """``paired``'s per-repetition figures as the clause after a variant's name, or that it was not measured."""
    if not (pr or {}).get("rate_lower"):
        return ": not measured"
    text = (
        ", paired with it: samples/s lower by "
        + _percents(pr["rate_lower"])
        + f" (median {pr['rate_lower_median'] * 100:.1f} %; negative: faster)"
    )
    if cpu and pr.get("cpu_more"):
        text += (
            "; CPU per group-step more by "
            + _percents(pr["cpu_more"])
            + f" (median {pr['cpu_more_median'] * 100:.1f} %)"
        )
    return text


def _percents(fractions) -> str:
    return ", ".join(f"{x * 100:.1f} %" for x in fractions)


def _pct(x):
    return None if x is None else x * 100
