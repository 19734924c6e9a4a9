"""Where jobs run. ``make_cluster(spec, run_dir)`` picks the backend the spec names.

Backends are thin: they say how to start a job (a submitit executor), how to
tell it ended, and how to cancel or signal it. Everything else (relaunch,
faults, events) is the same for all of them.
"""

from __future__ import annotations

from pathlib import Path

from .base import Cluster
from .local import LocalCluster


def make_cluster(spec, run_dir: Path) -> Cluster:
    if spec.cluster == "local":
        return LocalCluster(spec, run_dir)
    if spec.cluster == "slurm":
        from .slurm import SlurmCluster

        return SlurmCluster(spec, run_dir)
    raise ValueError(f"cluster: unknown backend {spec.cluster!r}; allowed: local, slurm")


def validate(spec) -> None:
    """The backend's pre-submit checks (``Cluster.validate``); raises SpecError."""
    if spec.cluster == "slurm":
        from .slurm import SlurmCluster

        SlurmCluster.validate(spec)


__all__ = ["Cluster", "LocalCluster", "make_cluster", "validate"]
