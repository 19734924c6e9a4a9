"""TorchTitan's own checkpoint-restart (``trainer: titan-restart``): the baseline beside elastic TorchTitan.

The same model, TOML config and data as ``trainer: titan`` (:mod:`.job`), run
the way a job without torchft is: ``fault_tolerance.enable=false``, one job
for the whole run whose ``replicas`` ranks are one data-parallel group
(TorchTitan's FSDP over gloo on CPU, ``dp_shard`` = ``replicas``), and
TorchTitan's own DCP checkpoints every ``titan.checkpoint_interval`` steps.
``replicas: 2`` here trains the global batch of ``titan`` with 2 groups of
one rank each: in both every rank reads ``local_batch_size`` samples a step,
and every rank (here) or group (there) reports its steps, so their goodput
and useful samples/s compare one to one.

Protocol inside the job (the shape of :mod:`workbench.trainers.ddp_restart`):

- This function is a launcher. It hosts the ranks' TCPStore
  (``TORCHELASTIC_USE_AGENT_STORE``, as :mod:`.job` does), starts one
  ``python -m workbench.trainers.titan.restart_rank`` per rank and waits for
  them (:class:`..process_group.ProcessGroup`): the first to end unclean has
  the others SIGKILLed at once, the launcher writes a ``warning`` with how
  each ended and raises, so the job ends non-completed and the controller
  relaunches it as the next attempt. Ranks die with the launcher
  (``PR_SET_PDEATHSIG``).
- Each rank writes its own events as ``replica=<rank>``
  (:mod:`.restart_rank`): ``start`` with its process identity (what
  ``run.kill(replica=rank)`` signals), ``phase`` (``imports_done``,
  ``restored`` with ``from_step``, ``model_ready``), ``step`` (every step
  ``committed`` and ``participating``: plain FSDP has no vote), ``exit``.
- Rank 0 is the checkpoint writer: ``checkpoint state=started`` before
  TorchTitan's save (``held=True`` when a ``kill_during_checkpoint`` is
  armed: it then holds before DCP's commit, the rename of ``.metadata``),
  ``checkpoint durable=True`` after it. TorchTitan loads only a step folder
  with ``.metadata`` (its ``_find_load_step``), so a save killed mid-way is
  never loaded.
- A relaunch loads the newest durable checkpoint: TorchTitan's own resume
  from ``dump_folder`` (``checkpoint.load_step = -1``), model, optimizer,
  lr schedule, dataloader position and step; ``phase restored`` says from
  which step on every relaunch (``from_step=0`` when none existed yet).
- A preemption signal is forwarded to every rank; they stop together at a
  step boundary (:mod:`..torchft.group_stop`), save there, and rank 0
  writes ``exit reason=preempted``.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from workbench.events.writer import EventWriter
from workbench.trainers import loopback
from workbench.trainers.base import JobContext
from workbench.trainers.exits import mark_told
from workbench.trainers.kit import die_with_parent, hold_stop_signals, on_stop_signals, signal_pid
from workbench.trainers.process_group import ProcessGroup
from workbench.trainers.titan.assets import ensure_assets
from workbench.trainers.titan.job import rank_env, rank_stderr, resolve_toml, titan_flags

RANK_MODULE = "workbench.trainers.titan.restart_rank"


def checkpoint_dir(run_dir) -> Path:
    """TorchTitan's ``dump_folder`` of a titan-restart run; its checkpoints are ``checkpoint/step-N``."""
    return Path(run_dir) / "checkpoints" / "titan-restart"


def restart_flags(ctx: JobContext, assets: Path) -> list[str]:
    """The torchtitan argv of every rank: the TOML, the spec, fault tolerance off, the checkpoint interval."""
    spec = ctx.spec
    titan = spec.get("titan") or {}
    config = tomllib.loads(resolve_toml(titan.get("config", "titan-cpu-debug.toml")).read_text())
    derived = {
        "training.steps": spec["steps"],
        "debug.seed": spec["seed"],
        "fault_tolerance.enable": False,
        "checkpoint.enable": True,
        "dump_folder": str(checkpoint_dir(ctx.run_dir)),
        "hf_assets_path": str(assets / "tokenizer"),
        "dataloader.dataset_path": str(assets / "corpus"),
    }
    if titan.get("checkpoint_interval"):
        derived["checkpoint.interval"] = int(titan["checkpoint_interval"])
    return titan_flags(config, {**derived, **(titan.get("overrides") or {})}) + list(titan.get("extra_args") or [])


def run(ctx: JobContext) -> None:
    """The launcher: start the ranks, fail fast when one dies, report how the job ended."""
    world = int(ctx.spec["replicas"])
    argv = restart_flags(ctx, ensure_assets())
    host = ctx.listen_host()
    loopback.bind_to(host)
    store = loopback.loopback_store()  # noqa: F841 (the ranks' store: served while they run)
    env = rank_env(ctx, world, store.port, host=host)
    ranks = ProcessGroup()
    stopped: list[int] = []

    def forward(signum: int) -> None:
        stopped.append(signum)
        for p in list(ranks.popens):
            if p.returncode is None:
                signal_pid(p.pid, signum)

    restore = on_stop_signals(forward)
    try:
        for rank in range(world):
            ranks.start(
                rank,
                [sys.executable, "-m", RANK_MODULE, *argv],
                stderr_path=rank_stderr(ctx, rank),
                env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "ROLE_RANK": str(rank)},
                stdin=subprocess.DEVNULL,
                preexec_fn=functools.partial(_rank_preexec, os.getpid()),
            )
        if stopped:
            forward(stopped[0])  # it came while the ranks were being started
        failed = ranks.wait()
        if failed is not None:
            fields = ranks.exit_fields()
            end = next(p for p in fields["processes"] if p["rank"] == failed)
            how = f"exit code {end['exit_code']}" if "exit_code" in end else f"signal {end['signal']}"
            message = f"rank {failed} ended with {how}; the other {world - 1} were killed (attempt {ctx.attempt})"
            writer = EventWriter(ctx.run_dir, f"launcher.attempt-{ctx.attempt}", run=ctx.run_id, attempt=ctx.attempt)
            writer.emit(
                "warning",
                message=message,
                failed_rank=failed,
                processes=fields["processes"],
                first_failed=fields["first_failed"],
            )
            writer.close()
            raise mark_told(RuntimeError(message))  # each rank writes its own exit; the launcher none
    finally:
        restore()
        ranks.close()


def _rank_preexec(parent_pid: int) -> None:
    hold_stop_signals()
    die_with_parent(parent_pid)
