"""What a job is handed, and the function submitit runs."""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from ..events import EventWriter


@dataclasses.dataclass
class JobContext:
    """Everything a job needs, picklable, with no reference to the notebook.

    ``replica`` is the replica group (torchft) or 0 (one-job trainers);
    ``attempt`` counts relaunches of that replica from 0.
    """

    run_dir: str
    run_id: str
    spec: dict
    replica: int
    attempt: int
    lighthouse_addr: Optional[str] = None
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def writer_name(self) -> str:
        return f"replica-{self.replica}.attempt-{self.attempt}"

    def writer(self) -> EventWriter:
        return EventWriter(
            self.run_dir, self.writer_name, run=self.run_id, replica=self.replica, attempt=self.attempt
        )

    @staticmethod
    def placement() -> dict:
        """Where this job landed: the node and scheduler job id, for the health grid."""
        import socket

        return {
            "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
        }


def job_entrypoint(ctx: JobContext) -> None:
    """The function submitit pickles: set the environment, then run the trainer."""
    os.environ.update({k: str(v) for k, v in ctx.env.items()})
    from . import load

    load(ctx.spec["trainer"])(ctx)
