"""A sweep's points: the grid, the given list or the random draw, and each point's resolved spec.

A point is a ``{dotted spec key: value}`` dict applied over the sweep's base
spec; point ``i`` is the run named ``<base name>-p<i>``. Everything here is
pure: it checks and resolves, and creates nothing.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from workbench.errors import SpecError
from workbench.spec.load import load_spec
from workbench.spec.models import Spec
from workbench.spec.preflight import preflight


def _check_values(kind: str, key: Any, values: Any) -> list:
    if not isinstance(key, str) or not key:
        raise SpecError(f"{kind} key {key!r}: expected a dotted spec key such as lighthouse.heartbeat_timeout_ms")
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise SpecError(f"{kind} {key}: expected a list of values, got {type(values).__name__} {values!r}")
    if not values:
        raise SpecError(f"{kind} {key}: empty list; give at least one value")
    return list(values)


def expand_points(
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    points: Optional[Sequence[Mapping[str, Any]]] = None,
    random: Optional[Mapping[str, Sequence[Any]]] = None,
    n: Optional[int] = None,
    seed: int = 0,
) -> list[dict]:
    """The sweep's points as ``{dotted key: value}`` dicts, in submission order.

    ``grid``: the cartesian product, the first key varying slowest.
    ``points``: the given list. ``random``: ``n`` points, each key drawn
    uniformly from its choices with ``numpy.random.default_rng(seed)``.
    Exactly one of the three. Values are not checked against the spec here.
    """
    given = [name for name, v in (("grid", grid), ("points", points), ("random", random)) if v is not None]
    if len(given) != 1:
        raise SpecError(f"sweep: give exactly one of grid, points, random (got {', '.join(given) or 'none'})")
    if n is not None and random is None:
        raise SpecError("n: only random sweeps take n")
    if grid is not None:
        if not isinstance(grid, Mapping) or not grid:
            raise SpecError(f"grid: expected a non-empty mapping of spec key -> list of values, got {grid!r}")
        axes = {k: _check_values("grid", k, v) for k, v in grid.items()}
        return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    if points is not None:
        if isinstance(points, (str, bytes, Mapping)) or not isinstance(points, Sequence) or not points:
            raise SpecError(f"points: expected a non-empty list of {{spec key: value}} mappings, got {points!r}")
        out = []
        for i, p in enumerate(points):
            if not isinstance(p, Mapping):
                raise SpecError(f"points[{i}]: expected a mapping of spec key -> value, got {type(p).__name__} {p!r}")
            for k in p:
                if not isinstance(k, str) or not k:
                    raise SpecError(f"points[{i}]: key {k!r} is not a dotted spec key")
            out.append(dict(p))
        return out
    if not isinstance(random, Mapping) or not random:
        raise SpecError(f"random: expected a non-empty mapping of spec key -> list of choices, got {random!r}")
    choices = {k: _check_values("random", k, v) for k, v in random.items()}
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecError(f"n: a random sweep needs n, an integer >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    return [{k: v[int(rng.integers(len(v)))] for k, v in choices.items()} for _ in range(n)]


def point_name(base_name: str, index: int) -> str:
    suffix = f"-p{index}"
    return base_name[: 64 - len(suffix)] + suffix


def point_spec(base: Mapping[str, Any], params: Mapping[str, Any], index: int) -> Spec:
    """The resolved spec of point ``index``: the base with the point's values, named ``<name>-p<i>``."""
    return load_spec(dict(base), {"name": point_name(base.get("name", "run"), index), **params})


def _label(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def validate_points(base: Spec, points: list[dict], grid: Optional[Mapping] = None) -> list[Spec]:
    """Every point's spec, or one SpecError naming the point (and the grid key) at fault."""
    base_dict = base.to_dict()
    if grid is not None:
        for key, values in grid.items():
            for v in values:
                try:
                    load_spec(base_dict, {key: v})
                except SpecError as e:
                    raise SpecError(f"grid {key}={v!r}: {e}") from None
    specs = []
    for i, params in enumerate(points):
        try:
            spec = point_spec(base_dict, params, i)
            preflight(spec)
        except SpecError as e:
            raise SpecError(f"sweep point {i} ({_label(params)}): {e}") from None
        specs.append(spec)
    return specs
