"""``workbench timeouts RUN``: the timeouts a measured run recommends, and a spec's timeouts judged against it.

Prints what was measured (``analysis.timeouts.measure``), one recommended value per timeout the
run's trainer and backend set, each with the measurement it rests on
(``analysis.timeouts.recommend``), and the preflight warnings of the run's own spec (or of
``--check CONFIG [KEY=VALUE...]``) against those measurements, the cluster's ``KillWait`` included.
A plugin of the CLI (``apps/cli/plugins.py``): the function gets the rest of the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Optional, Sequence

from workbench.analysis.timeouts import MARGIN, measure, measurement_lines, recommend
from workbench.run.handle import attach
from workbench.spec.load import load_spec
from workbench.spec.preflight import preflight


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``workbench timeouts RUN [--margin M] [--check CONFIG [KEY=VALUE...]] [--json]``."""
    parser = argparse.ArgumentParser(prog="workbench timeouts", description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory: the measured run")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides of --check's spec")
    parser.add_argument("--margin", type=float, default=MARGIN, help=f"× a measured tail (default {MARGIN:g})")
    parser.add_argument("--check", metavar="CONFIG", help="judge this spec instead of the run's own")
    parser.add_argument("--json", action="store_true", help="print measurements, recommendations and warnings as JSON")
    args = parser.parse_intermixed_args(argv)
    if not 1 <= args.margin <= 100:
        parser.error(f"--margin: {args.margin:g}; allowed: 1 to 100 (× the measured step-time tail)")
    if args.overrides and not args.check:
        parser.error("KEY=VALUE overrides: only with --check CONFIG (the run's own spec is as it ran)")
    run = attach(args.run)
    measured = measure(run.event_records(), run.id)
    recommendations = recommend(run.spec, measured, args.margin)
    checked = load_spec(args.check, args.overrides) if args.check else run.spec
    warnings = preflight(checked, measured)
    if args.json:
        print(
            json.dumps(
                {
                    "run": run.id,
                    "measured": dataclasses.asdict(measured),
                    "recommended": [dataclasses.asdict(r) for r in recommendations],
                    "warnings": warnings,
                }
            )
        )
        return 0
    print(f"{run.id}: trainer {run.spec.trainer}, cluster {run.spec.cluster}")
    print("measured:")
    for line in measurement_lines(measured):
        print(f"  {line}")
    print(f"recommended (margin {args.margin:g}):")
    for r in recommendations:
        print(f"  {r.line()}")
    judged = args.check or "the run's own spec"
    print(f"{judged} against these measurements:")
    for w in warnings or ["no timeout warnings"]:
        print(f"  {w}")
    return 0
