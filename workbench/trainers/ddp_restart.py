"""ddp-restart: the checkpoint-restart baseline for torchft-lite.

The same model, data and batch as torchft-lite (:mod:`.lite.model`'s
``build_model`` and ``make_batch``, with ``replica`` = worker rank), trained the way a job without torchft is:
plain ``torch.nn.parallel.DistributedDataParallel`` over gloo, ``replicas``
worker processes inside ONE job, and periodic checkpoints. A fault anywhere
costs the whole job: it restarts and redoes every step since its last
checkpoint.

Protocol inside the job:

- The job function is a launcher. It spawns one fresh interpreter per rank
  (``multiprocessing`` spawn, as torchrun would), then waits on their
  sentinels. The first worker to exit without completing (SIGKILL, crash,
  SIGTERM) makes it SIGKILL the others at once and raise, so the job ends
  non-completed and the run controller relaunches it as the next attempt.
  Workers die with the launcher (``PR_SET_PDEATHSIG``).
- Each worker writes its own event file as ``replica=<rank>``: ``start`` with
  its process identity (what ``run.kill(replica=rank)`` signals),
  ``phase`` (``imports_done``, ``restored`` with ``from_step``, ``model_ready``),
  ``step`` (every step is ``committed`` and ``participating``: plain DDP has no
  vote), ``exit``. Worker 0's ``exit reason=completed`` is what the controller
  reads for the job's one slot.
- Rendezvous is a TCPStore that rank 0 hosts on 127.0.0.1; it hands the port
  to the others through a queue.
- Rank 0 checkpoints model and optimizer state every ``checkpoint.every_steps``
  steps or ``checkpoint.every_s`` seconds (its own clock; the others simply
  wait in the next all-reduce): emit ``checkpoint state=started``, write
  ``.step-N.pt.tmp``, fsync, rename to ``step-N.pt`` (the commit marker),
  fsync the directory, then emit ``checkpoint`` with ``durable=True``. A name
  without the dot and suffix is therefore complete (:data:`CHECKPOINTS`). A save
  that finds an armed ``kill_during_checkpoint`` says ``held=True`` and holds
  before the rename (``workbench.faults.armed``; this side: ``workbench.faults.arm_file``).
- On start every worker loads the newest ``step-N.pt`` (N = committed steps it
  holds) and continues at step N+1; ``phase restored from_step=N`` is emitted
  on every relaunch (``from_step=0`` when no checkpoint existed yet).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import signal
import time
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Optional

from workbench.events.writer import EventWriter
from workbench.faults.arm_file import hold_while_armed, is_armed
from workbench.trainers import loopback
from workbench.trainers.base import JobContext
from workbench.trainers.exits import error_exit, mark_told, process_end
from workbench.trainers.kit import (
    CheckpointLayout,
    Heartbeat,
    StopRequest,
    die_with_parent,
    on_stop_signals,
    signal_pid,
    weights_checksum,
)
from workbench.trainers.lite.model import build_model, make_batch, warm_up_adamw
from workbench.trainers.placement import placement
from workbench.trainers.raise_hook import maybe_raise

CHECKPOINTS = CheckpointLayout(
    committed=re.compile(r"^step-(\d+)\.pt$"), in_progress=re.compile(r"^\.step-\d+\.pt\.tmp$")
)
EXIT_COMPLETED, EXIT_STOPPED, EXIT_ERROR = 0, 3, 1


def checkpoint_dir(run_dir) -> Path:
    return Path(run_dir) / "checkpoints" / "ddp-restart"


def save_checkpoint(directory: Path, step: int, state: dict, keep: int, before_commit=None) -> Path:
    """Atomically publish ``step-<step>.pt``: tmp file, fsync, (``before_commit()``), rename, fsync the directory."""
    import torch  # in the worker only (see _worker)

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:08d}.pt"
    tmp = directory / f".{final.name}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if before_commit is not None:
        before_commit()
    os.rename(tmp, final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    found = CHECKPOINTS.durable(directory)
    for old in sorted(found)[:-keep]:
        found[old].unlink(missing_ok=True)
    return final


def run(ctx: JobContext) -> None:
    """The launcher: spawn the ranks, fail fast when one dies, report how the job ended."""
    world = int(ctx.spec["replicas"])
    mp = multiprocessing.get_context("spawn")
    port_queue = mp.SimpleQueue()
    workers = [
        mp.Process(target=_worker, args=(ctx, rank, world, port_queue, os.getpid()), name=f"ddp-rank{rank}")
        for rank in range(world)
    ]

    def forward(signum):
        for p in workers:
            if p.pid and p.exitcode is None:
                signal_pid(p.pid, signal.SIGTERM)

    on_stop_signals(forward)
    for p in workers:
        p.start()
    first_failure: Optional[tuple[int, int]] = None
    ends: list[dict] = []
    pending = {p.sentinel: (rank, p) for rank, p in enumerate(workers)}
    while pending:
        for sentinel in wait(list(pending)):
            rank, p = pending.pop(sentinel)
            p.join()
            ends.append(process_end(rank, p.exitcode))
            if p.exitcode != EXIT_COMPLETED and first_failure is None:
                first_failure = (rank, p.exitcode)
                for _, other in pending.values():
                    signal_pid(other.pid, signal.SIGKILL)
    if first_failure is not None:
        rank, code = first_failure
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        message = f"worker {rank} ended with {how}; the other {world - 1} were killed (attempt {ctx.attempt})"
        writer = EventWriter(ctx.run_dir, f"launcher.attempt-{ctx.attempt}", run=ctx.run_id, attempt=ctx.attempt)
        writer.emit("warning", message=message, failed_rank=rank, exitcode=code, processes=ends, first_failed=rank)
        writer.close()
        raise mark_told(RuntimeError(message))  # each worker writes its own exit; the launcher none


def _worker(ctx: JobContext, rank: int, world: int, port_queue, launcher_pid: int) -> None:
    die_with_parent(launcher_pid)
    t_start = time.time()
    spec = ctx.spec
    writer = dataclasses.replace(ctx, replica=rank).writer()
    writer.emit(
        "start",
        trainer="ddp-restart",
        role="replica",
        world_size=world,
        rank=rank,
        launcher_pid=launcher_pid,
        **placement(),
    )
    stop = StopRequest()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    progress = {"step": 0}
    try:
        # torch inside the worker, after its ``start`` event: ``imports_done`` times it, and the launcher
        # (this module in the job process) never imports it.
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(1)
        writer.emit("phase", phase="imports_done", seconds=time.time() - t_start)
        timeout = timedelta(seconds=spec["torchft"]["timeout_s"])
        if rank == 0:
            store = loopback.loopback_store()
            for _ in range(world - 1):
                port_queue.put(store.port)
        else:
            store = dist.TCPStore(loopback.HOST, port_queue.get(), is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)

        m = spec["model"]
        torch.manual_seed(spec["seed"])
        model = build_model(m)
        optimizer = torch.optim.AdamW(model.parameters(), lr=m["lr"])
        warm_up_adamw(m)
        directory = checkpoint_dir(ctx.run_dir)
        found = CHECKPOINTS.durable(directory)
        if found:
            t0 = time.perf_counter()
            step = progress["step"] = max(found)
            state = torch.load(found[step], weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])
            writer.emit(
                "phase",
                phase="restored",
                from_step=step,
                seconds=time.time() - t_start,
                load_s=time.perf_counter() - t0,
                path=str(found[step]),
            )
        elif ctx.attempt > 0:
            writer.emit("phase", phase="restored", from_step=0, seconds=time.time() - t_start, path=None)
        ddp = DistributedDataParallel(model)
        writer.emit("phase", phase="model_ready", seconds=time.time() - t_start)

        reason = _train(ctx, rank, world, writer, ddp, model, optimizer, progress, stop)
    except Exception as e:
        error_exit(writer, e, step=progress["step"])
        writer.close()
        os._exit(EXIT_ERROR)
    writer.close()
    os._exit(EXIT_COMPLETED if reason == "completed" else EXIT_STOPPED)


def _train(ctx, rank, world, writer, ddp, model, optimizer, progress, stop) -> str:
    import torch  # in the worker only (see _worker)

    step = progress["step"]
    spec, m = ctx.spec, ctx.spec["model"]
    ck = spec.get("checkpoint") or {}
    every_steps, every_s, keep = ck.get("every_steps"), ck.get("every_s"), int(ck.get("keep") or 2)
    directory = checkpoint_dir(ctx.run_dir)
    steps = spec["steps"]
    checksum_every = max(1, int(spec.get("checksum_every", 10)))
    tokens = m["batch_size"] * m["seq_len"]
    emit_steps = spec.get("write_events", True)
    beat = Heartbeat(writer, spec["heartbeat_s"])
    beat.step = step
    beat.start()
    last_ckpt_t, last_ckpt_step = time.monotonic(), step
    reason = "completed"
    try:
        while step < steps:
            if stop.reason:
                reason = stop.reason
                break
            maybe_raise(step, ctx.replica, ctx.attempt, rank=rank)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            x, y = make_batch(spec["seed"], step, rank, m["batch_size"], m["seq_len"], m["vocab_size"])
            loss = torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
            if m["step_delay_s"]:
                time.sleep(m["step_delay_s"])
            step = progress["step"] = step + 1
            dt = time.perf_counter() - t0
            beat.step = step
            if emit_steps:
                fields = dict(
                    step=step,
                    loss=float(loss.item()),
                    committed=True,
                    participating=True,
                    participants=world,
                    quorum_id=ctx.attempt,
                    step_time_s=dt,
                    tokens_per_s=tokens / dt if dt else None,
                    batch_seed=[spec["seed"], step - 1, rank],
                )
                if step % checksum_every == 0 or step >= steps:
                    fields["weights"] = weights_checksum(model.state_dict())
                writer.emit("step", **fields)
            due = (every_steps and step - last_ckpt_step >= every_steps) or (
                every_s and time.monotonic() - last_ckpt_t >= every_s
            )
            if rank == 0 and due and step < steps:
                held = is_armed(ctx.run_dir, "checkpoint", rank)
                writer.emit("checkpoint", step=step, state="started", durable=False, **({"held": True} if held else {}))
                t0 = time.perf_counter()
                path = save_checkpoint(
                    directory,
                    step,
                    {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step},
                    keep,
                    before_commit=(lambda: hold_while_armed(ctx.run_dir, "checkpoint", rank)) if held else None,
                )
                writer.emit(
                    "checkpoint",
                    step=step,
                    path=str(path),
                    seconds=time.perf_counter() - t0,
                    bytes=path.stat().st_size,
                    durable=True,
                )
            if due:
                last_ckpt_t, last_ckpt_step = time.monotonic(), step
    finally:
        beat.stop()
    writer.emit("exit", reason=reason, step=step, weights=weights_checksum(model.state_dict()))
    return reason
