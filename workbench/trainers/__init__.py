"""Trainers: what runs inside a job.

A trainer is a module with ``run(ctx: JobContext) -> None``, executed inside a
submitit job, once per replica group and attempt. It reports only through the
event log (``ctx.writer()``), and must emit ``exit`` with
``reason="completed"`` when it reached its target: the run controller treats a
job that ended without that as failed and relaunches it.

``ELASTIC`` trainers run as torchft replica groups under one lighthouse; the
others run as one job that restarts from its last checkpoint.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .base import JobContext, job_entrypoint

REGISTRY: dict[str, str] = {
    "torchft-lite": "workbench.trainers.torchft_lite",
    "titan": "workbench.trainers.titan",
    "maxtext": "workbench.trainers.maxtext",
    "ddp-restart": "workbench.trainers.ddp_restart",
}
ELASTIC = {"torchft-lite", "titan"}


def load(name: str) -> Callable[[JobContext], None]:
    return importlib.import_module(REGISTRY[name]).run


__all__ = ["JobContext", "job_entrypoint", "REGISTRY", "ELASTIC", "load"]
