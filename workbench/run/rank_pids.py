"""Which PID each rank of a group is, as the group's job records it: ``titan/<writer>.task-<t>.pids.json``.

Why a record: a rank its job forks warm (``trainers/forked.py``) gets its
environment after the fork, so ``/proc/<pid>/environ`` still shows the job's,
with no ``RANK``; and rank 0's own event file names its PID only once the rank
has written its first event. The job knows which child is which rank the
moment it starts them.

The protocol: a TorchTitan job (``trainers/titan/job.py``), once it has
started every rank of its task (forked or exec'd) and before it waits on them,
writes ``{"<rank>": pid}`` once, atomically (:func:`record`); only that job
writes it. The file is absent before then, when no child is a rank yet (the
job is at its rendezvous, its offline assets or a spare's wait for its group;
a child forked warm still waits for its environment), and a reader says so
rather than guess.

Who reads it (:func:`recorded_ranks`): fault targeting (``faults/targets.py``:
which child is rank 0, for ``kill_rank0``) and the stacks of a group
(``run/stacks.py``: each process's rank). A PID read here is a claim in a
file, not a proof: both take it only for a live descendant of the group's
process, proven the run's (``cluster/procs.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from workbench.run.rundir import write_json_text

RANKS_DIR = "titan"


def pids_path(run_dir, writer_name: str, task: int) -> Path:
    """The record of the ranks of task ``task`` of the job that writes as ``writer_name``."""
    return Path(run_dir) / RANKS_DIR / f"{writer_name}.task-{task}.pids.json"


def record(run_dir, writer_name: str, task: int, ranks: dict[int, int]) -> Path:
    """Write ``ranks`` (pid -> rank: every rank this task started), atomically; the path."""
    path = pids_path(run_dir, writer_name, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_text(path, json.dumps({str(rank): pid for pid, rank in ranks.items()}))
    return path


def recorded_ranks(run_dir, replica: int, attempt: int) -> dict[int, int]:
    """pid -> rank of every task of the group's attempt whose job recorded its ranks ({} before any did)."""
    ranks: dict[int, int] = {}
    for path in (Path(run_dir) / RANKS_DIR).glob(f"replica-{replica}.attempt-{attempt}.task-*.pids.json"):
        try:
            ranks.update({int(pid): int(rank) for rank, pid in json.loads(path.read_text()).items()})
        except (OSError, ValueError, AttributeError):
            continue
    return ranks
