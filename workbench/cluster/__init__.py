"""Where jobs run: a registry of backends, each a :class:`Cluster`.

``BACKENDS`` (in ``backends.py``, which imports nothing from the package, so
the spec reads it too) maps the spec's ``cluster`` value to the class that
implements it, as ``"module:Class"`` so that a backend's dependencies are
imported only when a run uses it. Adding a backend is one entry there and one
module that subclasses :class:`~workbench.cluster.base.Cluster`; nothing
outside this package asks which backend a run uses.
"""

from __future__ import annotations

from pathlib import Path

from workbench.cluster import backends
from workbench.cluster.backends import BACKENDS, backend_names
from workbench.cluster.base import Cluster
from workbench.errors import FaultError


def backend_class(name: str) -> type[Cluster]:
    """The class that implements backend ``name``; ValueError naming the allowed ones."""
    return backends.backend_class(name)


def make_cluster(spec, run_dir: Path) -> Cluster:
    return backend_class(spec.cluster)(spec, run_dir)


def validate(spec) -> None:
    """The backend's pre-submit checks (``Cluster.validate``); raises SpecError."""
    backend_class(spec.cluster).validate(spec)


__all__ = ["BACKENDS", "Cluster", "FaultError", "backend_class", "backend_names", "make_cluster", "validate"]
