"""``workbench why RUN``: why each attempt of a run ended, with the evidence.

Every ended attempt (or those ``--replica``/``--attempt`` pick), in the order they ended, as the run-state
fold joined it (``workbench.state.causes``): its cause in one line, whether it was planned or injected,
what the trainer's ``exit`` and the controller's ``job`` said (exit code or signal, OOM killer, Slurm's
state and node, the processes of a group and which failed first), the exception's frames, and the last
``--lines`` lines of each of the job's log files, read from the run directory (the ``job`` event's
``log``; a path that leads outside the run directory is not read). Where the files are gone, the lines
the ``job`` event kept are shown instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from workbench.controller.job_end import file_tail
from workbench.run.handle import attach
from workbench.state.causes import EndCause

MAX_LINES = 1000
TAIL_BYTES = 256 * 1024


def cmd_why(args) -> int:
    if not 0 <= args.lines <= MAX_LINES:
        raise ValueError(f"--lines: {args.lines}; allowed: 0-{MAX_LINES}")
    run = attach(args.run)
    run.refresh()
    groups = max(run.run_state.groups, len(run.run_state.replicas))
    if args.replica is not None and not 0 <= args.replica < groups:
        raise ValueError(f"--replica: {args.replica}; allowed: 0..{groups - 1}")
    if args.attempt is not None and args.attempt < 0:
        raise ValueError(f"--attempt: {args.attempt}; allowed: 0 or more")
    ends = [
        c
        for c in run.run_state.ends
        if (args.replica is None or c.replica == args.replica) and (args.attempt is None or c.attempt == args.attempt)
    ]
    if not ends:
        picked = "".join(
            f" {name} {value}"
            for name, value in (("replica", args.replica), ("attempt", args.attempt))
            if value is not None
        )
        print(f"{run.id}: no ended attempt{picked}")
        return 0
    t0 = run.run_state.t0
    for i, end in enumerate(ends):
        if i:
            print()
        for line in describe(end, run.run_dir, args.lines, t0):
            print(line)
    return 0


def describe(end: EndCause, run_dir: Path, lines: int, t0: Optional[float] = None) -> list[str]:
    """The lines ``workbench why`` prints for one ended attempt."""
    kind = "planned" if end.planned else "injected" if end.injected else "unplanned"
    out = [
        f"replica {end.replica} attempt {end.attempt}: {end.summary()}  [{kind}"
        + (f": {end.cause()}]" if kind == "unplanned" else "]")
    ]
    if end.t is not None:
        when = f"{end.t - t0:.1f} s into the run" if t0 is not None else f"at t={end.t:.3f}"
        seen = f"; its job seen gone {end.job_t - end.t:.2f} s later" if end.job_t is not None else ""
        out.append(f"  ended      {when}{seen}")
    if end.injected:
        f = end.injected
        out.append(f"  fault      {f['kind']} (origin {f['origin']}, target {f['target']}, node {f['node'] or '-'})")
    facts = [
        f"{name} {value}"
        for name, value in (
            ("reason", end.reason),
            ("signal", end.signal),
            ("exit code", end.exit_code),
            ("oom", end.oom),
            ("slurm", end.slurm_state),
            ("slurm exit code", end.slurm_exit_code),
            ("node", end.node),
            ("step", end.step),
        )
        if value is not None
    ]
    if facts:
        out.append("  said       " + ", ".join(facts))
    if end.error and not end.exception:
        out.append(f"  error      {end.error}")
    for p in end.processes or []:
        how = p["signal"] or (f"exit code {p['exit_code']}" if p["exit_code"] is not None else "?")
        first = "  (failed first)" if p["rank"] == end.first_failed else ""
        out.append(f"  rank {p['rank']}     {how}{first}")
    if end.first_failed is not None and not end.processes:
        out.append(f"  rank {end.first_failed} failed first")
    if end.exception:
        exc = end.exception
        source = f" (from the {end.exception_source})" if end.exception_source else ""
        out.append(f"  exception  {exc['type']}: {exc['message']}{source}")
        for fr in exc["frames"]:
            out.append(f'    File "{fr["file"]}", line {fr["line"]}, in {fr["function"]}')
    if lines:
        out += log_lines(end, run_dir, lines)
    return out


def log_lines(end: EndCause, run_dir: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of each of the job's log files; the ``job`` event's ``last_lines`` without any."""
    out: list[str] = []
    root = Path(run_dir).resolve()
    for name in end.log:
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            out.append(f"  log {name}: outside the run directory, not read")
            continue
        text = file_tail(path, TAIL_BYTES) if path.is_file() else None
        if text is None:
            out.append(f"  log {name}: gone")
            continue
        got = text.splitlines()[-lines:]
        out.append(f"  last {len(got)} lines of {name}:")
        out += [f"    {line}" for line in got]
    if not any(line.startswith("  last ") for line in out) and end.last_lines:
        got = end.last_lines[-lines:]
        out.append(f"  last {len(got)} lines the job wrote (its job event):")
        out += [f"    {line}" for line in got]
    return out
