"""A fault matrix as markdown for ``docs/``: ``workbench matrix --attach DIR --markdown docs/matrix.md``.

Pure: it takes the matrix's per-cell table (``Matrix.table()``), its record
(``matrix.json``) and its trials (``Matrix.trials()``), and writes nothing.
Three parts: the grid (fault kinds × setups: recovered/injected, or the short
reason a cell cannot run), one table per setup (outcomes, the rate with its
Wilson 95% interval, each recovery phase's median and p95 in seconds after the
fault, the N each figure stands on), and the reasons in full. Every figure says
how many trials it comes from: a cell that ran fewer trials than planned (a
stopped matrix) shows ``k/planned``.
"""

from __future__ import annotations

import math
from typing import Optional

import pandas as pd

PHASE_TITLES = {
    "detect": "detected",
    "quorum_without": "quorum without victim",
    "replacement": "replacement started",
    "healed_or_restored": "healed / restored",
    "first_step": "first step (participating)",
}
OUTCOMES = ("recovered", "survivors_crashed", "unrecovered", "unaffected", "run_failed", "not_injected")
"""A trial's outcomes (``workbench.experiments.matrix`` says each), a column each in the per-cell table."""
NOT_COUNTED = ("not_injected", "unaffected")  # outcomes a cell's recovery rate leaves out
SHORT_WHY = (("cannot inject on", "backend"), ("no lighthouse", "no lighthouse"), ("no ", "no target process"))


def _s(v) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"


def _short(why: str) -> str:
    for prefix, short in SHORT_WHY:
        if why.startswith(prefix):
            return f"n/a ({short})"
    return "n/a (spec)"


def _counted(r) -> int:
    """The finished trials a cell's rate is over."""
    return int(r.trials) - sum(int(getattr(r, o)) for o in NOT_COUNTED) - _pending(r)


def _rate(r) -> str:
    n = _counted(r)
    if n <= 0:
        return "pending" if _pending(r) else "none needed" if int(r.unaffected) else "no trial"
    return f"{int(r.recovered)}/{n} = {r.rate:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"


def _pending(r) -> int:
    """The trials of a cell with no outcome yet."""
    return int(r.trials) - sum(int(getattr(r, o)) for o in OUTCOMES)


def grid(table: pd.DataFrame) -> str:
    setups = list(dict.fromkeys(table["setup"]))
    faults = list(dict.fromkeys(table["fault"]))
    at = {(r.fault, r.setup): r for r in table.itertuples()}
    lines = ["| fault | " + " | ".join(setups) + " |", "|---|" + "---|" * len(setups)]
    for f in faults:
        cells = []
        for s in setups:
            r = at[(f, s)]
            if isinstance(r.why_not, str):
                cells.append(_short(r.why_not))
            else:
                n = _counted(r)
                cells.append(f"**{int(r.recovered)}/{n}**" if n > 0 else "unaffected" if r.unaffected else "pending")
        lines.append(f"| `{f}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def setup_table(rows: pd.DataFrame, trials: Optional[pd.DataFrame] = None) -> str:
    head = ["fault", "N (done/planned)", "recovered [Wilson 95%]", "other outcomes"]
    head += [f"{t} med / p95 s" for t in PHASE_TITLES.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows.itertuples():
        if isinstance(r.why_not, str):
            continue
        others = [
            f"{o.replace('_', ' ')} {int(getattr(r, o))}"
            for o in ("survivors_crashed", "unrecovered", "unaffected", "run_failed", "not_injected")
            if int(getattr(r, o))
        ]
        done = int(r.trials) - _pending(r)
        phases = []
        for name in PHASE_TITLES:
            med, p95 = getattr(r, f"{name}_median_s"), getattr(r, f"{name}_p95_s")
            n = ""
            if trials is not None:
                col = trials[(trials["fault"] == r.fault) & (trials["setup"] == r.setup)][name]
                k = int(col.notna().sum())
                n = f" (n={k})" if k and k != done else ""
            phases.append(f"{_s(med)} / {_s(p95)}{n}")
        lines.append(
            f"| `{r.fault}` | {done}/{int(r.trials)} | {_rate(r)} | {', '.join(others) or '–'} | "
            + " | ".join(phases)
            + " |"
        )
    return "\n".join(lines)


def render(
    table: pd.DataFrame,
    record: dict,
    trials: Optional[pd.DataFrame] = None,
    title: Optional[str] = None,
    matrix_dir=None,
    level: int = 1,
    note: Optional[str] = None,
) -> str:
    """The whole page: what ran, the grid, a table per setup, why each other cell did not run.

    ``level``: the title's heading level (2: one matrix run of several on one page); ``note``: a paragraph
    after the first (the machine, its load, what else ran)."""
    h1, h2 = "#" * level, "#" * (level + 1)
    out = [f"{h1} {title or 'The fault matrix'}", ""]
    planned = record.get("trials")
    ran = table[table["why_not"].isna()]
    out.append(
        f"One `workbench matrix` run{f' (`{matrix_dir}`)' if matrix_dir else ''}: "
        f"{len(table)} cell{'' if len(table) == 1 else 's'} ({len(ran)} that can run), "
        f"{planned} trial{'' if planned == 1 else 's'} planned "
        "per runnable cell, "
        f"seed {record.get('seed')}. Each trial is one run with one fault at a step drawn from its setup's "
        "window. A cell's N is the trials that finished; its rate is recovered over injected trials, with "
        "the Wilson 95% interval; phases are seconds from the fault to each recovery milestone, median / p95 "
        "over the trials that reached it (a different n is given beside the figure)."
    )
    if note:
        out += ["", note]
    if record.get("setups"):
        out += [
            "",
            f"Made by `workbench matrix --setups {record['setups']} --faults {record.get('faults')} "
            f"--trials {planned} --seed {record.get('seed')} --markdown ...` (setups: "
            "`workbench/experiments/matrix_plan.py`).",
        ]
    if trials is not None and len(trials) and trials["run_dir"].notna().any():
        out.append("")
        out.append(f"Trials that finished: {int(trials['outcome'].notna().sum())} of {len(trials)} planned.")
    out += ["", f"{h2} The grid (recovered / injected)", "", grid(table), ""]
    for setup in dict.fromkeys(table["setup"]):
        rows = table[table["setup"] == setup]
        if rows["why_not"].isna().any():
            out += [f"{h2} {setup}", "", setup_table(rows, trials), ""]
    why = table[table["why_not"].notna()]
    if len(why):
        out += [f"{h2} Cells that cannot run, and why", "", "| setup | fault | why not |", "|---|---|---|"]
        out += [f"| {r.setup} | `{r.fault}` | {str(r.why_not).replace('|', '/')} |" for r in why.itertuples()]
        out.append("")
    return "\n".join(out)
