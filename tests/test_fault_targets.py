"""Which process ``kill_rank0`` hits in a TorchTitan group: the child its job recorded as rank 0.

The group's process here is the test process itself (its ``start`` folded as replica 0's), and its ranks are
children forked warm from it (``trainers/forked.py``), as TorchTitan's job forks its ranks: their
``/proc/<pid>/environ`` is their parent's, with no ``RANK``, so only the job's record
(``workbench.run.rank_pids``) can say which is rank 0. About 0.1 s.
"""

from __future__ import annotations

import os
import time

import pytest

from workbench.cluster.procs import identity
from workbench.errors import FaultError
from workbench.faults.kinds import KINDS
from workbench.faults.targets import target_proc, target_view
from workbench.run.rank_pids import record
from workbench.state.fold import RunState
from workbench.trainers import forked
from workbench.trainers.registry import trainer_kind


def test_kill_rank0_hits_the_child_its_job_recorded_as_rank_0_and_nothing_outside_the_group(tmp_path):
    kind, trainer = KINDS["kill_rank0"], trainer_kind("titan")
    state = RunState(1, 10)
    state.apply([{"t": time.time(), "kind": "start", "role": "replica", "replica": 0, "attempt": 0, **identity()}])
    view = target_view(kind, trainer, state, 0)
    ranks = [forked.fork_waiting(time.sleep, 60) for _ in range(2)]
    try:
        assert all("RANK" not in open(f"/proc/{r.pid}/environ", "rb").read().decode() for r in ranks)
        with pytest.raises(FaultError, match=r"^target: replica 0 attempt 0 has not started its ranks yet$"):
            target_proc(kind, trainer, view, tmp_path)
        record(tmp_path, "replica-0.attempt-0", 0, {ranks[1].pid: 0, ranks[0].pid: 1})
        assert target_proc(kind, trainer, view, tmp_path).pid == ranks[1].pid
        record(tmp_path, "replica-0.attempt-0", 0, {os.getppid(): 0})  # a record naming a process outside the group
        with pytest.raises(FaultError, match=rf"rank 0 \(pid {os.getppid()}\) is no longer a live process of its job"):
            target_proc(kind, trainer, view, tmp_path)
    finally:
        for r in ranks:
            r.abandon()
