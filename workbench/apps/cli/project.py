"""``workbench project RUN``: a measured run projected to cluster scale.

:func:`workbench.projection.calibrate.project` reproduces the run's goodput
from its own measurements, then projects checkpoint-restart, elastic and
DiLoCo training to ``--gpus`` accelerators. ``PROJECT_FLAGS`` is the table of
its inputs: the parser adds one flag per row, and only the flags given are
passed on (the rest keep the projection's defaults).
"""

from __future__ import annotations

import json

from workbench.projection.calibrate import project
from workbench.run.handle import attach

PROJECT_FLAGS = (  # flag, input, type, help (units)
    ("--gpus", "gpus", int, "accelerators"),
    ("--groups", "groups", int, "replica groups"),
    ("--device-mtbf-h", "device_mtbf_h", float, "per-device MTBF, hours (default: Meta's published MTTF at --gpus)"),
    ("--params", "params", float, "model parameters"),
    ("--step-s", "step_s", float, "fault-free step time, s"),
    ("--days", "horizon_s", float, "wall window projected, days"),
    ("--ckpt-period-s", "period_s", float, "checkpoint period, s of training (default: Daly's optimum)"),
    ("--ckpt-gbps", "write_gbps", float, "checkpoint write bandwidth, GB/s aggregate"),
    ("--restart-s", "restart_s", float, "restart after a failure, s (both strategies)"),
    ("--overhead", "overhead", float, "elastic per-step overhead, fraction of the step (default: from --cross-gbps)"),
    ("--cross-gbps", "cross_gbps", float, "elastic all-reduce bandwidth between groups, GB/s per accelerator"),
    ("--spares", "spares", int, "spare groups"),
    ("--replacement-s", "replacement_s", float, "a new node, s"),
    ("--heal-gbps", "heal_gbps", float, "heal bandwidth per accelerator, GB/s"),
    ("--sync-steps", "sync_steps", int, "DiLoCo inner steps between outer steps"),
)


def cmd_project(args) -> int:
    inputs = {name: getattr(args, name) for _, name, _, _ in PROJECT_FLAGS if getattr(args, name) is not None}
    if "horizon_s" in inputs:
        inputs["horizon_s"] *= 86400.0
    bad = [k for k, v in inputs.items() if v <= 0 and k not in ("overhead", "spares")] + [
        k for k in ("overhead", "spares") if inputs.get(k, 0) < 0
    ]
    if bad:
        flag = next(f for f, n, _, _ in PROJECT_FLAGS if n == bad[0])
        raise ValueError(f"{flag}: must be > 0 (>= 0 for --overhead, --spares)")
    baseline = attach(args.baseline) if args.baseline else None
    out = project(
        attach(args.run), baseline=baseline, measured_costs=args.measured_costs, replicates=args.replicates, **inputs
    )
    if args.json:
        print(json.dumps(out, default=float))
        return 0
    rep, job = out["reproduced"], out["inputs"]["job"]
    print(f"run {out['run_dir']}")
    print(f"  reproduced ({rep['strategy']})  predicted {rep['predicted']:.3f}   measured {rep['measured']:.3f}")
    proj = out["projection"]
    print(
        f"projection: {job['gpus']} accelerators in {job['groups']} groups, {job['params'] / 1e9:.0f}B parameters, "
        f"job MTBF {proj['job_mtbf_s'] / 3600:.2f} h"
    )
    for s in ("checkpoint-restart", "elastic", "diloco"):
        r = proj[s]
        bad_parts = ", ".join(f"{k} {v:.3f}" for k, v in r["badput"].items() if v > 5e-4)
        print(f"  {s:19s} goodput {r['goodput']:.3f} ± {r['stderr']:.3f}   badput: {bad_parts or 'none'}")
    cr = proj["checkpoint-restart"]
    print(
        f"  checkpoint period {cr['period_s']:.0f} s (Daly {cr['daly_period_s']:.0f} s, Young {cr['young_period_s']:.0f} s),"
        f" write {cr['write_s']:.1f} s"
    )
    return 0
