"""A test hook: raise an exception inside a trainer's step, to see how the trainer's death is told.

Off unless ``WORKBENCH_TEST_RAISE_AT_STEP=N`` is in the job's environment (a
local job inherits the controller's, which inherits the submitting process's).
Then, at the first step at or past ``N`` (a group that joins late heals
past step ``N`` and never sees it), once in the process, the trainer raises
``RuntimeError`` with :data:`MESSAGE` (naming the step it really is) from
:func:`maybe_raise`, a frame in the trainer's own code, which the trainer's
``exit`` must show. It fires only where every one of these that is set
matches, so that a relaunch of the group runs on:

- ``WORKBENCH_TEST_RAISE_ATTEMPT`` (default ``0``): the attempt;
- ``WORKBENCH_TEST_RAISE_REPLICA`` (default: every group): the replica group;
- ``WORKBENCH_TEST_RAISE_RANK`` (default: every rank): the rank in the group.

torchft-lite and ddp-restart call it in their training loop, TorchTitan's
ranks in their ``train_step`` hook (:mod:`.titan.hooks`); MaxText's process
cannot import the workbench, and its launcher (:mod:`.maxtext.launcher`) reads
the same variables.
"""

from __future__ import annotations

import os

AT_STEP, ATTEMPT, REPLICA, RANK = (
    "WORKBENCH_TEST_RAISE_AT_STEP",
    "WORKBENCH_TEST_RAISE_ATTEMPT",
    "WORKBENCH_TEST_RAISE_REPLICA",
    "WORKBENCH_TEST_RAISE_RANK",
)
MESSAGE = "workbench test hook: raised at step {step} (replica {replica}, rank {rank}, attempt {attempt})"
_fired = False


def maybe_raise(step: int, replica: int, attempt: int, rank: int = 0) -> None:
    """Raise ``RuntimeError(MESSAGE)`` if the hook is set for this step, attempt, replica group and rank."""
    global _fired
    at = os.environ.get(AT_STEP)
    if _fired or not at or step < int(at) or int(os.environ.get(ATTEMPT) or 0) != attempt:
        return
    for var, value in ((REPLICA, replica), (RANK, rank)):
        if os.environ.get(var) and int(os.environ[var]) != value:
            return
    _fired = True
    raise RuntimeError(MESSAGE.format(step=step, replica=replica, rank=rank, attempt=attempt))
