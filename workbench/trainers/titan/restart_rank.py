"""One rank of a titan-restart job (``python -m workbench.trainers.titan.restart_rank <torchtitan flags>``).

:mod:`.restart` starts ``replicas`` of these. Each applies the CPU patches
when there is no accelerator, installs :class:`RestartEvents` and calls
torchtitan's own ``train.main()`` with ``fault_tolerance.enable=false``: the
same ``FaultTolerantTrainer`` class ``trainer: titan`` runs, with no torchft
Manager, so torchtitan's own checkpoint load (the newest ``step-N`` with
``.metadata`` under ``dump_folder``) is the whole recovery.

Every rank writes its own events as ``replica=<rank>``
(``replica-<rank>.attempt-<a>.jsonl``); rank 0 also writes the
``checkpoint`` events (see :mod:`.restart` for the protocol).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from typing import Any, Optional

from workbench.events.writer import EventWriter
from workbench.faults.arm_file import hold_while_armed, is_armed
from workbench.run.rundir import dir_bytes
from workbench.trainers import loopback
from workbench.trainers.compat import torchtitan_compat
from workbench.trainers.exits import error_exit
from workbench.trainers.kit import Heartbeat, StopRequest, release_stop_signals, weights_checksum
from workbench.trainers.placement import placement
from workbench.trainers.raise_hook import maybe_raise
from workbench.trainers.titan.hooks import leave
from workbench.trainers.titan.rank_state import local_model_state
from workbench.trainers.torchft.group_stop import GroupStop

TRIGGER = "checkpoint"


class RestartEvents:
    """Hooks into torchtitan's trainer for a checkpoint-restart rank: events, the held save, the stop.

    Installed by wrapping methods of the trainer, checkpoint and metrics
    classes before the trainer is built, so torchtitan's loop runs unchanged:
    ``__init__`` (``model_ready``, the heartbeat), ``CheckpointManager.load``
    (``restored``), ``train_step`` (the ``step`` event), ``MetricsProcessor.log``
    (the step's loss), ``CheckpointManager.save`` and ``dcp_save`` (the
    ``checkpoint`` events around a write that really happens), DCP's
    ``FileSystemWriter.finish`` (the hold of an armed save, before the commit),
    ``should_continue_training`` (a planned stop at a step boundary).
    """

    def __init__(self, writer: EventWriter, rank: int, world: int, attempt: int, run_dir: str, stop: GroupStop):
        self.writer, self.rank, self.world, self.attempt, self.run_dir = writer, rank, world, attempt, run_dir
        self.group_stop = stop
        self.heartbeat_s = float(os.environ.get("WORKBENCH_HEARTBEAT_S", "1.0"))
        self.checksum_every = max(1, int(os.environ.get("WORKBENCH_CHECKSUM_EVERY", "10")))
        self.t_start = time.time()
        self.trainer: Any = None
        self._heartbeat: Optional[Heartbeat] = None
        self._step: dict = {}
        self._saving: Optional[int] = None
        self._hold = False

    def install(self) -> "RestartEvents":
        # torchtitan after the CPU patches (see restart_main)
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torchtitan.components.metrics import MetricsProcessor
        from torchtitan.components.optimizer import OptimizersContainer
        from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
        from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer
        from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer

        hooks = self
        init, train_step, should_continue = (
            FaultTolerantTrainer.__init__,
            FaultTolerantTrainer.train_step,
            FaultTolerantTrainer.should_continue_training,
        )
        log_metrics, save, load = MetricsProcessor.log, TorchFTCheckpointManager.save, TorchFTCheckpointManager.load
        dcp_save, finish = TorchFTCheckpointManager.dcp_save, FileSystemWriter.finish

        def __init__(trainer, config):
            # torchtitan's torchft config names TorchFTOptimizersContainer, which needs a Manager: the same
            # optimizer settings as the plain container (its Config adds no field)
            if isinstance(config.optimizer, TorchFTOptimizersContainer.Config):
                old = config.optimizer
                config.optimizer = OptimizersContainer.Config(
                    **{f.name: getattr(old, f.name) for f in dataclasses.fields(old)}
                )
            init(trainer, config)
            hooks.trainer = trainer
            hooks._heartbeat = Heartbeat(hooks.writer, hooks.heartbeat_s)
            hooks._heartbeat.start()
            hooks.writer.emit("phase", phase="model_ready", seconds=time.time() - hooks.t_start)

        def load_hook(checkpointer, step=-1):
            t0 = time.perf_counter()
            loaded = load(checkpointer, step)
            trainer = hooks.trainer
            if loaded:
                hooks.writer.emit(
                    "phase",
                    phase="restored",
                    from_step=trainer.step,
                    seconds=time.time() - hooks.t_start,
                    load_s=time.perf_counter() - t0,
                    path=torchtitan_compat.checkpoint_path(checkpointer, trainer.step),
                )
            elif hooks.attempt > 0:
                hooks.writer.emit(
                    "phase", phase="restored", from_step=0, seconds=time.time() - hooks.t_start, path=None
                )
            return loaded

        def train_step_hook(trainer, data_iterator):
            maybe_raise(trainer.step - 1, 0, hooks.attempt, rank=hooks.rank)  # trainer.step: the step it starts
            hooks._step = {"t0": time.perf_counter()}
            train_step(trainer, data_iterator)
            hooks._after_step()

        def log(processor, step, global_avg_loss, *args, **kwargs):
            hooks._step["loss"] = float(global_avg_loss)
            return log_metrics(processor, step, global_avg_loss, *args, **kwargs)

        def save_hook(checkpointer, curr_step, last_step=False):
            hooks._saving = curr_step
            try:
                return save(checkpointer, curr_step, last_step)
            finally:
                hooks._saving = None

        def dcp_save_hook(checkpointer, state_dict, checkpoint_id, *args, **kwargs):
            step = hooks._saving
            if hooks.rank != 0 or step is None:
                return dcp_save(checkpointer, state_dict, checkpoint_id, *args, **kwargs)
            hooks._hold = is_armed(hooks.run_dir, TRIGGER, 0)
            hooks.writer.emit(
                "checkpoint", step=step, state="started", durable=False, **({"held": True} if hooks._hold else {})
            )
            t0 = time.perf_counter()
            try:
                out = dcp_save(checkpointer, state_dict, checkpoint_id, *args, **kwargs)
            finally:
                hooks._hold = False
            path = str(checkpoint_id)
            hooks.writer.emit(
                "checkpoint",
                step=step,
                path=path,
                seconds=time.perf_counter() - t0,
                bytes=dir_bytes(path),
                durable=True,
            )
            return out

        def finish_hook(writer, *args, **kwargs):
            if hooks._hold:  # an armed save: hold before DCP's commit (the rename of .metadata)
                hold_while_armed(hooks.run_dir, TRIGGER, 0)
            return finish(writer, *args, **kwargs)

        def should_continue_training(trainer):
            if not should_continue(trainer):
                return False
            if hooks.group_stop.at_boundary():
                hooks._stop()
            return True

        FaultTolerantTrainer.__init__ = __init__
        FaultTolerantTrainer.train_step = train_step_hook
        FaultTolerantTrainer.should_continue_training = should_continue_training
        MetricsProcessor.log = log
        TorchFTCheckpointManager.load = load_hook
        TorchFTCheckpointManager.save = save_hook
        TorchFTCheckpointManager.dcp_save = dcp_save_hook
        FileSystemWriter.finish = finish_hook
        return self

    def _weights(self) -> str:
        """This rank's checksum, of its own shards (no collective)."""
        return weights_checksum(local_model_state(self.trainer.model_parts))

    def _after_step(self) -> None:
        trainer, s = self.trainer, self._step
        dt = time.perf_counter() - s["t0"]
        cfg = trainer.config.training
        tokens = cfg.local_batch_size * cfg.seq_len
        step = trainer.step
        if self._heartbeat is not None:
            self._heartbeat.step = step
        fields: dict[str, Any] = {}
        if step % self.checksum_every == 0 or step >= cfg.steps:
            fields["weights"] = self._weights()
        self.writer.emit(
            "step",
            step=step,
            loss=s.get("loss"),
            committed=True,
            participating=True,
            participants=self.world,
            quorum_id=self.attempt,
            step_time_s=dt,
            tokens_per_s=tokens / dt if dt else None,
            titan_step=step,
            **fields,
        )

    def _stop(self) -> None:
        """The job's planned stop, at a step boundary on every rank: checkpoint, ``exit``, leave."""
        trainer = self.trainer
        checkpointer = trainer.checkpointer
        if checkpointer.enable and trainer.step > 0 and trainer.step % checkpointer.interval:
            torchtitan_compat.save_off_interval(checkpointer, trainer.step)
        checkpointer.maybe_wait_for_saving()
        self._end(self.group_stop.reason or "preempted")
        leave()

    def _end(self, reason: str, **fields: Any) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        step = self.trainer.step if self.trainer is not None else None
        weights = self._weights() if self.trainer is not None else None
        self.writer.emit("exit", reason=reason, step=step, weights=weights, **fields)
        self.writer.close()

    def finish(self) -> None:
        trainer = self.trainer
        done = trainer is not None and trainer.step >= trainer.config.training.steps
        self._end("completed" if done else "error", **({} if done else {"error": "torchtitan returned early"}))


def restart_main(argv: list[str]) -> None:
    """One rank: ``start``, patch (CPU), hook, run torchtitan's train main, ``exit``."""
    t0 = time.time()
    stop = StopRequest()
    release_stop_signals()  # the launcher started this rank with them held
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt, run_dir = int(os.environ["WORKBENCH_ATTEMPT"]), os.environ["WORKBENCH_RUN_DIR"]
    writer = EventWriter(
        run_dir,
        f"replica-{rank}.attempt-{attempt}",
        run=os.environ.get("WORKBENCH_RUN_ID"),
        replica=rank,
        attempt=attempt,
    )
    writer.emit(
        "start",
        trainer="titan-restart",
        role="replica",
        world_size=world,
        rank=rank,
        launcher_pid=os.getppid(),
        **placement(),
    )
    # torch (cpu_patches imports it), then torchtitan: after ``start``, so that ``imports_done`` times them
    from workbench.trainers.titan import cpu_patches as titan_cpu

    if titan_cpu.needed():
        titan_cpu.apply()
    if os.environ.get("WORKBENCH_BIND_HOST"):
        loopback.install(os.environ["WORKBENCH_BIND_HOST"])
    hooks = RestartEvents(writer, rank, world, attempt, run_dir, GroupStop(stop, rank, world))
    hooks.t_start = t0
    from torchtitan import train  # see above

    hooks.install()
    writer.emit("phase", phase="imports_done", seconds=time.time() - t0)
    sys.argv = [train.__file__, *argv]
    try:
        train.main()
    except Exception as e:
        traceback.print_exc()  # what the launcher reads back into its ``warning`` (.process_group)
        error_exit(writer, e, step=hooks.trainer.step if hooks.trainer is not None else None)
        writer.close()
        leave(1)
    hooks.finish()
    leave()


if __name__ == "__main__":
    restart_main(sys.argv[1:])
