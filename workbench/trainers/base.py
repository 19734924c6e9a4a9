"""What a job is handed, and the function submitit runs."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

from workbench.events.writer import EventWriter
from workbench.trainers.exits import error_exit, told
from workbench.trainers.placement import node_address
from workbench.trainers.registry import trainer_kind


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
    spare_id: Optional[int] = None
    loopback_only: bool = False  # the backend's policy: every listener of the job on 127.0.0.1

    @property
    def writer_name(self) -> str:
        if self.spare_id is not None:
            return f"spare-{self.spare_id}"
        return f"replica-{self.replica}.attempt-{self.attempt}"

    def writer(self, suffix: str = "") -> EventWriter:
        """The job's writer under its identity now (a spare's until it is assigned a group); ``suffix``: a
        file of its own for another part of the job (``.task-1``), under the same identity."""
        name = self.writer_name + suffix
        if self.spare_id is not None:
            return EventWriter(self.run_dir, name, run=self.run_id, replica=None, spare=self.spare_id)
        return EventWriter(self.run_dir, name, run=self.run_id, replica=self.replica, attempt=self.attempt)

    def wait_for_assignment(self, poll_s: float = 0.01, stop=lambda: False) -> bool:
        """A hot spare's wait: until the controller assigns it a replica group (True) or stop().

        The controller writes ``spares/<id>.json`` (``{"replica": r, "attempt": a}``)
        atomically; the spare then becomes that group's next attempt.
        """
        path = Path(self.run_dir) / "spares" / f"{self.spare_id}.json"
        while not stop():
            try:
                assignment = json.loads(path.read_text())
            except (OSError, ValueError):
                time.sleep(poll_s)
                continue
            self.replica, self.attempt, self.spare_id = assignment["replica"], assignment["attempt"], None
            return True
        return False

    def listen_host(self) -> str:
        """The one address every listener of this job binds: 127.0.0.1 on a local run, else the node's own
        (Slurm's ``NodeAddr``: on the dev cluster the node's namespace address, 127.0.0.1 for logical nodes)."""
        node = os.environ.get("SLURMD_NODENAME")
        if self.loopback_only or not node:
            return "127.0.0.1"
        return node_address(node)


def load(name: str) -> Callable[[JobContext], None]:
    """The ``run`` function of the trainer called ``name``."""
    return importlib.import_module(trainer_kind(name).module).run


def job_entrypoint(ctx: JobContext) -> None:
    """The function submitit pickles: set the environment, then run the trainer.

    An exception that escapes the trainer with no ``exit`` written for it (:mod:`.exits`) is written
    here, as ``exit`` with ``reason="error"`` and ``exception``, then re-raised: the job still fails.
    """
    os.environ.update({k: str(v) for k, v in ctx.env.items()})
    try:
        load(ctx.spec["trainer"])(ctx)
    except Exception as exc:
        if not told(exc):
            writer = ctx.writer()
            error_exit(writer, exc, step=None)
            writer.close()
        raise
