"""The fault matrix: every fault kind × setup, N trials each, as rates and phase distributions.

``workbench.matrix(faults="all", setups="real", trials=10)`` plans one *cell*
per (fault kind, setup) (``matrix_plan``: a setup is a trainer's config plus
overrides, its row label such as ``titan 1×2 local`` or ``maxtext ×2 slurm``;
``workbench.matrix("demo", faults=["kill", "hang"], trainers=["torchft-lite",
"ddp-restart"])`` is the older form, trainers × backends over one config) and,
for each cell that can run, ``trials`` runs, each with ONE fault at a step
drawn uniformly from the setup's window (and, for a replica kind, a random
target). The runs are the points of an ordinary sweep
(``workbench.experiments.sweep``: bounded parallelism, resumable, every run a
normal run directory); the sweep directory also holds ``matrix.json``, the
cells and which point is which trial, written once.

Each finished trial is one outcome, from its events alone:

=================== ==========================================================
recovered           the run completed, the victim took part again (the
                    timeline's ``participating`` milestone), and no other
                    group crashed
survivors_crashed   the run completed, but a group the fault did not target
                    ended unclean (``soak.unexplained_crashes``; elastic only)
unrecovered         the run completed without the victim taking part again
unaffected          the run completed, and the victim outlived a fault meant
                    to end it (a short ``slurmd_kill`` leaves running steps
                    be): no recovery to count, left out of the rate
run_failed          the run did not complete
not_injected        the fault never fired (the run ended first, say)
=================== ==========================================================

The rate is recovered over injected trials with a Wilson interval (scipy's
``binomtest(...).proportion_ci(method="wilson")``, imported when a table is
made: ``scipy.stats`` costs 1 s and 559 modules, measured, and ``workbench
matrix`` and the whole CLI import this module), and the recovery phases
(``analysis.recovery`` milestones: detected, quorum without the victim,
replacement started, healed or restored, first committed step) are given as
median and p95 seconds after the fault. A cell that cannot run says why
(``cannot inject on <backend>``, ``no <process> in <trainer>``, the setup's
spec error: ``matrix_plan``) and stays in the table; ``matrix_markdown``
renders the table for ``docs/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import analysis
from workbench.analysis.recovery import UNPLANNED
from workbench.errors import SpecError
from workbench.events.reader import EventReader
from workbench.experiments.matrix_markdown import NOT_COUNTED, OUTCOMES, render
from workbench.experiments.matrix_plan import Setup, plan, setups_from, setups_of
from workbench.experiments.soak import unexplained_crashes
from workbench.experiments.sweep import Sweep, attach_sweep, sweep
from workbench.run.rundir import write_json_text
from workbench.spec.load import load_spec
from workbench.spec.models import Spec
from workbench.state.run_status import run_state_of
from workbench.trainers.registry import trainer_kind

MATRIX_JSON = "matrix.json"
PHASES = {
    "detect": "detected",
    "quorum_without": "quorum_without_victim",
    "replacement": "replacement_started",
    "healed_or_restored": "heal_done",
    "first_step": "participating",
}


def matrix(
    spec: Union[str, os.PathLike, Mapping[str, Any], Spec, None] = "demo",
    overrides: Union[Sequence[str], Mapping[str, Any], None] = None,
    *,
    faults: Union[str, Sequence[str]] = ("kill", "hang", "preempt", "abort"),
    trainers: Union[str, Sequence[str], None] = None,
    backends: Union[str, Sequence[str], None] = None,
    setups: Union[str, Sequence[Union[str, Setup]], None] = None,
    trials: int = 10,
    window: Optional[tuple[int, int]] = None,
    seed: int = 0,
    seconds: Optional[float] = None,
    max_parallel: Optional[int] = None,
    lock: Union[str, os.PathLike, None] = None,
    lock_turn_s: float = 0.0,
) -> "Matrix":
    """Plan the matrix, check every trial's spec, start its sweep; returns at once (see the module docstring).

    The rows are ``setups`` (a name in ``matrix_plan.SETUP_GROUPS`` such as ``"real"``, or a list of
    ``Setup``/``"config key=value ..."``), each from its own config; without them, ``trainers`` ×
    ``backends`` over ``spec`` (``overrides`` apply to those only). ``seconds``: how long a fault that
    lasts (``hang``) lasts (default: the kind's). ``lock``: a file the sweep holds a ``flock`` on run by
    run, or for turns of ``lock_turn_s`` (``workbench.experiments.sweep``). ``max_parallel`` defaults to 1 on
    every backend, Slurm too: a trial measures seconds to recovery, which trials beside it distort (a sweep's
    own default runs every Slurm point at once; the dev cluster's nodes share this machine's two cores: 21
    trials started together took the load to 23).
    """
    if setups is not None:
        if trainers is not None or backends is not None or overrides:
            raise SpecError("setups: give setups, or trainers/backends over one config, not both")
        rows = setups_of(setups)
    else:
        base = load_spec(spec, overrides)
        rows = setups_from(load_spec(base.to_dict(), {"faults": [], "chaos": None}), trainers, backends)
    base, cells, points = plan(faults, rows, trials, window, seed, seconds)
    if base is None or not points:
        raise SpecError(
            "matrix: no cell can run: " + "; ".join(f"{c['fault']} × {c['setup']}: {c['why_not']}" for c in cells)
        )
    sw = sweep(base, points=points, max_parallel=max_parallel or 1, lock=lock, lock_turn_s=lock_turn_s)
    write_json_text(
        sw.sweep_dir / MATRIX_JSON,
        json.dumps(
            {
                "cells": cells,
                "trials": trials,
                "window": window,
                "seed": seed,
                "setups": setups if isinstance(setups, str) else None,
                "faults": faults if isinstance(faults, str) else ",".join(faults),
            },
            indent=1,
        )
        + "\n",
    )
    return Matrix(sw.sweep_dir, sweep=sw)


def attach_matrix(matrix_dir: Union[str, os.PathLike]) -> "Matrix":
    if not (Path(matrix_dir) / MATRIX_JSON).is_file():
        raise SpecError(f"matrix_dir: {str(matrix_dir)!r} is not a matrix directory (no {MATRIX_JSON})")
    return Matrix(matrix_dir)


def trial_outcome(events: list[dict], elastic: bool) -> dict:
    """One trial's outcome and recovery phases (seconds after the fault), from its events alone."""
    timeline = analysis.recovery_timeline(events)
    timeline = timeline[timeline["action"] != UNPLANNED]  # the trial's own fault, not a crash beside it
    row = timeline.iloc[0] if len(timeline) else None
    out = {name: (float(row[col]) if row is not None else np.nan) for name, col in PHASES.items()}
    if run_state_of(events) != "completed":
        out["outcome"] = "run_failed"
    elif row is None:
        out["outcome"] = "not_injected"
    elif elastic and unexplained_crashes(events):
        out["outcome"] = "survivors_crashed"
    elif np.isnan(out["first_step"]) and analysis.ends_process(timeline).iloc[0] and not isinstance(row["cause"], str):
        out["outcome"] = "unaffected"  # the fault was to end it, and the fold found no end it caused
    else:
        # Not the row's ``complete``: with min_replicas = replicas no quorum forms without a
        # paused victim, so a hang that carried on lacks that milestone and still recovered.
        out["outcome"] = "recovered" if not np.isnan(out["first_step"]) else "unrecovered"
    out["injected"] = row is not None
    return out


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (np.nan, np.nan)
    from scipy.stats import binomtest  # 1 s: see the module docstring

    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(ci.low), float(ci.high)


class Matrix:
    """A matrix's sweep directory: its cells, its trials' outcomes, the per-cell table and figures."""

    def __init__(self, matrix_dir, sweep: Optional[Sweep] = None) -> None:
        self.sweep = sweep or attach_sweep(matrix_dir)
        self.matrix_dir = self.sweep.sweep_dir
        self.record = json.loads((Path(self.matrix_dir) / MATRIX_JSON).read_text())
        self.cells = self.record["cells"]
        self._cache: dict[str, tuple[int, dict]] = {}

    def wait(self, timeout: Optional[float] = None) -> pd.DataFrame:
        self.sweep.wait(timeout)
        return self.table()

    def stop(self) -> pd.DataFrame:
        self.sweep.stop()
        return self.table()

    def resume(self) -> "Matrix":
        self.sweep.resume()
        return self

    def state(self) -> str:
        return self.sweep.state()

    def trials(self) -> pd.DataFrame:
        """One row per trial: its cell, fault step, run directory, outcome and phase seconds."""
        runs = self.sweep.runs()
        points = self.sweep.points
        rows = []
        for c in self.cells:
            elastic = bool(c["points"]) and trainer_kind(c["trainer"]).elastic
            for trial, p in enumerate(c["points"]):
                run = runs.get(p)
                row = {
                    "cell": c["cell"],
                    "fault": c["fault"],
                    "setup": c.get("setup"),
                    "trainer": c["trainer"],
                    "backend": c["backend"],
                    "trial": trial,
                    "point": p,
                    "at_step": points[p]["faults"][0]["at_step"],
                    "target": points[p]["faults"][0].get("target"),
                    "run_dir": str(run.run_dir) if run is not None else None,
                }
                # a stopped trial (the matrix's stop, a person's) is no result: it counts as not run
                if run is not None and run.state() in ("completed", "failed"):
                    row.update(self._outcome(run.run_dir, elastic))
                else:
                    row.update({"outcome": None, "injected": None, **dict.fromkeys(PHASES, np.nan)})
                rows.append(row)
        return pd.DataFrame(
            rows,
            columns=[
                "cell",
                "fault",
                "setup",
                "trainer",
                "backend",
                "trial",
                "point",
                "at_step",
                "target",
                "run_dir",
                "outcome",
                "injected",
                *PHASES,
            ],
        )

    def _outcome(self, run_dir, elastic: bool) -> dict:
        key = str(run_dir)
        events_dir = Path(run_dir) / "events"
        size = sum(p.stat().st_size for p in events_dir.glob("*.jsonl"))
        if key not in self._cache or self._cache[key][0] != size:
            self._cache[key] = (size, trial_outcome(EventReader(run_dir).poll(), elastic))
        return self._cache[key][1]

    def table(self, trials: Optional[pd.DataFrame] = None) -> pd.DataFrame:
        """One row per cell: counts per outcome, recovery rate with its Wilson interval, phases (median, p95).

        ``trials``: a ``trials()`` frame taken earlier (before a stop, say); default: now.
        """
        trials = self.trials() if trials is None else trials
        rows = []
        for c in self.cells:
            t = trials[trials["cell"] == c["cell"]]
            done = t[t["outcome"].notna()]
            row = {
                "fault": c["fault"],
                "setup": c.get("setup") or f"{c['trainer']} / {c['backend']}",
                "trainer": c["trainer"],
                "backend": c["backend"],
                "why_not": c.get("why_not"),
                "status": c.get("why_not") or ("done" if len(done) == len(t) else f"{len(done)}/{len(t)} done"),
                "trials": len(t),
                **{o: int((done["outcome"] == o).sum()) for o in OUTCOMES},
            }
            n = len(done) - sum(row[o] for o in NOT_COUNTED)
            row["rate"] = row["recovered"] / n if n else np.nan
            row["ci_low"], row["ci_high"] = wilson(row["recovered"], n)
            for name in PHASES:
                values = done[name].dropna()
                row[f"{name}_median_s"] = float(values.median()) if len(values) else np.nan
                row[f"{name}_p95_s"] = float(values.quantile(0.95)) if len(values) else np.nan
            rows.append(row)
        return pd.DataFrame(rows)

    def cell_timelines(self, fault: str, trainer: str, backend: Optional[str] = None) -> pd.DataFrame:
        """The recovery timeline rows of one cell's trials (one fault each), with their run directories;
        ``trainer`` is a trainer's name or a setup's label."""
        trials = self.trials()
        pick = (trials["fault"] == fault) & ((trials["trainer"] == trainer) | (trials["setup"] == trainer))
        if backend is not None:
            pick &= trials["backend"] == backend
        frames = []
        for r in trials[pick & trials["run_dir"].notna()].itertuples():
            tl = analysis.recovery_timeline(EventReader(r.run_dir).poll())
            frames.append(tl.assign(trial=r.trial, run_dir=r.run_dir, outcome=r.outcome))
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=analysis.recovery.COLUMNS)

    def heatmap(self, value: str = "rate"):
        return heatmap_figure(self.table(), value)

    def markdown(self, title: Optional[str] = None, level: int = 1, note: Optional[str] = None) -> str:
        """The table as the markdown ``docs/matrix.md`` holds (``matrix_markdown``)."""
        table, trials = self.table(), self.trials()
        return render(table, self.record, trials, title=title, matrix_dir=self.matrix_dir, level=level, note=note)


def heatmap_figure(table: pd.DataFrame, value: str = "rate"):
    """Fault kinds (rows) × setups (columns), coloured by ``value`` (``rate``, ``first_step_p95_s``, ...);
    a cell that cannot run is blank with its reason as text."""
    cols = list(dict.fromkeys(table["setup"]))
    rows = list(dict.fromkeys(table["fault"]))
    z = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    for r in table.itertuples():
        i, j = rows.index(r.fault), cols.index(r.setup)
        v = getattr(r, value)
        if isinstance(r.why_not, str):
            text[i][j] = r.why_not
            continue
        z[i, j] = v
        n = r.trials - sum(getattr(r, o) for o in NOT_COUNTED)
        if value == "rate":
            text[i][j] = f"{r.recovered}/{n} [{r.ci_low:.2f}, {r.ci_high:.2f}]" if n else "no trial yet"
        else:
            text[i][j] = "" if np.isnan(v) else f"{v:.1f} s"
    title = "recovery rate (Wilson 95%)" if value == "rate" else value.replace("_", " ")
    z = [[None if np.isnan(v) else float(v) for v in row] for row in z]  # plain lists: a gap is null in the JSON
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=cols,
            y=rows,
            text=text,
            texttemplate="%{text}",
            colorscale="RdYlGn" if value == "rate" else "Viridis",
            zmin=0 if value == "rate" else None,
            zmax=1 if value == "rate" else None,
            hoverongaps=True,
        )
    )
    fig.update_layout(title=title, height=120 + 60 * len(rows), yaxis=dict(autorange="reversed"))
    return fig
