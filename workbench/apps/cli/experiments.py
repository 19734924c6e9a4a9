"""``workbench sweep|matrix|drill|ls``: many runs at once, and what is under the run root.

``sweep`` turns ``key=v1,v2`` overrides into a grid (:func:`split_values` splits
on commas outside brackets, braces and quotes, so a list value stays one
value); ``matrix`` crosses fault kinds, trainers and backends with N trials
each; ``drill`` probes what this Slurm does to jobs; ``ls`` lists runs and
sweeps. The experiments themselves live in :mod:`workbench.experiments` and
:mod:`workbench.cluster.slurm.drill`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workbench.apps.cli.runs import follow
from workbench.cluster.slurm.drill import drill
from workbench.errors import SpecError
from workbench.experiments.matrix import OUTCOMES, attach_matrix, matrix
from workbench.experiments.matrix_plan import parse_window
from workbench.experiments.sweep import attach_sweep, list_sweeps, sweep
from workbench.run.listing import runs_listing
from workbench.spec.load import parse_override


def split_values(raw: str) -> list[str]:
    """``500,1000`` -> ``["500", "1000"]``; commas inside brackets, braces or quotes do not split."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in raw:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    return parts + [cur]


def cmd_sweep(args) -> int:
    fixed, grid = {}, {}
    for item in args.overrides:
        key, _, raw = item.partition("=")
        values = [parse_override(f"{key}={v}")[1] for v in split_values(raw)] if "=" in item else None
        if values is None:
            parse_override(item)  # raises the usual "expected key=value"
        elif len(values) == 1:
            fixed[key.strip()] = values[0]
        else:
            grid[key.strip()] = values
    if not grid:
        raise SpecError("sweep: no key with several values; give e.g. lighthouse.heartbeat_timeout_ms=500,1000,5000")
    sw = sweep(args.config, fixed, grid=grid, max_parallel=args.max_parallel)
    print(sw.sweep_dir, flush=True)
    if not follow(sw, args.detach):
        return 0
    table = sw.table()
    print(table.drop(columns=["run_dir"], errors="ignore").to_string(index=False))
    return 0 if (table["state"] == "completed").all() else 1


def cmd_matrix(args) -> int:
    window = parse_window(args.window) if args.window else None
    if args.attach:
        mxs = [attach_matrix(d) for d in args.attach]
    else:
        setups = args.setup or args.setups
        if setups is None and args.config is None:
            raise SpecError("matrix: give a config (trainers × backends over it), --setups NAME or --setup ...")
        if setups is not None and args.config is not None:
            raise SpecError("matrix: a config is for trainers × backends; with --setup(s) each setup names its own")
        mx = matrix(
            args.config,
            args.overrides,
            faults=args.faults,
            trainers=args.trainers,
            backends=args.backends,
            setups=setups,
            trials=args.trials,
            window=window,
            seed=args.seed,
            seconds=args.seconds,
            max_parallel=args.max_parallel,
            lock=args.lock,
            lock_turn_s=args.lock_turn,
        )
        print(mx.matrix_dir, flush=True)
        if not follow(mx.sweep, args.detach):
            return 0
        mxs = [mx]
    for mx in mxs:
        _print_table(mx)
    if args.markdown:
        if len(mxs) == 1:
            page = mxs[0].markdown(title=args.title, note=args.note)
        else:  # one page, a section per matrix run
            page = (
                f"# {args.title or 'The fault matrix'}\n\n"
                + (f"{args.note}\n\n" if args.note else "")
                + "\n".join(
                    mx.markdown(title=f"Run {i + 1}: {', '.join(dict.fromkeys(mx.table()['setup']))}", level=2)
                    for i, mx in enumerate(mxs)
                )
            )
        Path(args.markdown).write_text(page)
        print(f"wrote {args.markdown}")
    return 0


def _print_table(mx) -> None:
    table = mx.table()
    cols = [
        "fault",
        "setup",
        "status",
        "trials",
        *OUTCOMES,
        "rate",
        "ci_low",
        "ci_high",
        *[c for c in table.columns if c.endswith("_median_s") or c.endswith("_p95_s")],
    ]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.2f}"))


def cmd_drill(args) -> int:
    table = drill(partition=args.partition, timeout_s=args.timeout)
    print(table.to_string(index=False))
    return 0


def cmd_ls(args) -> int:
    root = args.run_root or os.environ.get("WORKBENCH_RUN_ROOT", "runs")
    runs = runs_listing(root)
    sweeps = []
    for d in list_sweeps(root):
        sw = attach_sweep(d)
        states = sw.point_states()
        sweeps.append(
            {
                "sweep_id": sw.id,
                "state": sw.state(),
                "points": len(states),
                "keys": ",".join(sw.params),
                **{s: states.count(s) for s in sorted(set(states))},
                "sweep_dir": str(sw.sweep_dir),
            }
        )
    if args.json:
        print(json.dumps({"runs": runs.to_dict(orient="records"), "sweeps": sweeps}, default=str))
        return 0

    def age(s):
        return (
            ""
            if s is None or s != s
            else f"{s / 60:.0f}m"
            if s < 7200
            else f"{s / 3600:.0f}h"
            if s < 172800
            else f"{s / 86400:.0f}d"
        )

    if runs.empty:
        print(f"no runs under {root}")
    else:
        runs = runs.assign(
            steps=runs["step"].astype(str) + "/" + runs["steps_target"].astype(str), age=runs["age_s"].map(age)
        )
        print(runs[["run_id", "state", "trainer", "steps", "faults", "restarts", "age"]].to_string(index=False))
    for sw in sweeps:
        counts = " ".join(
            f"{k}={v}" for k, v in sw.items() if k not in ("sweep_id", "state", "points", "keys", "sweep_dir")
        )
        print(f"sweep {sw['sweep_id']}: {sw['state']}  {sw['points']} points over {sw['keys']}  {counts}")
    return 0
