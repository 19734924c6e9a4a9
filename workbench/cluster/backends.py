"""The backends a spec's ``cluster`` may name, and how to get the class of one.

``BACKENDS`` maps the spec's ``cluster`` value to the class that implements
it, as ``"module:Class"`` so that a backend's dependencies are imported only
when a run uses it. The table imports nothing from the package: the spec
reads it (the names it allows, and facts a backend class states as class
attributes, such as ``loopback_only``) without depending on the cluster
interface, which itself depends on the faults and, through them, the spec.
"""

from __future__ import annotations

import importlib
from typing import Any

BACKENDS: dict[str, str] = {
    "local": "workbench.cluster.local.backend:LocalCluster",
    "slurm": "workbench.cluster.slurm.backend:SlurmCluster",
}


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_class(name: str) -> Any:
    """The class (a ``workbench.cluster.base.Cluster``) that implements backend ``name``.

    Typed ``Any`` so that this table need not import the cluster interface;
    ``workbench.cluster.backend_class`` gives it its type.
    """
    if name not in BACKENDS:
        raise ValueError(f"cluster: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)
