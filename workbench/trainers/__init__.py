"""Trainers: what runs inside a job.

A trainer is a module with ``run(ctx: JobContext) -> None``, executed inside a
submitit job, once per replica group and attempt. It reports only through the
event log (``ctx.writer()``), and must emit ``exit`` with
``reason="completed"`` when it reached its target: the run controller treats a
job that ended without that as failed and relaunches it.

Which trainers exist, and what the rest of the package decides on per trainer,
is the table in :mod:`.registry`; ``REGISTRY`` (name → module) and ``ELASTIC``
(the names of the torchft trainers) are views of it. Importing this package
imports no trainer and no torch.
"""

from __future__ import annotations

from workbench.trainers.base import JobContext, job_entrypoint, load
from workbench.trainers.registry import KINDS, TrainerKind, UnknownTrainer, trainer_kind, trainer_names

REGISTRY: dict[str, str] = {k.name: k.module for k in KINDS}
ELASTIC = frozenset(k.name for k in KINDS if k.elastic)

__all__ = [
    "JobContext",
    "job_entrypoint",
    "REGISTRY",
    "ELASTIC",
    "load",
    "TrainerKind",
    "UnknownTrainer",
    "trainer_kind",
    "trainer_names",
]
