"""Where jobs run: a registry of backends, each a :class:`Cluster`.

``BACKENDS`` maps the spec's ``cluster`` value to the class that implements
it, as ``"module:Class"`` so that a backend's dependencies are imported only
when a run uses it. Adding a backend is one entry here and one module that
subclasses :class:`~workbench.cluster.base.Cluster`; nothing outside this
package asks which backend a run uses.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from workbench.cluster.base import Cluster
from workbench.errors import FaultError

BACKENDS: dict[str, str] = {
    "local": "workbench.cluster.local.backend:LocalCluster",
    "slurm": "workbench.cluster.slurm.backend:SlurmCluster",
}


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_class(name: str) -> type[Cluster]:
    if name not in BACKENDS:
        raise ValueError(f"cluster: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_cluster(spec, run_dir: Path) -> Cluster:
    return backend_class(spec.cluster)(spec, run_dir)


def validate(spec) -> None:
    """The backend's pre-submit checks (``Cluster.validate``); raises SpecError."""
    backend_class(spec.cluster).validate(spec)


__all__ = ["BACKENDS", "Cluster", "FaultError", "backend_class", "backend_names", "make_cluster", "validate"]
