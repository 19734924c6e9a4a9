"""Replay: run an experiment again, from its record, with the same faults.

``run.json`` holds the fully resolved spec, and the resolved spec's ``faults``
list is the run's whole fault schedule (a chaos spec is drawn into it at
submit, so random faults replay as the faults that were drawn). A replay
submits that spec again under the name ``<name>-replay`` (a new run id).

Faults injected by hand (``origin`` api, cli or button) are not in the spec;
with ``manual_faults=True`` (the default) each one is added to the replay's
schedule at the step it hit in the original (the highest committed step when
it fired), so a kill clicked in a dashboard replays too. Watchdog faults are
reactions, not inputs, and are not replayed.

The replay's directory gets ``replay.json`` (``of``: the original's run id
and directory, ``added_faults``), next to its own ``run.json``.
"""

from __future__ import annotations

import os
from typing import Union

from workbench.analysis.compare import fault_steps
from workbench.errors import SpecError
from workbench.faults import kinds as faultkinds
from workbench.run import rundir
from workbench.run.handle import Run, as_run, submit
from workbench.spec.load import load_spec

REPLAY_JSON = "replay.json"
MANUAL_ORIGINS = ("api", "cli", "button")


def replay_name(name: str) -> str:
    base = name[: -len("-replay")] if name.endswith("-replay") else name
    return base[: 64 - len("-replay")] + "-replay"


def hand_injected_faults(run: Run) -> list[dict]:
    """The original's hand-injected faults as scheduled faults (``at_step``: the step they hit)."""
    out = []
    for f in fault_steps(run).itertuples():
        kind = faultkinds.kind(f.action)
        if f.origin not in MANUAL_ORIGINS or kind is None:
            continue
        fault = {"action": f.action, "at_step": int(f.step)}
        if kind.targets == "replica":
            fault["target"] = int(f.target)
        if kind.has_duration and f.seconds is not None and f.seconds == f.seconds:
            fault["seconds"] = float(f.seconds)
        out.append(fault)
    return out


def replay_spec(run: Union[Run, str, os.PathLike], include_manual: bool = True) -> tuple[dict, list[dict]]:
    """The replay's spec (as a dict) and the hand-injected faults added to its schedule."""
    run = as_run(run)
    spec = dict(run.record["spec"])
    added = hand_injected_faults(run) if include_manual else []
    spec["name"] = replay_name(spec["name"])
    spec["faults"] = list(spec.get("faults") or []) + added
    try:
        load_spec(spec)
    except SpecError as e:
        raise SpecError(f"replay of {run.id}: its recorded spec no longer validates: {e}") from None
    return spec, added


def replay(run_or_dir: Union[Run, str, os.PathLike], manual_faults: bool = True) -> Run:
    """Submit a new run with the original's resolved spec and faults; returns at once."""
    original = as_run(run_or_dir)
    spec, added = replay_spec(original, include_manual=manual_faults)
    new = submit(spec)
    rundir.write_json(
        new.run_dir / REPLAY_JSON,
        {"of": {"run_id": original.id, "run_dir": str(original.run_dir)}, "added_faults": added},
    )
    return new
