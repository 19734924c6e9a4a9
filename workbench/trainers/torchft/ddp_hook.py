"""The gradient all-reduce of a torchft-lite group, waited on where torchft waits, without its future chain.

torchft's ``DistributedDataParallel`` registers a comm hook that calls ``Manager.allreduce`` and then
waits for the all-reduce inside the hook (``work.wait()``, torchft ``ddp.py``), so that a failed
all-reduce does not fail ``backward()``. ``Manager.allreduce`` builds a lazy callback chain for the
result (``_ManagedWork``, ``_ManagedFuture``, ``wrap_future``'s error handler, and the division by
the number of participants as a ``then`` callback) that the hook's ``wait()`` then assembles and runs
on a result that is already there. On a CPU process group there is no stream to order it on either.

:func:`allreduce_and_wait` takes the same steps in the order the hook takes them, with the same
outcomes, through the Manager's public methods:

- after an error earlier in the step (``Manager.errored``) the bucket is left as it is: torchft's
  ``_DummyWork``;
- a group not participating (healing, or beyond ``min_replicas``) contributes zeros;
- the all-reduce is a SUM over the Manager's process group divided by the number of participants
  (torchft's AVG);
- an all-reduce that fails when called or when waited on is logged on torchft's Manager logger
  (the group's stderr) and ``Manager.report_error`` (so ``should_commit`` votes no), and leaves
  the bucket as it is.

Measured here (one group alone with a real lighthouse, in one process, blocks of 40 steps alternated
with torchft's hook, median of 30 pairs, 4 runs): the stepping thread's CPU 24, 65, 93 and 93 us
lower per step, of 6.4-7.0 ms. Three of torchft's profiler spans (6 us each with no profiler
attached) go with the chain's Python objects.
``torchft.lean_ddp_hook: false`` keeps torchft's hook; ``bench/stepcost.py`` measures the two paired.
"""

from __future__ import annotations

import torch
from torch.distributed import AllreduceOptions, ReduceOp

from workbench.trainers.compat import torchft_compat


def sum_options() -> AllreduceOptions:
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    return opts


def allreduce_and_wait(manager, pg, tensor, opts: AllreduceOptions):
    """One bucket's all-reduce across the quorum's groups (``opts``: :func:`sum_options`); returns a
    completed future of the bucket."""
    if manager.errored() is None:
        participants = manager.num_participants()  # waits for the step's quorum
        if not manager.is_participating():
            tensor.zero_()
        try:
            pg.allreduce([tensor], opts).wait()
        except Exception as e:
            torchft_compat.manager_logger(manager).exception(
                f"got exception in all reduce -- skipping remaining: {e}"
            )  # as torchft logs it
            manager.report_error(e)
        else:
            tensor /= participants
    fut = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def lean_ddp(base, pg):
    """torchft's ``DistributedDataParallel`` (``base``) whose gradient hook is :func:`allreduce_and_wait`
    over ``pg``, the Manager's process group."""
    opts = sum_options()

    def hook(state, bucket):
        return allreduce_and_wait(state, pg, bucket.buffer(), opts)

    return torchft_compat.ddp_with_comm_hook(base, hook, "LeanDistributedDataParallel")
