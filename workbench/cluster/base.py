"""The cluster interface, modelled on submitit's executors.

A job is a submitit ``Job``; the cluster adds what the run controller needs on
top: whether the job has ended, how to cancel it, and where the lighthouse
should listen so that the jobs can reach it.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Callable

import submitit


class Cluster(abc.ABC):
    name: str = "base"

    def __init__(self, spec, run_dir: Path) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / "jobs" / "%j"
        self.executor = self._make_executor()

    @abc.abstractmethod
    def _make_executor(self) -> submitit.Executor: ...

    @classmethod
    def validate(cls, spec) -> None:
        """World-facing checks at submit, before the detached controller starts.

        Raises ``SpecError`` naming the field; submits nothing. A backend may
        pin what it resolved (which cluster) into ``spec``, which is then recorded.
        """

    def submit(self, fn: Callable[..., Any], *args: Any, name: str) -> submitit.Job:
        """Start ``fn(*args)`` as one job; ``name`` labels it where the backend shows names."""
        return self.executor.submit(fn, *args)

    def is_done(self, job: submitit.Job) -> bool:
        return job.done()

    def cancel(self, job: submitit.Job) -> None:
        job.cancel(check=False)

    @property
    def lighthouse_host(self) -> str:
        """The address the lighthouse binds to and the jobs dial."""
        return self.spec.lighthouse.bind_host
