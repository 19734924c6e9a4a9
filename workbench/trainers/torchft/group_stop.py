"""A planned stop that every rank of a replica group takes at the same step boundary.

A preemption signal reaches the ranks of a group at different moments (the
job forwards it to each; Slurm signals each), so each rank's own flag
(:class:`.kit.StopRequest`) turns up at a different step. A rank that stops
alone leaves the others blocked in the next step's collective until their
timeout. So one rank decides and the rest follow:

- every rank calls :meth:`GroupStop.at_boundary` once per step boundary, in
  step order (boundary ``n`` is the one after ``n`` steps of this process);
- rank 0, at the first boundary ``n`` where its flag is set or another rank
  has asked (``stop_requested`` in the store), publishes ``stop_at = n + 1``
  in the group's TCPStore (the job's, where the ranks rendezvoused) and goes
  on; every rank stops at boundary ``stop_at``;
- a rank other than 0 whose own flag is set asks once: a stop signal sent to
  one rank alone (``run.fault("preempt", target=1)`` on titan-restart, whose
  ranks are its targets) is its group's stop. Without the ask, 8 of 10 such
  preempts in the matrix were lost: rank 0 never saw one and the run completed.

Why ``n + 1`` is early enough for everyone: every step ends in a barrier of
the whole group (torchft's ``should_commit`` waits for every rank of the
group), so while rank 0 is at boundary ``n`` no other rank can have finished
step ``n + 1``; rank 0 publishes before it enters that step, so each rank reads
``stop_at`` by its boundary ``n + 1`` at the latest. A group of one rank stops
at the first boundary its flag is set.

"Publishes" is more than ``set``: TCPStore's ``set`` is one-way (the client
writes the request and returns; the server sends no reply), and the server
answers each connection in turn, so another rank's ``check`` can be served
before the ``set`` is applied. Under load that left a rank of the three-rank
test reading no ``stop_at`` at the boundary where the others stopped, waiting
in the step's barrier until its timeout (CI, 2026-12-07; here, beside three
busy loops, 3 runs of 30 before the fix, 0 of 30 after). :func:`publish`
follows the ``set`` with a ``check`` on the same connection, which the server
answers only after it applied the ``set``.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from workbench.trainers.kit import StopRequest

STOP_AT_KEY = "workbench/stop_at"
STOP_REQUESTED_KEY = "workbench/stop_requested"


class GroupStop:
    """Per rank: ``at_boundary()`` is True at the boundary where the whole group stops.

    ``store`` is called at most once, lazily, for the group's store (anything
    with ``set``, ``get`` and ``check`` of :class:`torch.distributed.Store`);
    a group of one rank never calls it.
    """

    def __init__(
        self, request: StopRequest, rank: int, world_size: int, store: Optional[Callable[[], object]] = None
    ) -> None:
        self.request, self.rank, self.world_size = request, rank, world_size
        self._store_factory = store or job_store
        self._store = None
        self.boundary = 0
        self.stop_at: Optional[int] = None
        self._asked = False

    @property
    def reason(self) -> Optional[str]:
        return self.request.reason

    def at_boundary(self) -> bool:
        n, self.boundary = self.boundary, self.boundary + 1
        if self.world_size <= 1:
            if self.stop_at is None and self.request.reason is not None:
                self.stop_at = n
        elif self.rank == 0:
            if self.stop_at is None and (self.request.reason is not None or self.store().check([STOP_REQUESTED_KEY])):
                self.stop_at = n + 1
                self.request.reason = self.request.reason or "preempted"
                publish(self.store(), STOP_AT_KEY, str(self.stop_at))
        elif self.stop_at is None:
            if self.request.reason is not None and not self._asked:
                self._asked = True
                publish(self.store(), STOP_REQUESTED_KEY, str(self.rank))
            if self.store().check([STOP_AT_KEY]):
                self.stop_at = int(self.store().get(STOP_AT_KEY))
                self.request.reason = self.request.reason or "preempted"
        return self.stop_at is not None and n >= self.stop_at

    def store(self):
        if self._store is None:
            self._store = self._store_factory()
        return self._store


def publish(store, key: str, value: str) -> None:
    """Set ``key`` and return once the server has applied it (see the module's docstring)."""
    store.set(key, value)
    store.check([key])


def job_store():
    """A client of the TCPStore the job hosts for its ranks (``MASTER_ADDR``/``MASTER_PORT``)."""
    import torch.distributed as dist  # late: a rank imports this module before torch (titan.rank)

    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, wait_for_workers=False
    )
