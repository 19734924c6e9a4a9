"""Sweeps: one ordinary run per point of a parameter grid, submitted with bounded concurrency.

``workbench.experiments.sweep(spec, grid={"lighthouse.heartbeat_timeout_ms": [500, 1000, 5000]})``
(or ``points=[{...}, ...]``, or ``random={key: [choices]}, n=, seed=``) resolves
and checks every point with ``load_spec`` and ``preflight`` before anything is
created, then writes the sweep directory and starts the sweep controller.

The data flow, one module each: ``points`` (the points and their specs) ->
``sweepdir`` (the sweep directory and ``sweep.json``) -> ``controller`` (the
detached process that submits the points' runs and logs point -> run dir) ->
``handle`` (:class:`Sweep`, a kernel's view and control of all that, from the
directory alone).

``max_parallel`` defaults to 1 locally (one run at a time keeps a small
machine's timings honest) and to every point on Slurm, whose queue does the
bounding.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from workbench.cluster import backend_class
from workbench.cluster import validate as cluster_validate
from workbench.errors import SpecError
from workbench.experiments.sweep import runner as controller
from workbench.experiments.sweep import sweepdir
from workbench.experiments.sweep.handle import SWEEP_TERMINAL, Sweep, attach_sweep
from workbench.experiments.sweep.points import expand_points, point_name, point_spec, validate_points
from workbench.experiments.sweep.sweepdir import SWEEP_JSON, SWEEPS_DIR, is_sweep_dir, list_sweeps, read_record
from workbench.spec.load import load_spec
from workbench.spec.models import Spec
from workbench.spec.preflight import preflight

__all__ = [
    "Sweep",
    "sweep",
    "attach_sweep",
    "list_sweeps",
    "is_sweep_dir",
    "read_record",
    "expand_points",
    "point_name",
    "point_spec",
    "validate_points",
    "SWEEP_JSON",
    "SWEEPS_DIR",
    "SWEEP_TERMINAL",
]


def sweep(
    spec: Union[str, os.PathLike, Mapping[str, Any], Spec, None] = "demo",
    overrides: Union[Sequence[str], Mapping[str, Any], None] = None,
    *,
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    points: Optional[Sequence[Mapping[str, Any]]] = None,
    random: Optional[Mapping[str, Sequence[Any]]] = None,
    n: Optional[int] = None,
    seed: int = 0,
    max_parallel: Optional[int] = None,
    lock: Union[str, os.PathLike, None] = None,
    lock_turn_s: float = 0.0,
) -> "Sweep":
    """Validate every point, write the sweep directory, start the sweep controller; returns at once.

    ``spec``/``overrides`` are the base, as for ``workbench.submit``. Keys of
    ``grid``/``points``/``random`` are dotted spec keys. Nothing is created or
    submitted unless every point is a valid spec. ``lock``: a file the sweep holds an exclusive
    ``flock`` on while any of its runs is going and lets go of between runs (``flock(1)``'s lock:
    heavy work on a shared machine takes turns with other users of the same file, run by run;
    ``lock_turn_s``: keep it across runs until a turn has lasted that long).
    """
    base = load_spec(spec, overrides)
    preflight(base)
    plist = expand_points(grid=grid, points=points, random=random, n=n, seed=seed)
    specs = validate_points(base, plist, grid)
    if max_parallel is None:
        max_parallel = 1 if backend_class(base.cluster).shares_this_machine else len(plist)
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise SpecError(f"max_parallel: expected an integer >= 1, got {max_parallel!r}")
    for s in specs:
        cluster_validate(s)
    for message in dict.fromkeys(m for s in specs for m in preflight(s)):
        warnings.warn(message, stacklevel=2)

    lock = str(Path(lock).expanduser().resolve()) if lock is not None else None
    if isinstance(lock_turn_s, bool) or not isinstance(lock_turn_s, (int, float)) or not 0 <= lock_turn_s <= 3600:
        raise SpecError(f"lock_turn_s: expected seconds from 0 to 3600, got {lock_turn_s!r}")
    sweep_dir = sweepdir.create(
        base, plist, max_parallel, grid=grid, random=random, n=n, seed=seed, lock=lock, lock_turn_s=lock_turn_s
    )
    return Sweep(sweep_dir, _controller=controller.start(sweep_dir))
