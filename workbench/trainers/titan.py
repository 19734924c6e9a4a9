"""TorchTitan + TorchFT as a workbench trainer (``trainer: titan``).

Two halves, one module:

**The job** (:func:`run`, inside the submitit job of one replica group and
attempt) builds the offline assets, turns the spec's ``titan`` section and its
TOML config into torchtitan flags, and starts ``nproc_per_replica`` rank
processes of this module, like ``torchrun`` does: the job process hosts the
group's TCPStore (``TORCHELASTIC_USE_AGENT_STORE``) and every rank dies with
the job (``PR_SET_PDEATHSIG``), so killing the job's PID kills the replica
group. It writes ``start`` before the ranks exist and, if they fail, ``exit``
with ``reason="error"`` after they are gone; never while they write.

**The ranks** (``python -m workbench.trainers.titan <torchtitan flags>``) apply
the CPU patches when there is no accelerator, install :class:`TitanEvents`,
and call torchtitan's own ``train.main()``. Rank 0 of the group writes the
replica's events: ``phase``, ``step``, ``heal``, ``checkpoint``, ``heartbeat``,
torchft's ``quorum``/``commit`` records, and ``exit`` with
``reason="completed"`` when torchtitan finished its target step.

Configs
-------
torchtitan 0.3.0 reads no TOML: a run is ``--module <registry> --config
<function>`` plus tyro flags ``--<section>.<key> <value>``. A workbench TOML
(``configs/titan-*.toml``) names the registry entry under ``[job]`` and lists
overrides by section; :func:`titan_flags` turns each ``section.key = value``
into a flag. The spec's ``titan`` dict names the TOML (``config``) and may add
``overrides`` (``{"training.seq_len": 128}``), ``threads`` (per rank, CPU) and
``extra_args`` (raw flags). The spec itself sets steps, replica id, number of
groups and quorum size.

Healing: three upstream problems, guarded here
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

Before each step's forward, :class:`TitanEvents` waits for the quorum (no
``state_dict()`` runs concurrently with compute; the cost is the overlap of
quorum and forward), applies a received checkpoint at once (what torchft's
synchronous-quorum mode does in ``start_quorum``), and resets each param
group's lr from the received scheduler. A step whose commit failed (a peer
died mid-step) is retried under the same step number and does not advance
the lr schedule, so ``training.steps`` counts committed steps, as the
manager does.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Optional

from ..events import EventWriter, TorchftLogHandler
from ..rundir import dir_bytes
from .base import JobContext

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
RANK_MODULE = "workbench.trainers.titan"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


# -- configs -----------------------------------------------------------------
def resolve_toml(name: str) -> Path:
    p = Path(name).expanduser()
    if p.exists():
        return p
    for cand in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.toml"):
        if cand.exists():
            return cand
    raise FileNotFoundError(f"titan.config: {name!r} not found (looked in {CONFIG_DIR})")


def _flag_value(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [",".join(str(v) for v in value)]
    return [str(value)]


def titan_flags(config: dict, overrides: Optional[dict] = None) -> list[str]:
    """``{"job": {"module", "config"}, "training": {"steps": 5}}`` → torchtitan's argv."""
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    job = config.pop("job", {})
    flat: dict[str, Any] = {}
    for section, values in config.items():
        if not isinstance(values, dict):
            raise ValueError(f"titan config: top-level key {section!r} must be a [section]")
        for key, value in values.items():
            flat[f"{section}.{key}"] = value
    flat.update(overrides or {})
    argv = ["--module", job["module"], "--config", job["config"]]
    for key, value in flat.items():
        if isinstance(value, bool):
            section, _, name = key.rpartition(".")
            argv.append(f"--{section + '.' if section else ''}{'' if value else 'no_'}{name}")
        else:
            argv += [f"--{key}", *_flag_value(value)]
    return argv + list(job.get("subcommands", []))


def job_flags(ctx: JobContext, assets: Path) -> list[str]:
    """The torchtitan argv for one replica group: the TOML, the spec, the assets."""
    spec = ctx.spec
    titan = spec.get("titan") or {}
    config = tomllib.loads(resolve_toml(titan.get("config", "titan-cpu-debug.toml")).read_text())
    pg_timeout_ms = spec["torchft"].get("pg_timeout_ms") or 2 * spec["lighthouse"]["heartbeat_timeout_ms"]
    derived = {
        "training.steps": spec["steps"],
        "debug.seed": spec["seed"],
        "fault_tolerance.enable": True,
        "fault_tolerance.replica_id": ctx.replica,
        "fault_tolerance.group_size": spec["replicas"],
        "fault_tolerance.min_replica_size": spec["min_replicas"],
        "fault_tolerance.process_group_timeout_ms": pg_timeout_ms,
        "checkpoint.enable": True,
        "dump_folder": str(Path(ctx.run_dir) / "checkpoints" / "titan"),
        "hf_assets_path": str(assets / "tokenizer"),
        "dataloader.dataset_path": str(assets / "corpus"),
    }
    return titan_flags(config, {**derived, **(titan.get("overrides") or {})}) + list(titan.get("extra_args") or [])


def llama3_torchft_8b():
    """Config function (``--module workbench.trainers.titan --config llama3_torchft_8b``).

    torchtitan's torchft registry has only the debug model, and ``model_spec``
    is not settable from flags; this is that config with Llama 3 8B.
    """
    from torchtitan.experiments.torchft.llama3 import model_registry
    from torchtitan.experiments.torchft.llama3.config_registry import llama3_torchft_debugmodel
    from torchtitan.models.common.config_utils import decoder_vocab_size

    config = llama3_torchft_debugmodel()
    config.model_spec = model_registry("8B")
    config.loss.global_vocab_size = decoder_vocab_size(config.model_spec)
    config.hf_assets_path = "./assets/hf/Llama-3.1-8B"
    return config


# -- the job -----------------------------------------------------------------
def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run(ctx: JobContext) -> None:
    """The submitit job of one replica group: start the ranks, wait, report failure."""
    import torch

    from .titan_assets import ensure_assets

    spec = ctx.spec
    nproc = int(spec.get("nproc_per_replica", 1))
    titan = spec.get("titan") or {}
    writer = ctx.writer()
    writer.emit("start", trainer="titan", role="replica", world_size=nproc)
    try:
        argv = job_flags(ctx, ensure_assets())
    except Exception as e:
        writer.emit("exit", reason="error", step=None, error=f"{type(e).__name__}: {e}")
        raise
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "WORKBENCH_RUN_DIR": ctx.run_dir,
        "WORKBENCH_RUN_ID": ctx.run_id,
        "WORKBENCH_REPLICA": str(ctx.replica),
        "WORKBENCH_ATTEMPT": str(ctx.attempt),
        "WORKBENCH_HEARTBEAT_S": str(spec.get("heartbeat_s", 1.0)),
        "WORKBENCH_CHECKSUM_EVERY": str(spec.get("checksum_every", 10)),
        "TORCHFT_TIMEOUT_SEC": str(max(1, round(spec["torchft"]["timeout_s"]))),
        "TORCHFT_QUORUM_TIMEOUT_SEC": str(max(1, round(spec["torchft"]["quorum_timeout_s"]))),
        "TORCHFT_QUORUM_RETRIES": str(spec["torchft"]["quorum_retries"]),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    if ctx.lighthouse_addr:
        env["TORCHFT_LIGHTHOUSE"] = ctx.lighthouse_addr
    if spec.get("cluster", "local") == "local":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not torch.accelerator.is_available():
        env["OMP_NUM_THREADS"] = str(titan.get("threads", 1))
    ranks = []
    for rank in range(nproc):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)}
        ranks.append(subprocess.Popen(
            [sys.executable, "-m", RANK_MODULE, *argv], env=rank_env, preexec_fn=_die_with_parent,
            stdin=subprocess.DEVNULL,
        ))
    failed = _wait_all(ranks)
    if failed is not None:
        error = f"rank {failed[0]} exited with {failed[1]}"
        writer.emit("exit", reason="error", step=None, error=error)
        writer.close()
        raise RuntimeError(f"titan replica {ctx.replica}: {error}")
    writer.close()


def _wait_all(ranks: list[subprocess.Popen]) -> Optional[tuple[int, int]]:
    """Wait for every rank; on the first failure, kill the rest (by PID) and return it."""
    while True:
        codes = [p.poll() for p in ranks]
        bad = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), None)
        if bad is not None:
            for p in ranks:
                if p.poll() is None:
                    p.kill()
            for p in ranks:
                p.wait()
            return bad
        if all(c == 0 for c in codes):
            return None
        try:
            ranks[codes.index(None)].wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


# -- the ranks ---------------------------------------------------------------
def _peak_mem_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _state_bytes(obj: Any) -> int:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    return 0


def weights_checksum(state: dict) -> str:
    """A short hash of a model state dict (this rank's shards), comparable across groups."""
    import hashlib

    from torch.distributed.tensor import DTensor

    h = hashlib.sha1()
    for name, t in sorted(state.items()):
        if isinstance(t, DTensor):
            t = t.to_local()
        h.update(name.encode())
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _received_model(state: dict) -> Optional[dict]:
    for user_state in (state.get("user") or {}).values():
        if isinstance(user_state, dict) and "model" in user_state:
            return user_state["model"]
    return None


class _Heartbeat(threading.Thread):
    def __init__(self, writer: EventWriter, period: float) -> None:
        super().__init__(daemon=True, name="workbench-heartbeat")
        self.writer, self.period, self.step = writer, period, 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            self.writer.emit("heartbeat", step=self.step)


class TitanEvents:
    """Hooks into torchtitan's FaultTolerantTrainer: events, and the heal guard.

    Installed by wrapping methods of the trainer class before it is built, so
    torchtitan's own training loop runs unchanged:

    - ``__init__``: after it, the torchft Manager exists; hook its
      ``should_commit`` (commit result, participation) and its checkpoint
      transport's ``recv_checkpoint`` (heal seconds, bytes, source).
    - ``forward_backward_step``: before the first one of a step, wait for the
      quorum and apply a received checkpoint (see the module docstring).
    - ``train_step``: time it and emit the ``step`` event.
    - ``MetricsProcessor.log``: the loss torchtitan computed for the step.
    - ``TorchFTCheckpointManager._save``: ``checkpoint`` events.

    Only rank 0 of the group writes (``writer`` is None elsewhere); the guard
    runs on every rank.
    """

    def __init__(self, writer: Optional[EventWriter], heartbeat_s: float = 1.0, checksum_every: int = 10) -> None:
        self.writer = writer
        self.heartbeat_s = heartbeat_s
        self.checksum_every = max(1, checksum_every)
        self.t_start = time.time()
        self.trainer = None
        self.manager = None
        self._step_state: dict = {}
        self._heal: dict = {}
        self._heartbeat: Optional[_Heartbeat] = None

    def emit(self, kind: str, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.emit(kind, **fields)

    def install(self) -> "TitanEvents":
        from torchtitan.components.metrics import MetricsProcessor
        from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
        from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer

        hooks = self
        init, train_step, fwd_bwd = (
            FaultTolerantTrainer.__init__, FaultTolerantTrainer.train_step,
            FaultTolerantTrainer.forward_backward_step,
        )
        log_metrics, save = MetricsProcessor.log, TorchFTCheckpointManager._save

        def __init__(trainer, config):
            init(trainer, config)
            hooks._attach(trainer)

        def train_step_hook(trainer, data_iterator):
            hooks._step_state = {"t0": time.perf_counter(), "guarded": False}
            train_step(trainer, data_iterator)
            hooks._after_step()

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

        def _save(checkpointer, curr_step, last_step=False):
            t0 = time.perf_counter()
            saved = save(checkpointer, curr_step, last_step)
            if saved:
                path = checkpointer._create_checkpoint_id(curr_step)
                hooks.emit("checkpoint", step=curr_step, path=path, seconds=time.perf_counter() - t0,
                           bytes=dir_bytes(path), durable=True)
            return saved

        FaultTolerantTrainer.__init__ = __init__
        FaultTolerantTrainer.train_step = train_step_hook
        FaultTolerantTrainer.forward_backward_step = forward_backward_step
        MetricsProcessor.log = log
        TorchFTCheckpointManager._save = _save
        return self

    def _attach(self, trainer) -> None:
        self.trainer = trainer
        self.manager = manager = trainer.ft_manager.manager
        transport = manager._checkpoint_transport
        recv = transport.recv_checkpoint
        should_commit = manager.should_commit
        hooks = self

        lr_step = trainer.lr_schedulers.step

        def recv_checkpoint(src_rank, metadata, step, timeout):
            t0 = time.perf_counter()
            state = recv(src_rank, metadata, step, timeout)
            seconds = time.perf_counter() - t0
            model = _received_model(state)
            hooks._heal = dict(seconds=seconds, bytes=_state_bytes(state), from_address=metadata,
                               from_rank=src_rank, step=step,
                               weights=weights_checksum(model) if model is not None else None)
            return state

        def should_commit_hook(*args, **kwargs):
            committed = should_commit(*args, **kwargs)
            hooks._step_state.update(
                committed=bool(committed), participating=bool(manager.is_participating()),
                participants=manager.num_participants(), quorum_id=manager._quorum_id,
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
            TorchftLogHandler(self.writer).install()
            self._heartbeat = _Heartbeat(self.writer, self.heartbeat_s)
            self._heartbeat.start()
        self.emit("phase", phase="manager_ready", seconds=time.time() - self.t_start,
                  checkpoint_address=transport.metadata())

    def _quorum_then_heal(self) -> None:
        manager = self.manager
        manager.wait_quorum()
        if manager._healing:
            t0 = time.perf_counter()
            manager._apply_pending_state_dict()
            manager._healing = False
            self._sync_lr_to_scheduler()
            self._step_state["healed"] = True
            self.emit("heal", **self._heal, apply_seconds=time.perf_counter() - t0,
                      titan_step=self.trainer.step,
                      forward_weights=self._weights() if self.writer is not None else None)

    def _sync_lr_to_scheduler(self) -> None:
        """Set each param group's lr to the received scheduler's (problem 3 above)."""
        trainer = self.trainer
        for scheduler, optimizer in zip(trainer.lr_schedulers.schedulers, trainer.optimizers.optimizers):
            for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr

    def _weights(self) -> str:
        return weights_checksum(self.trainer.checkpointer.states["model"].state_dict())

    def _after_step(self) -> None:
        s, trainer, manager = self._step_state, self.trainer, self.manager
        dt = time.perf_counter() - s["t0"]
        cfg = trainer.config.training
        tokens = cfg.local_batch_size * cfg.seq_len * int(os.environ.get("WORLD_SIZE", "1"))
        step = manager.current_step()
        if self._heartbeat is not None:
            self._heartbeat.step = step
        if self.writer is not None and s.get("committed") and step % self.checksum_every == 0:
            s["weights"] = self._weights()
        self.emit(
            "step", step=step, loss=s.get("loss", s.get("local_loss")), local_loss=s.get("local_loss"),
            committed=s.get("committed", False), participating=s.get("participating", False),
            participants=s.get("participants"), quorum_id=s.get("quorum_id"), healed=s.get("healed", False),
            step_time_s=dt, tokens_per_s=tokens / dt if dt else None, mem_gb=_peak_mem_gb(),
            titan_step=trainer.step, grad_norm=s.get("grad_norm"), weights=s.get("weights"),
        )

    def finish(self) -> None:
        trainer, manager = self.trainer, self.manager
        if self._heartbeat is not None:
            self._heartbeat.stopped.set()
        target = trainer.config.training.steps if trainer is not None else None
        done = trainer is not None and trainer.step >= target
        step = manager.current_step() if manager is not None else None
        self.emit("exit", reason="completed" if done else "error", step=step,
                  **({} if done else {"error": "torchtitan returned before the target step"}))
        if self.writer is not None:
            self.writer.close()


def rank_main(argv: list[str]) -> None:
    """One rank of a replica group: patch (CPU), hook, run torchtitan's train main."""
    t0 = time.time()
    from . import titan_cpu

    if titan_cpu.needed():
        titan_cpu.apply()
    writer = None
    if os.environ.get("RANK", "0") == "0" and os.environ.get("WORKBENCH_RUN_DIR"):
        writer = EventWriter(
            os.environ["WORKBENCH_RUN_DIR"], f"replica-{os.environ['WORKBENCH_REPLICA']}.attempt-"
            f"{os.environ['WORKBENCH_ATTEMPT']}", run=os.environ.get("WORKBENCH_RUN_ID"),
            replica=int(os.environ["WORKBENCH_REPLICA"]), attempt=int(os.environ["WORKBENCH_ATTEMPT"]),
        )
    hooks = TitanEvents(writer, float(os.environ.get("WORKBENCH_HEARTBEAT_S", "1.0")),
                        int(os.environ.get("WORKBENCH_CHECKSUM_EVERY", "10")))
    hooks.t_start = t0
    from torchtitan import train

    hooks.install()
    hooks.emit("phase", phase="imports_done", seconds=time.time() - t0)
    sys.argv = [train.__file__, *argv]
    train.main()
    hooks.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # torchft's manager threads would hold the interpreter open


if __name__ == "__main__":
    rank_main(sys.argv[1:])
