"""The hooks a TorchTitan rank runs inside torchtitan's own training loop: events, the heal guard, the stop.

:class:`TitanEvents` wraps methods of torchtitan's ``FaultTolerantTrainer``
(and of its metrics and checkpoint classes) before the trainer is built;
:mod:`.rank` installs it and runs torchtitan's ``train.main()``.

torch and torchtitan are imported inside: the rank imports this module before
its CPU patches (:mod:`.cpu_patches`), which must precede torchtitan, and
before it starts timing its imports (``imports_done``).

Healing: four upstream problems, guarded here
----------------------------------------------
torchtitan builds torchft's Manager with ``use_async_quorum=True``: the quorum,
and a recovering peer's checkpoint transfer, run on a thread *during* the
forward pass.

1. That thread calls the model's ``state_dict()`` to serve the peer, and FSDP2's
   state-dict pre-hook reshards the parameters (``_to_sharded``) while the main
   thread's forward uses the unsharded ones: the serving group crashed with
   ``aten.mm.default got mixed torch.Tensor and DTensor`` (seen when both groups
   started together and one healed at step 0).
2. A recovering group ran its first forward on its own stale weights (its first
   loss was the untrained one): torchft applies received weights only in
   ``should_commit``, after the backward.
3. After healing, the groups' weights parted for good: the optimizer state is
   served from a dict ``TorchFTOptimizersContainer`` cached at start, whose
   tensors are live but whose ``lr`` is the warm-up value from back then, so
   the healed group took one step with the wrong learning rate.

4. torchft heals rank by rank: rank ``r`` of a recovering group fetches from
   rank ``r`` of a source group, and the source may differ per rank. At step 0
   (``init_sync``) each group is the source for some ranks and heals the
   others (``primary = max_participants[group_rank % n]``), so in a group of
   two ranks one serves while the other receives. torchtitan's model
   ``state_dict()`` and ``load_state_dict()`` are collectives over the group
   (the fused-QKV hooks ``redistribute`` ``wqkv`` to ``Replicate``): the
   serving rank waited in that all-gather for its peer, which was fetching
   from the other group's serving rank, itself waiting for its own peer.
   Two 2-rank groups that started together never committed: every fetch ran
   into the checkpoint server's 60 s lock ("Timed out waiting for wlock"),
   every step had ``commit=false``. (``init_sync=False`` would spare step 0
   only: with three groups a recovering group's ranks also fetch from
   different groups.)

Before each step's forward, :class:`TitanEvents` waits for the quorum (no
``state_dict()`` runs concurrently with compute; the cost is the overlap of
quorum and forward), applies a received checkpoint at once (what torchft's
synchronous-quorum mode does in ``start_quorum``), and resets each param
group's lr from the received scheduler. A step whose commit failed (a peer
died mid-step) is retried under the same step number and does not advance
the lr schedule, so ``training.steps`` counts committed steps, as the
manager does. The state torchft serves and loads is each rank's own
(:class:`.rank_state.RankLocalState`, problem 4): the model as this rank's
shards, read and written in place, with no hook and no collective, so any
subset of a group's ranks can serve or heal.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any, Optional

from workbench.events.writer import EventWriter
from workbench.run.rundir import dir_bytes
from workbench.trainers.compat import torchft_compat, torchtitan_compat
from workbench.trainers.kit import Heartbeat, state_bytes, weights_checksum
from workbench.trainers.loopback import heal_fields
from workbench.trainers.raise_hook import maybe_raise
from workbench.trainers.titan.rank_state import RankLocalState, local_model_state
from workbench.trainers.torchft import quorum_epochs
from workbench.trainers.torchft.group_stop import GroupStop
from workbench.trainers.torchft.logs import TorchftLogHandler


def _peak_mem_gb() -> float:
    import torch  # see the module docstring

    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _received_model(state: dict) -> Optional[dict]:
    for user_state in (state.get("user") or {}).values():
        if isinstance(user_state, dict) and "model" in user_state:
            return user_state["model"]
    return None


class TitanEvents:
    """Hooks into torchtitan's FaultTolerantTrainer: events, and the heal guard.

    Installed by wrapping methods of the trainer class before it is built, so
    torchtitan's own training loop runs unchanged:

    - ``__init__``: after it, the torchft Manager exists; hook its
      ``should_commit`` (commit result, participation) and its checkpoint
      transport's ``recv_checkpoint`` (heal seconds, bytes, source); with
      ``run_dir``, its quorum ids stay unique across a lighthouse restart
      (:mod:`workbench.trainers.torchft.quorum_epochs`).
    - ``forward_backward_step``: before the first one of a step, wait for the
      quorum and apply a received checkpoint (see the module docstring).
    - ``train_step``: time it and emit the ``step`` event.
    - ``MetricsProcessor.log``: the loss torchtitan computed for the step.
    - ``TorchFTCheckpointManager.save``: ``checkpoint`` events.
    - ``should_continue_training``: the step boundary where a planned stop
      (``group_stop``) is taken.

    Only rank 0 of the group writes (``writer`` is None elsewhere); the guard
    runs on every rank.
    """

    def __init__(
        self,
        writer: Optional[EventWriter],
        heartbeat_s: float = 1.0,
        checksum_every: int = 10,
        group_stop: Optional[GroupStop] = None,
        run_dir: Optional[str] = None,
    ) -> None:
        self.writer = writer
        self.run_dir = run_dir
        self.group_stop = group_stop
        self.heartbeat_s = heartbeat_s
        self.checksum_every = max(1, checksum_every)
        self.t_start = time.time()
        self.trainer = None
        self.manager = None
        self._step_state: dict = {}
        self._heal: dict = {}
        self._heartbeat: Optional[Heartbeat] = None
        self._log: Optional[TorchftLogHandler] = None
        self._local_state: Optional[RankLocalState] = None
        self._restored: Optional[dict] = None

    def emit(self, kind: str, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.emit(kind, **fields)

    def install(self) -> "TitanEvents":
        # torchtitan: see the module docstring
        from torchtitan.components.metrics import MetricsProcessor
        from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
        from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer

        hooks = self
        init, train_step, fwd_bwd, should_continue = (
            FaultTolerantTrainer.__init__,
            FaultTolerantTrainer.train_step,
            FaultTolerantTrainer.forward_backward_step,
            FaultTolerantTrainer.should_continue_training,
        )
        log_metrics, save, load = MetricsProcessor.log, TorchFTCheckpointManager.save, TorchFTCheckpointManager.load

        def __init__(trainer, config):
            init(trainer, config)
            hooks._attach(trainer)

        def train_step_hook(trainer, data_iterator):
            hooks._raise_hook()
            hooks._step_state = {"t0": time.perf_counter(), "guarded": False}
            train_step(trainer, data_iterator)
            hooks._after_step()

        def should_continue_training(trainer):
            if not should_continue(trainer):
                return False
            if hooks.group_stop is not None and hooks.group_stop.at_boundary():
                hooks._stop()
            return True

        def forward_backward_step(trainer, *args, **kwargs):
            if not hooks._step_state.get("guarded", True):
                hooks._step_state["guarded"] = True
                hooks._quorum_then_heal()
            loss = fwd_bwd(trainer, *args, **kwargs)
            hooks._step_state["local_loss"] = hooks._step_state.get("local_loss", 0.0) + float(loss.detach())
            return loss

        def log(processor, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs):
            hooks._step_state["loss"] = float(global_avg_loss)
            hooks._step_state["grad_norm"] = float(grad_norm)
            return log_metrics(processor, step, global_avg_loss, global_max_loss, grad_norm, *args, **kwargs)

        def save_hook(checkpointer, curr_step, last_step=False):
            t0 = time.perf_counter()
            saved = save(checkpointer, curr_step, last_step)
            if saved:
                path = torchtitan_compat.checkpoint_path(checkpointer, curr_step)
                hooks.emit(
                    "checkpoint",
                    step=curr_step,
                    path=path,
                    seconds=time.perf_counter() - t0,
                    bytes=dir_bytes(path),
                    durable=True,
                )
            return saved

        def load_hook(checkpointer, step=-1):
            loaded = load(checkpointer, step)
            if loaded:
                hooks._resumed(checkpointer)
            return loaded

        FaultTolerantTrainer.__init__ = __init__
        TorchFTCheckpointManager.load = load_hook
        FaultTolerantTrainer.train_step = train_step_hook
        FaultTolerantTrainer.forward_backward_step = forward_backward_step
        FaultTolerantTrainer.should_continue_training = should_continue_training
        MetricsProcessor.log = log
        TorchFTCheckpointManager.save = save_hook
        return self

    def _attach(self, trainer) -> None:
        self.trainer = trainer
        self.manager = manager = trainer.ft_manager.manager
        self._local_state = RankLocalState(trainer.checkpointer)
        self._local_state.install(manager)
        if self.run_dir:
            quorum_epochs.install(manager, self.run_dir)
        transport = torchft_compat.checkpoint_transport(manager)
        recv = transport.recv_checkpoint
        should_commit = manager.should_commit
        hooks = self

        lr_step = trainer.lr_schedulers.step

        def recv_checkpoint(src_rank, metadata, step, timeout):
            t0 = time.perf_counter()
            state = recv(src_rank, metadata, step, timeout)
            seconds = time.perf_counter() - t0
            model = _received_model(state)
            nbytes = state_bytes(state)
            hooks._heal = dict(
                seconds=seconds,
                bytes=nbytes,
                from_address=metadata,
                from_rank=src_rank,
                step=step,
                **heal_fields(metadata, seconds, nbytes),
                weights=weights_checksum(model) if model is not None else None,
            )
            return state

        def should_commit_hook(*args, **kwargs):
            committed = should_commit(*args, **kwargs)
            record = hooks._log.take_commit() if hooks._log is not None else None  # the vote, as torchft logged it
            hooks._step_state.update(
                committed=bool(committed),
                participating=bool(manager.is_participating()),
                participants=manager.num_participants(),
                quorum_id=record["quorum_id"] if record else None,
            )
            if not committed:
                trainer.step -= 1  # torchtitan counts iterations; retry this step's number
            return committed

        def lr_schedulers_step(*args, **kwargs):
            if hooks._step_state.get("committed", True):
                lr_step(*args, **kwargs)

        transport.recv_checkpoint = recv_checkpoint
        manager.should_commit = should_commit_hook
        trainer.lr_schedulers.step = lr_schedulers_step
        if self.writer is not None:
            self._log = TorchftLogHandler(self.writer).install()
            self._heartbeat = Heartbeat(self.writer, self.heartbeat_s)
            self._heartbeat.start()
        self.emit(
            "phase", phase="manager_ready", seconds=time.time() - self.t_start, checkpoint_address=transport.metadata()
        )

    def _raise_hook(self) -> None:
        """The test hook (:mod:`workbench.trainers.raise_hook`), before the step after ``current_step()``."""
        env = os.environ
        maybe_raise(
            self.manager.current_step(),
            int(env.get("WORKBENCH_REPLICA", "0")),
            int(env.get("WORKBENCH_ATTEMPT", "0")),
            rank=int(env.get("RANK", "0")),
        )

    def _resumed(self, checkpointer) -> None:
        """torchtitan loaded its newest checkpoint as the group started. Under per-step fault tolerance the
        Manager counts the same committed steps: it starts at that step, so that with no live peer ahead (every
        group died, ``controller/total_loss.py``) the run goes on from it; a peer ahead heals it as before."""
        trainer, manager = self.trainer, self.manager
        if trainer.config.fault_tolerance.semi_sync_method is None and trainer.step > manager.current_step():
            manager.load_state_dict({"step": trainer.step, "batches_committed": manager.batches_committed()})
        path = torchtitan_compat.checkpoint_path(checkpointer, trainer.step)
        self._restored = {"from_step": trainer.step, "path": path}

    def _quorum_then_heal(self) -> None:
        manager = self.manager
        manager.wait_quorum()
        if torchft_compat.is_healing(manager):
            t0 = time.perf_counter()
            torchft_compat.apply_pending_heal(manager)
            self._sync_lr_to_scheduler()
            self._step_state["healed"] = True
            weights = self._weights()
            failed = manager.errored()
            self.emit(
                "heal",
                **self._heal,
                apply_seconds=time.perf_counter() - t0,
                titan_step=self.trainer.step,
                forward_weights=weights,
                **({"error": str(getattr(failed, "original_exception", failed))} if failed else {}),
            )
            self._heal = {}

    def _sync_lr_to_scheduler(self) -> None:
        """Set each param group's lr to the received scheduler's (problem 3 in the module docstring)."""
        trainer = self.trainer
        for scheduler, optimizer in zip(trainer.lr_schedulers.schedulers, trainer.optimizers.optimizers):
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr

    def _weights(self) -> str:
        """This rank's checksum, of its own shards (no collective: a healing rank computes it alone).
        Rank ``r`` of every group holds the same shard, so rank 0's are comparable across groups."""
        return weights_checksum(local_model_state(self._local_state.modules()))

    def _after_step(self) -> None:
        s, trainer, manager = self._step_state, self.trainer, self.manager
        dt = time.perf_counter() - s["t0"]
        cfg = trainer.config.training
        tokens = cfg.local_batch_size * cfg.seq_len * int(os.environ.get("WORLD_SIZE", "1"))
        step = manager.current_step()
        if self._heartbeat is not None:
            self._heartbeat.step = step
        if s.get("committed") and step % self.checksum_every == 0:
            s["weights"] = self._weights()
        if s.get("committed") and self._restored is not None:  # no heal replaced the checkpoint: it was resumed
            if not s.get("healed"):
                self.emit("phase", phase="restored", **self._restored)
            self._restored = None
        self.emit(
            "step",
            step=step,
            loss=s.get("loss", s.get("local_loss")),
            local_loss=s.get("local_loss"),
            committed=s.get("committed", False),
            participating=s.get("participating", False),
            participants=s.get("participants"),
            quorum_id=s.get("quorum_id"),
            healed=s.get("healed", False),
            step_time_s=dt,
            tokens_per_s=tokens / dt if dt else None,
            mem_gb=_peak_mem_gb(),
            titan_step=trainer.step,
            grad_norm=s.get("grad_norm"),
            weights=s.get("weights"),
        )

    def _stop(self) -> None:
        """The group's planned stop, at a step boundary on every rank: checkpoint, ``exit``, leave."""
        trainer, manager = self.trainer, self.manager
        checkpointer = trainer.checkpointer
        if checkpointer.enable and trainer.step > 0 and trainer.step % checkpointer.interval:
            torchtitan_compat.save_off_interval(checkpointer, trainer.step)
        checkpointer.maybe_wait_for_saving()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self.emit(
            "exit", reason=self.group_stop.reason or "preempted", step=manager.current_step(), titan_step=trainer.step
        )
        if self.writer is not None:
            self.writer.close()
        leave()

    def finish(self) -> None:
        trainer, manager = self.trainer, self.manager
        if self._heartbeat is not None:
            self._heartbeat.stop()
        target = trainer.config.training.steps if trainer is not None else None
        done = trainer is not None and trainer.step >= target
        step = manager.current_step() if manager is not None else None
        self.emit(
            "exit",
            reason="completed" if done else "error",
            step=step,
            **({} if done else {"error": "torchtitan returned before the target step"}),
        )
        if self.writer is not None:
            self.writer.close()


def leave(code: int = 0) -> None:
    """End this rank now, with ``code``: torchft's manager threads would hold the interpreter open."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
