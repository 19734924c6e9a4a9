"""A projection's inputs from a run directory's own events.

Everything a run measures comes from its events through the analyses that
already define it (``analysis.recovery_timeline``, ``analysis.goodput``,
``breakeven``), never re-derived here:

- the job: groups and accelerators from the spec, ``step_s`` = goodput's
  ``normal_step_s`` (one group's step at the steady-state rate), the window
  ``horizon_s`` = goodput's ``T_s`` (first to last committed step);
- the failure trace: each fault that ended a process, at its time after the
  first committed step, on its target group;
- elastic (torchft): ``replacement_s`` = median fault → replacement started,
  ``heal_s`` = median heal transfer, ``restart_s`` = median replacement started
  → taking part again, less the heal; ``stall_s`` = median survivor stall
  (the timeline's) over the faults whose victim was taking part (a group
  killed again before it rejoined stalls no one), or, where every group was a fault's target and no group
  survived untouched, goodput's stall and discarded badput per fault per
  survivor; ``startup_s`` = goodput's startup badput; ``overhead`` against a
  paired fault-free ``baseline`` run (steady-state samples/s per accelerator,
  floored at 0), else 0 — the run's own rate is its reference;
- checkpoint-restart (ddp-restart, MaxText): ``restart_s`` = median fault →
  the next attempt's first committed step (``breakeven.restart_seconds``:
  detection, relaunch, imports, restore), ``write_s`` = median checkpoint
  write, ``period_s`` = the median step spacing of durable checkpoints times
  ``step_s`` (the trainer checkpoints every N steps, so its phase after a
  restore is in steps: a period measured in seconds drifts off it with the
  step time and misplaces a fault before or after a write), or, without step
  numbers, their spacing in seconds less the write
  (``breakeven.checkpoint_period_s``).

``measured(run)`` is the goodput those inputs are checked against.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd

from workbench import analysis
from workbench.analysis import breakeven
from workbench.analysis.recovery import ends_process
from workbench.projection import sources
from workbench.projection.inputs import CheckpointRestart, DiLoCo, Elastic, Failures, Job, input_names
from workbench.projection.model import Projection
from workbench.trainers import trainer_kind


def _events_and_spec(run: Any) -> tuple[list[dict], Any]:
    return run if isinstance(run, tuple) else (run.event_records(), run.spec)


def _median(values) -> Optional[float]:
    v = pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()
    return float(v.median()) if len(v) else None


def _hit_live(kills: pd.DataFrame) -> pd.Series:
    """Per fault: its victim was taking part (its previous fault's ``participating`` was reached first)."""
    live = pd.Series(True, index=kills.index)
    back: dict = {}
    for i, r in kills.sort_values("t").iterrows():
        live[i] = r.t >= back.get(r.target, -np.inf)
        back[r.target] = r.t + r.participating if not np.isnan(r.participating) else np.inf
    return live


def _checkpoint_period_steps(events: list[dict]) -> Optional[float]:
    """Median step spacing of consecutive durable checkpoints of the same attempt."""
    by_attempt: dict = {}
    for e in events:
        if e.get("kind") == "checkpoint" and e.get("durable") and e.get("step") is not None:
            by_attempt.setdefault((e.get("replica"), e.get("attempt", 0)), []).append(int(e["step"]))
    gaps = [d for steps in by_attempt.values() for d in np.diff(sorted(steps))]
    return float(np.median(gaps)) if gaps else None


def measured(run: Any) -> dict:
    """The run's goodput as ``analysis.goodput`` measures it, and its window."""
    events, spec = _events_and_spec(run)
    g = analysis.goodput(events, spec)
    return {"goodput": g["goodput"], "T_s": g["T_s"], "badput_s": g["badput_s"], "normal_step_s": g["normal_step_s"]}


def calibrate(run: Any, baseline: Any = None) -> dict:
    """The inputs a run measures (see the module docstring), each with its value; None where unmeasured."""
    events, spec = _events_and_spec(run)
    kind = trainer_kind(spec.trainer)
    timeline = analysis.recovery_timeline(events)
    g = analysis.goodput(events, spec, timeline)
    if g["goodput"] is None:
        raise ValueError(f"run: no committed steps to calibrate from ({spec.trainer})")
    df = analysis.metrics_frame(events)
    t0 = float(df.loc[df["committed"].astype(bool), "t"].min())
    kills = timeline[ends_process(timeline)] if len(timeline) else timeline
    groups = spec.replicas if kind.elastic else 1
    out: dict = {
        "trainer": spec.trainer,
        "elastic": kind.elastic,
        "groups": groups,
        "gpus": spec.replicas * spec.nproc_per_replica,
        "min_groups": spec.min_replicas if kind.elastic else 1,
        "step_s": g["normal_step_s"],
        "horizon_s": g["T_s"],
        "trace": [(float(r.t - t0), int(r.target)) for r in kills.itertuples()],
        "faults": len(kills),
    }
    if kind.elastic:
        heal = _median(kills["heal_seconds"]) or 0.0
        replacement = _median(kills["replacement_started"])
        back = _median(kills["participating"] - kills["replacement_started"])
        stall = _median(kills.loc[_hit_live(kills), "survivor_stall_s"])
        if stall is None and len(kills) and groups > 1:
            parts = g["badput_s"]
            stall = (parts["stall"] + parts["discarded"]) * groups / (len(kills) * (groups - 1))
        overhead = 0.0
        if baseline is not None:
            # Per accelerator: a plain-DDP baseline is one job of all the ranks, torchft one group per replica.
            b_events, b_spec = _events_and_spec(baseline)
            b = analysis.goodput(b_events, b_spec)
            mine = g["rate_samples_per_s"] / (spec.replicas * spec.nproc_per_replica)
            theirs = b["rate_samples_per_s"] / (b_spec.replicas * b_spec.nproc_per_replica)
            overhead = max(0.0, theirs / mine - 1)  # a faster run than its baseline is noise, not a negative cost
        out.update(
            replacement_s=replacement,
            heal_s=heal,
            restart_s=None if back is None else max(0.0, back - heal),
            stall_s=stall,
            startup_s=g["badput_s"]["startup"] * groups,
            overhead=overhead,
        )
    else:
        restarts = breakeven.restart_seconds(events)
        writes = [float(e.get("seconds") or 0.0) for e in events if e.get("kind") == "checkpoint" and e.get("durable")]
        write = float(np.median(writes)) if writes else 0.0
        steps = _checkpoint_period_steps(events)
        spacing = breakeven.checkpoint_period_s(events)
        period = steps * g["normal_step_s"] if steps else None if spacing is None else max(spacing - write, 1e-9)
        out.update(
            restart_s=float(np.median(restarts)) if restarts else None,
            write_s=write,
            period_s=period,
            period_steps=steps,
        )
    return out


def projection_of(inputs: dict) -> Projection:
    """The projection of the measured job itself: its groups, window, step, costs and fault trace."""
    job = Job(
        gpus=inputs["gpus"], groups=inputs["groups"], step_s=inputs["step_s"], horizon_s=inputs["horizon_s"], params=0.0
    )
    failures = Failures(trace=inputs["trace"])
    if inputs["elastic"]:
        costs = dict(
            overhead=inputs["overhead"],
            stall_s=inputs["stall_s"] or 0.0,
            replacement_s=inputs["replacement_s"] or 0.0,
            spares=0,
            restart_s=inputs["restart_s"] or 0.0,
            heal_s=inputs["heal_s"],
            min_groups=inputs["min_groups"],
            startup_s=inputs["startup_s"],
        )
        return Projection(job=job, failures=failures, elastic=Elastic(**costs), diloco=DiLoCo(**costs))
    cr = CheckpointRestart(
        period_s=inputs["period_s"] or inputs["horizon_s"],
        write_s=inputs["write_s"],
        restore_s=0.0,
        detect_s=0.0,
        restart_s=inputs["restart_s"] or 0.0,
    )
    return Projection(job=job, failures=failures, restart=cr)


def reproduce(run: Any) -> dict:
    """Project a run onto itself: predicted against measured goodput, with the inputs used."""
    inputs = calibrate(run)
    strategy = "elastic" if inputs["elastic"] else "checkpoint-restart"
    res = projection_of(inputs).run(strategies=(strategy,))[strategy]
    return {
        "strategy": strategy,
        "predicted": res["goodput"],
        "measured": measured(run)["goodput"],
        "badput": res["badput"],
        "inputs": inputs,
    }


# The measured inputs that carry to another scale when asked (``measured_costs=True``): times of
# the recovery protocol and the per-step overhead. Bandwidth-bound times (heal, checkpoint write and
# restore) are recomputed from the job's state at scale instead.
CARRIED = {"elastic": ("overhead", "stall_s", "replacement_s", "restart_s"), "checkpoint-restart": ("restart_s",)}


def project(
    run: Any, baseline: Any = None, measured_costs: bool = False, replicates: int = 32, seed: int = 0, **inputs: Any
) -> dict:
    """Project a run's job to another scale: ``project(run, gpus=4096, groups=8, device_mtbf_h=5e4)``.

    Returns the run reproduced on itself (``reproduced``: predicted vs measured goodput), the
    calibrated inputs, the projection at the requested scale per strategy, and where each input of
    that projection came from (``given``, ``measured`` or the published default). Without a
    ``device_mtbf_h`` the failure rate is Meta's published job MTTF at that many accelerators.
    """
    allowed = input_names()
    bad = sorted(set(inputs) - allowed - {f"diloco_{k}" for k in allowed})
    if bad:
        raise ValueError(f"{bad[0]}: not an input of the projection; allowed: {', '.join(sorted(allowed))}")
    cal = calibrate(run, baseline)
    reproduced = reproduce(run)
    strategy = reproduced["strategy"]
    carried = {}
    if measured_costs:
        carried = {
            k: cal[k] for k in CARRIED[strategy] if cal.get(k) is not None and (k != "overhead" or baseline is not None)
        }  # without a baseline the run is its own reference
    p = Projection().replace(**inputs)
    owners = (p.elastic, p.diloco) if strategy == "elastic" else (p.restart,)
    for k, v in carried.items():
        if k not in inputs:
            for part in owners[:1] if k == "overhead" else owners:
                setattr(part, k, v)
    source = {k: "given" for k in inputs}
    if "device_mtbf_h" not in inputs:
        p = p.replace(device_mtbf_h=sources.meta_device_mtbf_h(p.job.gpus))
        source["device_mtbf_h"] = "sources.META_RSC (job MTTF at this size)"
    source.update({f"{strategy}.{k}": "measured" for k in carried if k not in inputs})
    return {
        "run_dir": str(getattr(run, "run_dir", "")),
        "reproduced": {k: reproduced[k] for k in ("strategy", "predicted", "measured")},
        "calibrated": {k: v for k, v in cal.items() if k != "trace"},
        "inputs": {
            "job": vars(p.job),
            "failures": vars(p.failures),
            "checkpoint-restart": vars(p.restart),
            "elastic": vars(p.elastic),
            "diloco": vars(p.diloco),
        },
        "source": source,
        "projection": p.run(replicates=replicates, seed=seed),
    }
