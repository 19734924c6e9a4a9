"""Hot spares: jobs that import, build the model and wait to be given a replica group.

The controller submits ``spec.spares`` of them at the start (for the trainers
whose table entry ``supports_spares``: torchft-lite, titan, and MaxText, whose
spare is a whole job); each says ``phase phase=spare_ready`` once it waits (a TorchTitan spare on
several nodes: each task says so, and it is ready at task 0's). When a group's job
ends and the relaunch policy restarts it with no delay, a ready spare takes over
at once as the group's next attempt, instead of a new job that would import and
build for seconds first: the controller writes ``spares/<id>.json``
(``{"replica": r, "attempt": a}``, atomically), which the spare waits for
(``JobContext.wait_for_assignment``), and submits a spare in its place. A spare
that ends unused is replaced while fewer than ``spares + max_restarts`` were
ever submitted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator

from workbench.run import rundir


class SparePool:
    def __init__(self, run_dir: Path, limit: int) -> None:
        self.run_dir = run_dir
        self.limit = limit  # spares ever submitted, replacements included
        self.jobs: dict[int, Any] = {}  # spare id -> its job, until it is assigned or ends
        self.ready: set[int] = set()  # of those, the ones that said spare_ready
        self.next_id = 0

    def new_id(self) -> int:
        spare_id = self.next_id
        self.next_id += 1
        return spare_id

    def add(self, spare_id: int, job: Any) -> None:
        self.jobs[spare_id] = job

    def observe(self, e: dict) -> None:
        if (
            e.get("kind") == "phase"
            and e.get("phase") == "spare_ready"
            and e.get("spare") in self.jobs
            and not e.get("task")
        ):
            self.ready.add(e["spare"])

    def ended(self, is_done: Callable[[Any], bool]) -> Iterator[int]:
        """Forget each spare whose job ended unused, and yield its id (as it is found: the caller may submit
        a replacement before the next is looked at)."""
        for spare_id, job in list(self.jobs.items()):
            if is_done(job):
                del self.jobs[spare_id]
                self.ready.discard(spare_id)
                yield spare_id

    def may_replace(self) -> bool:
        return self.next_id < self.limit

    def take(self, spare_id: int) -> Any:
        """Spare ``spare_id`` (a ready one) leaves the pool; its job is returned."""
        self.ready.discard(spare_id)
        return self.jobs.pop(spare_id)

    def assign(self, spare_id: int, replica: int, attempt: int) -> None:
        """Tell the waiting spare which group and attempt it now is."""
        (self.run_dir / "spares").mkdir(mode=0o700, exist_ok=True)
        rundir.write_json_text(
            self.run_dir / "spares" / f"{spare_id}.json", json.dumps({"replica": replica, "attempt": attempt})
        )
