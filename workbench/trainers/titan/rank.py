"""One rank of a TorchTitan replica group (``python -m workbench.trainers.titan.rank <torchtitan flags>``).

:func:`.job.run` starts ``nproc_per_replica`` of these per group. Each
applies the CPU patches when there is no accelerator, installs
:class:`.hooks.TitanEvents`, and calls torchtitan's own ``train.main()``. Rank 0 of
the group writes the replica's events, to ``replica-<r>.attempt-<a>.rank-0.jsonl``
(the job process owns ``replica-<r>.attempt-<a>.jsonl``): ``phase``, ``step``,
``heal``, ``checkpoint``, ``heartbeat``, torchft's ``quorum``/``commit``
records, and ``exit`` with ``reason="completed"`` when torchtitan finished its
target step.

Preemption
----------
A stop signal (SIGTERM, SIGUSR2; forwarded by the job, or from Slurm) sets a
flag (:class:`.kit.StopRequest`). At each step boundary (torchtitan's
``should_continue_training``, after the step's own checkpoint) the group
decides together where to stop (:class:`.group_stop.GroupStop`); there every
rank saves a checkpoint of the step reached (torchtitan's, unless its interval
just saved it; torchft has only the participating rank 0 group write the full
one), rank 0 writes ``exit`` with ``reason="preempted"``, and the rank exits 0.
The controller relaunches the group, which heals from a live peer (or
restores that checkpoint).

Local runs
----------
The rank installs :mod:`.loopback` with ``WORKBENCH_BIND_HOST`` (127.0.0.1
on a local run, the node's address on Slurm) before torchtitan builds torchft's
Manager and process group, so their servers and stores listen there only.

An exception
------------
A rank that raises prints its traceback to stderr and exits 1 at once; the
job copies every rank's stderr and writes the first failed rank's exception in
its ``exit`` (:mod:`.job`).

Healing
-------
torchtitan's asynchronous quorum, and torchft's heal rank by rank, meet four
upstream problems; :class:`.hooks.TitanEvents` guards against each, and its
module says how (:mod:`.hooks`, :mod:`.rank_state`).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Optional

from workbench.events.writer import EventWriter
from workbench.trainers import loopback
from workbench.trainers.kit import StopRequest, release_stop_signals
from workbench.trainers.titan.hooks import TitanEvents, leave
from workbench.trainers.torchft.group_stop import GroupStop


def rank_main(argv: list[str], started: str = "exec") -> None:
    """One rank of a replica group: patch (CPU), hook, run torchtitan's train main. ``started``: ``exec`` (a
    fresh interpreter) or ``fork`` (forked warm from its job, :mod:`workbench.trainers.forked`)."""
    t0 = time.time()
    stop = StopRequest()
    release_stop_signals()  # the job started this rank with them held: one sent meanwhile arrives now
    # torch (cpu_patches imports it) and then torchtitan: after t0, so that ``imports_done`` times them, and
    # torchtitan after the CPU patches.
    from workbench.trainers.titan import cpu_patches as titan_cpu

    if titan_cpu.needed():
        titan_cpu.apply()
    if os.environ.get("WORKBENCH_BIND_HOST"):
        loopback.install(os.environ["WORKBENCH_BIND_HOST"])
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    writer = None
    if rank == 0 and os.environ.get("WORKBENCH_RUN_DIR"):
        replica, attempt = int(os.environ["WORKBENCH_REPLICA"]), int(os.environ["WORKBENCH_ATTEMPT"])
        writer = EventWriter(
            os.environ["WORKBENCH_RUN_DIR"],
            rank_writer_name(replica, attempt, rank),
            run=os.environ.get("WORKBENCH_RUN_ID"),
            replica=replica,
            attempt=attempt,
        )
    hooks = TitanEvents(
        writer,
        float(os.environ.get("WORKBENCH_HEARTBEAT_S", "1.0")),
        int(os.environ.get("WORKBENCH_CHECKSUM_EVERY", "10")),
        group_stop=GroupStop(stop, rank, world_size),
        run_dir=os.environ.get("WORKBENCH_RUN_DIR"),
    )
    hooks.t_start = t0
    from torchtitan import train  # see above

    from workbench.trainers.titan import phases

    hooks.install()
    phases.install(hooks.emit, t0)
    hooks.emit("phase", phase="imports_done", seconds=time.time() - t0, warm=started == "fork")
    sys.argv = [train.__file__, *argv]
    try:
        train.main()
    except Exception:
        # The traceback on stderr is what the job reads back into its ``exit`` (.process_group); then leave
        # at once: torchft's threads would hold the interpreter open, and the peers wait in a collective.
        traceback.print_exc()
        leave(1)
    hooks.finish()
    leave()


def forked_rank(argv: list[str]) -> None:
    """A rank forked warm from its job (:func:`workbench.trainers.forked.fork_waiting`), its environment set:
    the torch threads the exec'd rank would get from ``OMP_NUM_THREADS``, then :func:`rank_main`."""
    import torch  # imported already: the job was forked warm

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rank_main(argv, started="fork")


def parse_ahead(argv: list[str]) -> None:
    """Parse torchtitan's config in the warm job, before it forks its ranks: each rank's ``parse_args`` of
    the same flags returns it (0.1-0.2 s a rank after the kill, measured on this machine). The parse is pure
    (tyro over the flags and the config function; no environment, no thread, no socket)."""
    from torchtitan.config.manager import ConfigManager

    parse = ConfigManager.parse_args
    parsed = {tuple(argv): parse(ConfigManager(), list(argv))}

    def parse_args(self, args: Optional[list[str]] = None):
        key = tuple(sys.argv[1:] if args is None else args)
        if key in parsed:
            self.config = parsed.pop(key)
            return self.config
        return parse(self, args)

    ConfigManager.parse_args = parse_args


def warm_up(model: Optional[dict] = None) -> None:
    """The titan ``TrainerKind.warm_up``: what every rank imports before it parses its config, imported in the
    local fork server, so that a job forked from it forks its ranks warm (:mod:`.job`). On a CPU-only torch:
    the CPU patches, then torchtitan's train module, its torchft trainer, checkpoint and llama3 registry (5.6 s
    measured on this machine, no thread started under ``forked.QUIET_ENV``). With an accelerator it
    imports nothing: torchtitan asks CUDA for its devices at import, and a CUDA driver initialised before a
    fork is not fork-safe, so there the ranks exec as before. ``model`` (the spec's) is not needed."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # then asking does not initialise CUDA
    import torch

    from workbench.trainers.titan import cpu_patches as titan_cpu

    if torch.cuda.is_available() or not titan_cpu.needed():
        return
    titan_cpu.apply()
    import torchtitan.experiments.torchft.checkpoint  # noqa: F401
    import torchtitan.experiments.torchft.llama3.config_registry  # noqa: F401
    import torchtitan.experiments.torchft.trainer  # noqa: F401
    import torchtitan.train  # noqa: F401


def rank_writer_name(replica: int, attempt: int, rank: int) -> str:
    """The event file of a rank that writes the replica's events: not the job process's file."""
    return f"replica-{replica}.attempt-{attempt}.rank-{rank}"


if __name__ == "__main__":
    rank_main(sys.argv[1:])
