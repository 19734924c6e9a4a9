"""The fault matrix's plan: which setups, which cells, which trials; pure, nothing created.

A *setup* is one way to run a trainer: a config plus overrides, named by a
label that reads like a row of the table (``titan 1×2 local``: one node, two
ranks per replica group, the local backend; ``maxtext ×2 slurm``: one job of
two processes on Slurm). A matrix crosses fault kinds with setups; each
(fault kind, setup) is a *cell*, and each runnable cell gets ``trials`` trials
of one fault each, at a step drawn uniformly from the setup's window (and, for
a replica kind, a random target).

A cell that cannot run stays in the table with the reason, the first of:

- the setup's spec does not load (a config or trainer that is not there: the
  spec's one-line error);
- ``cannot inject on <backend>`` (the kind's ``backends``);
- ``no <process> in <trainer>`` (the trainer's row has no such process);
- ``no lighthouse in <trainer>`` (a checkpoint-restart trainer runs none);
- the trial spec's own refusal (the spec's validation of that fault).

Every trial is a point of one sweep over the first runnable setup's spec: a
point holds the top-level spec keys in which its setup differs from that base
(a whole section where it differs) and its name (``<config's name>-p<i>``), so
every trial's run directory is a normal run of its setup's spec plus one fault.
The trials go round by round (every cell's first, then every cell's second):
a matrix stopped early, or one still going, has every cell's first trials.

:data:`SETUP_GROUPS` holds the named setup lists (``workbench matrix --setups
real``): ``real`` is the matrix over the seed's own stack (issue 40), ``real-local`` and
``real-slurm`` its local and its Slurm rows (the latter needs the cluster up when it starts).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from workbench.cluster import backend_names
from workbench.errors import SpecError
from workbench.experiments.sweep.points import point_name
from workbench.faults import kinds as faultkinds
from workbench.spec.load import load_spec, parse_override
from workbench.spec.models import Spec
from workbench.trainers.registry import trainer_kind, trainer_names


@dataclasses.dataclass(frozen=True)
class Setup:
    """One row group of the matrix: ``config`` plus ``overrides``, its ``label`` (None: from the spec) and
    the ``window`` of steps the fault is drawn from (None: the matrix's, else steps/5 .. steps/2)."""

    config: Union[str, os.PathLike, Mapping[str, Any], Spec]
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    label: Optional[str] = None
    window: Optional[tuple[int, int]] = None


# Steps and windows: the fault lands after the groups' first steps and leaves the survivors enough
# steps to still be training when the victim is back (TorchTitan: 13-35 s replacement, issue 40).
_TITAN = {"steps": 300, "faults": [], "titan.overrides": {"training.seq_len": 64}}
_REAL_LOCAL = (
    Setup("titan-cpu-light", {**_TITAN, "nproc_per_replica": 2}, "titan 1×2 local", (20, 60)),
    Setup(
        "titan-restart-cpu",
        {"steps": 300, "faults": [], "titan.config": "titan-cpu-tiny.toml", "titan.overrides": {}},
        "titan-restart ×2 local",
        (20, 60),
    ),
    Setup("maxtext-cpu-tiny", {"steps": 200, "faults": []}, "maxtext ×1 local", (30, 100)),
)
_REAL_SLURM = (  # 4 CPUs a task: a whole dev-cluster node, so a node fault hits one group's task only
    Setup(
        "titan-cpu-light",
        {**_TITAN, "cluster": "slurm", "slurm.nodes": 2, "slurm.cpus_per_task": 4, "slurm.time_min": 20},
        "titan 2×1 slurm",
        (20, 60),
    ),
    Setup(
        "maxtext-cpu-tiny",
        {"steps": 200, "faults": [], "cluster": "slurm", "slurm.nodes": 2, "max_restarts": 2},
        "maxtext ×2 slurm",
        (30, 100),
    ),
)
SETUP_GROUPS: dict[str, tuple[Setup, ...]] = {
    "real": _REAL_LOCAL + _REAL_SLURM,
    "real-local": _REAL_LOCAL,
    "real-slurm": _REAL_SLURM,
}


def parse_setup(text: str) -> Setup:
    """``"titan-cpu-light nproc_per_replica=2 label='titan 1×2 local'"`` -> a Setup (shell-style words:
    the config, then ``key=value`` overrides; ``label=`` and ``window=FIRST:LAST`` are the setup's own)."""
    words = shlex.split(text)
    if not words or "=" in words[0]:
        raise SpecError(
            f"setup {text!r}: expected a config then key=value overrides, e.g. 'titan-cpu nproc_per_replica=2'"
        )
    overrides, label, window = {}, None, None
    for w in words[1:]:
        key, _, raw = w.partition("=")
        if key.strip() == "label":  # both taken as written: YAML reads 5:9 as the base-60 number 309
            label = raw
        elif key.strip() == "window":
            window = parse_window(raw, f"setup {text!r}: window")
        else:
            key, value = parse_override(w)
            overrides[key] = value
    return Setup(words[0], overrides, label, window)


def parse_window(text: str, what: str = "window") -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi)
    except ValueError:
        raise SpecError(f"{what}: expected FIRST:LAST steps such as 5:15, got {text!r}") from None


def setups_of(value: Union[str, Sequence[Union[str, Setup]]]) -> list[Setup]:
    """A group's name (:data:`SETUP_GROUPS`) or a list of Setups / ``parse_setup`` strings."""
    if isinstance(value, str):
        if value not in SETUP_GROUPS:
            raise SpecError(f"setups: {value!r} not known; allowed: {', '.join(SETUP_GROUPS)} or a list of setups")
        return list(SETUP_GROUPS[value])
    out = [s if isinstance(s, Setup) else parse_setup(str(s)) for s in value]
    if not out:
        raise SpecError("setups: give at least one")
    return out


def label_of(spec: Spec) -> str:
    """``titan 1×2 local`` (an elastic trainer: nodes × ranks per group), ``maxtext ×2 slurm`` (a one-job
    trainer: its processes)."""
    if trainer_kind(spec.trainer).elastic:
        shape = f"{spec.slurm.nodes}×{spec.nproc_per_replica}"
    else:
        shape = f"×{spec.slurm.nodes * spec.slurm.tasks_per_node}"
    return f"{spec.trainer} {shape} {spec.cluster}"


def resolve(setup: Setup) -> tuple[str, Optional[Spec], Optional[str]]:
    """The setup's label, its spec without faults or chaos, or why it has none (one line)."""
    try:
        spec = load_spec(setup.config, dict(setup.overrides))
        spec = load_spec(spec.to_dict(), {"faults": [], "chaos": None})
    except SpecError as e:
        return setup.label or f"{setup.config}", None, str(e)
    return setup.label or label_of(spec), spec, None


def names(value, what: str, allowed: Sequence[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value or [])
    items = [str(v).strip() for v in items if str(v).strip()]
    if items == ["all"]:
        return list(allowed)
    if not items:
        raise SpecError(f"{what}: give at least one; allowed: {', '.join(allowed)} (or all)")
    bad = [v for v in items if v not in allowed]
    if bad:
        raise SpecError(f"{what}: {', '.join(map(repr, bad))} not known; allowed: {', '.join(allowed)} (or all)")
    return list(dict.fromkeys(items))


def why_not(fault: str, spec: Spec) -> Optional[str]:
    """Why one fault of ``fault`` cannot be a trial of ``spec`` (None: it can)."""
    kind, tk = faultkinds.KINDS[fault], trainer_kind(spec.trainer)
    if not kind.supported_on(spec.cluster):
        return f"cannot inject on {spec.cluster}"
    if not kind.supported_by(tk):
        return f"no {kind.process} in {spec.trainer}"
    if kind.targets == "lighthouse" and not tk.elastic:
        return f"no lighthouse in {spec.trainer} (checkpoint-restart)"
    return None


def diff(spec: dict, base: dict) -> dict:
    """The top-level keys in which ``spec`` differs from ``base``, with ``spec``'s values."""
    return {k: v for k, v in spec.items() if base.get(k) != v}


def plan(
    faults,
    setups: Sequence[Setup],
    trials: int = 10,
    window: Optional[tuple[int, int]] = None,
    seed: int = 0,
    seconds: Optional[float] = None,
) -> tuple[Optional[Spec], list[dict], list[dict]]:
    """The sweep's base spec (None: no setup loads), the cells and the points (one per trial)."""
    faults = names(faults, "faults", faultkinds.names())
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise SpecError(f"trials: expected an integer >= 1, got {trials!r}")
    resolved = [resolve(s) for s in setups]
    labels = [label for label, _, _ in resolved]
    if len(set(labels)) < len(labels):
        raise SpecError(f"setups: two with one label ({', '.join(labels)}); give each a label=")
    base = next((spec for _, spec, _ in resolved if spec is not None), None)
    base_dict = base.to_dict() if base is not None else {}
    windows = {}
    for setup, (label, spec, _) in zip(setups, resolved):
        if spec is None:
            continue
        lo, hi = setup.window or window or (max(1, spec.steps // 5), max(1, spec.steps // 2))
        if not 1 <= lo <= hi < spec.steps:
            raise SpecError(f"window of {label}: expected 1 <= first <= last < steps ({spec.steps}), got {lo}:{hi}")
        windows[label] = (lo, hi)
    rng = np.random.default_rng(seed)
    cells: list[dict] = []
    for fault in faults:
        for label, spec, broken in resolved:
            cell = {"cell": len(cells), "fault": fault, "setup": label, "points": []}
            cells.append(cell)
            if spec is None:
                cell.update(trainer=None, backend=None, why_not=broken)
                continue
            cell.update(trainer=spec.trainer, backend=spec.cluster)
            reason = why_not(fault, spec)
            if reason is None:
                try:  # the spec's own word on this fault (a trial draws the same fields)
                    load_spec(spec.to_dict(), {"faults": [{"action": fault, "at_step": windows[label][0]}]})
                except SpecError as e:
                    reason = str(e)
            if reason is not None:
                cell["why_not"] = reason
    # Round by round (trial 1 of every cell, then trial 2, ...), each round setup by setup: a matrix
    # stopped early has every cell's first trials, not all of a few cells'.
    points: list[dict] = []
    for _trial in range(trials):
        for label, spec, _ in resolved:
            if spec is None:
                continue
            own = diff(spec.to_dict(), base_dict)
            lo, hi = windows[label]
            for cell in (c for c in cells if c["setup"] == label and "why_not" not in c):
                kind = faultkinds.KINDS[cell["fault"]]
                f = {"action": cell["fault"], "at_step": int(rng.integers(lo, hi + 1))}
                if kind.targets == "replica":
                    f["target"] = int(rng.integers(spec.replicas))
                if kind.has_duration and seconds is not None:
                    f["seconds"] = float(seconds)
                cell["points"].append(len(points))
                points.append({**own, "name": point_name(spec.name, len(points)), "faults": [f]})
    return base, cells, points


def setups_from(base: Spec, trainers=None, backends=None) -> list[Setup]:
    """The setups of ``trainers`` × ``backends`` over one base spec (the matrix's older form), labelled
    ``<trainer> / <backend>``."""
    trainers = names(trainers or [base.trainer], "trainers", trainer_names())
    backends = names(backends or [base.cluster], "backends", backend_names())
    d = base.to_dict()
    return [Setup(d, {"trainer": t, "cluster": b}, label=f"{t} / {b}") for t in trainers for b in backends]
