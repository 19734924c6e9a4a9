"""MaxText as a checkpoint-restart trainer (``trainer: maxtext``).

MaxText runs in its own environment (``.venv-maxtext``, Python >= 3.12), as it
would in its own container on a cluster. This module is the job's wrapper: it
runs in the main environment inside the submitit job, starts MaxText's
``pre_train.train`` as a child process (the command: :mod:`.maxtext_command`),
and turns what MaxText leaves behind into events (the readers:
:mod:`.maxtext_output`). It never imports MaxText or JAX itself.

What the wrapper reads
----------------------
* the metrics file (``metrics_file``, JSONL, one line per step, written one
  step late because MaxText buffers a step to avoid a host sync): ``step``
  events;
* the checkpoint directory: Orbax writes ``<N>.orbax-checkpoint-tmp`` and
  renames it to ``<N>`` when the save is finalized, with the init and commit
  times in ``_CHECKPOINT_METADATA``. Only a renamed, committed directory is
  reported (``durable=True``), and only such a directory is ever restored:
  Orbax lists finalized steps only and deletes a stale tmp directory before it
  reuses its name;
* the console (kept in ``<run_dir>/maxtext/attempt-<a>.log``): the restored
  step, the device count, why training stopped, and the compile-cache hits
  and misses the launcher reports from ``jax.monitoring``.

Steps
-----
MaxText numbers steps from 0 and names a checkpoint after the step that
produced it. Events count completed optimizer steps, like the torchft
trainers: MaxText's step ``N`` is event step ``N + 1``, a checkpoint directory
``<N>`` holds event step ``N + 1``, and a run of ``steps`` ends at event step
``steps``.

Start-up phases and the standby
-------------------------------
The launcher reports MaxText's start-up (``interpreter_up``, ``imports_done``, ``backend_ready``,
``compiled``: :mod:`.launcher`); each becomes a ``phase`` event here, beside ``launched``, ``restored``
and ``first_step``. Measured (one process, this machine's two cores, kill -> first step 7.2-8.0 s): the
new interpreter's imports were 4.7 s of it, the train step's compile 0.9-2 s (one persistent-cache miss
per restart: JAX caches only compiles over 1 s unless told otherwise, :func:`.command.build_command`),
Orbax's restore 0.07 s. So once an attempt has taken its first step, the wrapper leaves a standby for the
next attempt (:mod:`.standby`); where one is waiting, MaxText is forked from it, its imports done. On
Slurm, where a job's processes end with it, a hot spare job (``spares: N``, :mod:`.spare`) has a standby on
each of its nodes, and takes over at once when the job ends.

Restart and preemption
----------------------
Every attempt uses the same ``run_name`` and ``base_output_directory``, so
MaxText restores the latest durable checkpoint by itself; the wrapper reports
it as a ``restored`` phase with ``from_step``.

A save can be committed after the wrapper's last look at the directory and
before the wrapper is killed (it polls every ``POLL_S``, and under load reads
MaxText's output a few steps behind it): no ``checkpoint`` event records it,
yet the next attempt restores it. So each attempt first records, with
``late=True``, every durable checkpoint that no event of the run records yet:
a restore is always of a recorded save (measured: attempt 0 recorded its
saves to step 31, was killed at its step 39 as its events read, and attempt 1
restored step 41).

A planned stop loses nothing: MaxText runs with ``enable_autocheckpoint``, and
JAX's preemption service (part of ``jax.distributed``) turns SIGTERM into a
sync point at the next step, where MaxText saves a checkpoint and exits 0
("Training stopped"). Where MaxText would not start ``jax.distributed``
itself (``skip_jax_distributed_system``, the single-process case), the
launcher starts a one-process coordinator so the service exists. The wrapper
forwards the SIGTERM or SIGUSR2 it receives (what Slurm and submitit send) to
MaxText as SIGTERM and reports ``exit`` with ``reason="preempted"`` and the
saved step. MaxText ignores SIGUSR2 itself (Slurm's ``--signal`` reaches every
process of the step, and Python would die of it), and a SIGTERM that reaches
it directly (``scancel``) works the same as the forwarded one. The child is
tied to the wrapper with ``PR_SET_PDEATHSIG``: if the wrapper is killed,
MaxText dies with it, so the next attempt never shares the checkpoint
directory with a live predecessor.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from typing import Any, Optional

from workbench.events.reader import read_all
from workbench.events.tracebacks import last_traceback, one_line
from workbench.trainers.base import JobContext
from workbench.trainers.exits import error_exit, mark_told, process_end
from workbench.trainers.kit import on_stop_signals
from workbench.trainers.maxtext import spare as maxtext_spare
from workbench.trainers.maxtext import standby
from workbench.trainers.maxtext.command import build_command, checkpoint_dir, console_log, job_layout, metrics_file
from workbench.trainers.maxtext.output import (
    Console,
    Metrics,
    checkpoint_facts,
    durable_checkpoints,
    leftover_tmp_checkpoints,
)
from workbench.trainers.placement import placement

POLL_S = 0.25


class MaxTextIncomplete(RuntimeError):
    """MaxText ended without reaching ``steps``; the controller relaunches the job."""


class _Silent:
    """The event writer of ranks > 0: one writer per replica and attempt, and rank 0 is it."""

    def emit(self, kind: str, **fields: Any) -> None:
        return None

    def close(self) -> None:
        pass


def _loss(x: Any) -> Optional[float]:
    """A loss as MaxText wrote it: NaN stays NaN (a divergence must show), a missing one is None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _finite(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def record_late_saves(writer, run_dir, ckpt_dir) -> list[int]:
    """Record (``late=True``) each durable checkpoint in ``ckpt_dir`` that no ``checkpoint`` event of the
    run records: a save committed after the killed attempt's last look. Returns their event steps."""
    recorded = {
        e["step"]
        for e in read_all(run_dir)
        if e.get("kind") == "checkpoint" and e.get("durable") and isinstance(e.get("step"), int)
    }
    late = []
    for maxtext_step, path in sorted(durable_checkpoints(ckpt_dir).items()):
        if maxtext_step + 1 not in recorded:
            seconds, size = checkpoint_facts(path)
            writer.emit(
                "checkpoint",
                step=maxtext_step + 1,
                path=str(path),
                seconds=seconds,
                bytes=size,
                durable=True,
                late=True,
            )
            late.append(maxtext_step + 1)
    return late


def run(ctx: JobContext) -> None:
    """Run MaxText to ``steps`` (resuming from the last durable checkpoint) and report it.

    Rank 0 writes the ``exit``; an exception of the wrapper itself is told there too, and on the other ranks
    nowhere (:class:`_Silent`: one ``exit`` per attempt)."""
    layout = job_layout()
    writer = ctx.writer() if layout.rank == 0 else _Silent()
    try:
        spare_id, standby_path = ctx.spare_id, None
        if spare_id is not None:
            standby_path = maxtext_spare.wait_as_spare(ctx, layout, writer)
            writer.close()
            if standby_path is None:
                return
            writer = ctx.writer() if layout.rank == 0 else _Silent()
        _run(ctx, layout, writer, spare_id, standby_path)
    except Exception as e:
        error_exit(writer, e, step=None)
        writer.close()
        raise


def _run(ctx: JobContext, layout, writer, spare_id: Optional[int], standby_path) -> None:
    """``spare_id``: the spare this attempt was (``standby_path`` its standby's socket), else None."""
    t0 = time.time()
    steps = int(ctx.spec["steps"])
    heartbeat_s = float(ctx.spec.get("heartbeat_s", 1.0))
    try:
        argv, env = build_command(ctx, layout)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        writer.emit("start", trainer="maxtext", world_size=layout.processes, role="replica")
        error_exit(writer, e, step=None)
        writer.close()
        raise
    ckpt_dir = checkpoint_dir(ctx.run_dir, ctx.run_id)
    seen = set(durable_checkpoints(ckpt_dir))
    writer.emit(
        "start",
        trainer="maxtext",
        world_size=layout.processes,
        role="replica",
        checkpoint_dir=str(ckpt_dir),
        coordinator=env.get("JAX_COORDINATOR_BIND_ADDRESS"),
        nodes=list(layout.nodes),
        **placement(),
        **({"from_spare": spare_id} if spare_id is not None else {}),
    )
    for name in leftover_tmp_checkpoints(ckpt_dir):
        writer.emit("warning", message=f"half-written checkpoint {name} left by an earlier attempt; not restored")
    if layout.rank == 0:
        record_late_saves(writer, ctx.run_dir, ckpt_dir)

    def on_restored(maxtext_step: int) -> None:
        writer.emit("phase", phase="restored", from_step=maxtext_step + 1, seconds=time.time() - t0)

    def on_phase(fact: dict) -> None:
        writer.emit("phase", **{**fact, "seconds": time.time() - t0})

    metrics_file(ctx).parent.mkdir(parents=True, exist_ok=True)
    warm = standby.enabled(layout.processes)
    next_standby = standby.socket_path(ctx.run_dir, ctx.replica)
    standby_path = standby_path or (next_standby if warm else None)
    child, why_cold = standby.claim(standby_path, argv[2:], env) if standby_path else (None, None)
    if child is None:
        child = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
    fields = dict(warm=isinstance(child, standby.StandbyChild), **({"standby": why_cold} if why_cold else {}))
    writer.emit("phase", phase="launched", maxtext_pid=child.pid, seconds=time.time() - t0, **fields)
    console = Console(child.stdout, console_log(ctx), on_restored, on_phase).start()
    stop = _StopForwarder(child).install()
    metrics = Metrics(metrics_file(ctx))
    last_step: Optional[int] = None
    first_step_reported = False
    last_beat = time.time()

    def drain() -> None:
        nonlocal last_step, first_step_reported
        for row in metrics.poll():
            step = int(row["step"]) + 1
            tokens = _finite(row.get("perf/per_device_tokens_per_sec"))
            writer.emit(
                "step",
                step=step,
                loss=_loss(row.get("learning/loss")),
                step_time_s=_finite(row.get("perf/step_time_seconds")),
                tokens_per_s=tokens * console.devices if tokens is not None else None,
                committed=True,
                participating=True,
                participants=1,
            )
            last_step = step if last_step is None else max(last_step, step)
            if not first_step_reported:
                first_step_reported = True
                writer.emit(
                    "phase",
                    phase="first_step",
                    step=step,
                    seconds=time.time() - t0,
                    compile_cache_hits=console.cache_hits,
                    compile_cache_misses=console.cache_misses,
                )
                keeper = standby.keeper(ctx.run_dir) if warm else None
                if keeper is not None:  # for the next attempt, now that this one's restart is over
                    standby.start(argv[0], argv[1], next_standby, env, keeper)
        for maxtext_step, path in sorted(durable_checkpoints(ckpt_dir).items()):
            if maxtext_step in seen:
                continue
            seconds, size = checkpoint_facts(path)
            if seconds is None:
                continue  # renamed but not yet committed: look again next poll
            seen.add(maxtext_step)
            writer.emit("checkpoint", step=maxtext_step + 1, path=str(path), seconds=seconds, bytes=size, durable=True)

    stop_reported = False
    try:
        while child.poll() is None:
            drain()
            if stop.signum is not None and not stop_reported:
                stop_reported = True
                writer.emit("phase", phase="stopping", signal=signal.Signals(stop.signum).name)
            if time.time() - last_beat >= heartbeat_s:
                writer.emit("heartbeat", step=last_step)
                last_beat = time.time()
            time.sleep(POLL_S)
        rc = child.wait()
        ended = process_end(layout.rank, rc)
        console.thread.join(timeout=30)
        drain()
    except KeyboardInterrupt:  # submitit's cancel: SIGINT, then SIGKILL a second later
        child.kill()
        child.wait()
        writer.emit("exit", reason="stopped", step=last_step, error="cancelled (SIGINT)")
        writer.close()
        raise
    finally:
        stop.uninstall()
        if child.poll() is None:
            child.kill()
            child.wait()

    latest = max(durable_checkpoints(ckpt_dir), default=None)
    saved_step = latest + 1 if latest is not None else None
    reached = max(last_step or 0, saved_step or 0)
    fields = dict(
        step=reached,
        saved_step=saved_step,
        returncode=rc,
        compile_cache_hits=console.cache_hits,
        compile_cache_misses=console.cache_misses,
        processes=[ended],
        **({"first_failed": layout.rank} if rc != 0 else {}),
    )
    if rc == 0 and reached >= steps:
        writer.emit("exit", reason="completed", **fields)
        writer.close()
        return
    preempted = rc == 0 and console.stopped_because is not None and "termination signal" in console.stopped_because
    if preempted:
        reason, error = "preempted", None
    elif stop.signum is not None:
        reason, error = "stopped", f"stopped by {signal.Signals(stop.signum).name}; MaxText exited {rc}"
    else:
        reason, error = "error", console.error_line() or f"MaxText exited {rc}"
        exception = last_traceback(tail_text(console_log(ctx))) if rc != 0 else None
        if exception is not None:  # MaxText's own uncaught exception, as its traceback in the console shows it
            error, fields["exception"] = one_line(exception), {**exception, "rank": layout.rank}
    writer.emit("exit", reason=reason, error=error, **fields)
    writer.close()
    raise mark_told(MaxTextIncomplete(f"maxtext {reason} at step {reached} of {steps} (exit code {rc}): {error or ''}"))


def tail_text(path, max_bytes: int = 1 << 20) -> str:
    """The last ``max_bytes`` of a text file ('' if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - max_bytes))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class _StopForwarder:
    """Turns SIGTERM/SIGUSR2 on the wrapper into one SIGTERM to MaxText (its preemption notice)."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child
        self.signum: Optional[int] = None
        self.uninstall = lambda: None

    def install(self) -> "_StopForwarder":
        self.uninstall = on_stop_signals(self._handle)
        return self

    def _handle(self, signum: int) -> None:
        if self.signum is not None:
            return
        self.signum = signum  # reported by the main loop: emitting here could deadlock on the writer's lock
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
