"""MaxText as a checkpoint-restart trainer (``trainer: maxtext``).

MaxText runs in its own environment (``.venv-maxtext``, Python >= 3.12), as it
would in its own container on a cluster. This module is the job's wrapper: it
runs in the main environment inside the submitit job, starts MaxText's
``pre_train.train`` as a child process, and turns what MaxText leaves behind
into events. It never imports MaxText or JAX itself.

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

Restart and preemption
----------------------
Every attempt uses the same ``run_name`` and ``base_output_directory``, so
MaxText restores the latest durable checkpoint by itself; the wrapper reports
it as a ``restored`` phase with ``from_step``.

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
it directly (``scancel``) works the same as the forwarded one. The child is tied to the wrapper with ``PR_SET_PDEATHSIG``: if the
wrapper is killed, MaxText dies with it, so the next attempt never shares the
checkpoint directory with a live predecessor.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

from ..rundir import dir_bytes
from .base import JobContext

TRAIN_MODULE = "maxtext.trainers.pre_train.train"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
POLL_S = 0.25

# Keys the wrapper sets from the run itself; a spec may not override them.
OWNED_KEYS = ("run_name", "base_output_directory", "metrics_file", "steps")

# Runs in .venv-maxtext: tie the child's life to the wrapper, leave SIGUSR2 to it, report compile-cache
# hits/misses, give JAX's preemption service a coordinator, then run MaxText's trainer.
LAUNCHER = r"""
import ctypes, json, os, runpy, signal, socket, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # Slurm signals every task; the wrapper forwards SIGTERM
if os.getppid() != int(os.environ["WORKBENCH_WRAPPER_PID"]):
    sys.exit("workbench: wrapper died before MaxText started")
import jax
from jax import monitoring

def _on_event(name, **_):
    if name in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
        print("WORKBENCH " + json.dumps({"compile_cache": name.rsplit("_", 1)[-1]}), flush=True)

monitoring.register_event_listener(_on_event)
if os.environ.get("WORKBENCH_LOCAL_COORDINATOR") == "1":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)
runpy.run_module(os.environ["WORKBENCH_MAXTEXT_MODULE"], run_name="__main__", alter_sys=True)
"""

_RESTORED = re.compile(r"restoring from this run's directory step (\d+)")
_DEVICES = re.compile(r"Num_devices: (\d+)")
_STOPPED = re.compile(r"Training stopped: (.*)")
_MARKER = "WORKBENCH "
_DURABLE_NAME = re.compile(r"^\d+$")
_TMP_NAME = re.compile(r"^\d+\.orbax-checkpoint-tmp")


class MaxTextIncomplete(RuntimeError):
    """MaxText ended without reaching ``steps``; the controller relaunches the job."""


def maxtext_python() -> Path:
    """The interpreter of MaxText's environment: ``$WORKBENCH_MAXTEXT_PYTHON`` or ``.venv-maxtext``."""
    env = os.environ.get("WORKBENCH_MAXTEXT_PYTHON")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".venv-maxtext" / "bin" / "python"


def jax_cache_dir(run_dir: str | os.PathLike) -> Path:
    """Compile cache shared by attempts and runs: ``$WORKBENCH_JAX_CACHE`` or ``<run_root>/.jax-cache``."""
    env = os.environ.get("WORKBENCH_JAX_CACHE")
    return Path(env) if env else Path(run_dir).resolve().parent / ".jax-cache"


def checkpoint_dir(run_dir: str | os.PathLike, run_id: str) -> Path:
    """Where MaxText puts this run's checkpoints: ``<base_output_directory>/<run_name>/checkpoints``."""
    return Path(run_dir) / "checkpoints" / run_id / "checkpoints"


def _format_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value):
        return "[" + ",".join(_format_value(key, v) for v in value) + "]"
    raise ValueError(
        f"maxtext.{key}: got {type(value).__name__}; allowed: a string, number, boolean or list of those"
    )


def maxtext_overrides(ctx: JobContext) -> dict[str, str]:
    """MaxText's ``key=value`` overrides for this job, in base.yml's names.

    The spec's ``maxtext`` section comes first; the wrapper adds the keys it owns
    (output paths, run name, steps) and defaults the ones restart and preemption
    depend on, unless the spec set them.
    """
    spec = ctx.spec
    user = spec.get("maxtext") or {}
    for key in user:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
            raise ValueError(f"maxtext.{key}: not a MaxText config key (letters, digits, _ and .)")
        if key in OWNED_KEYS:
            where = "steps" if key == "steps" else "the run directory"
            raise ValueError(f"maxtext.{key}: set by the workbench from {where}; remove it")
    run_dir = Path(ctx.run_dir).resolve()
    out = {
        "enable_checkpointing": True,
        "enable_autocheckpoint": True,
        "async_checkpointing": False,
        "init_weights_seed": spec.get("seed", 0),
        "data_shuffle_seed": spec.get("seed", 0),
        "jax_cache_dir": str(jax_cache_dir(run_dir)),
        **user,
        "run_name": ctx.run_id,
        "base_output_directory": str(run_dir / "checkpoints"),
        "metrics_file": str(metrics_file(ctx)),
        "steps": spec["steps"],
    }
    if str(out.get("hardware", "")).lower() == "cpu":
        out.setdefault("skip_jax_distributed_system", True)
    return {k: _format_value(k, v) for k, v in out.items()}


def task_rank() -> int:
    """This task's rank in a multi-node job (one wrapper and one MaxText process per node); 0 alone."""
    try:
        import submitit

        return submitit.JobEnvironment().global_rank
    except (ImportError, RuntimeError):
        return int(os.environ.get("SLURM_PROCID", "0"))


def _rank_suffix() -> str:
    rank = task_rank()
    return f".rank-{rank}" if rank else ""


def metrics_file(ctx: JobContext) -> Path:
    return Path(ctx.run_dir).resolve() / "maxtext" / f"metrics.attempt-{ctx.attempt}{_rank_suffix()}.jsonl"


def console_log(ctx: JobContext) -> Path:
    return Path(ctx.run_dir).resolve() / "maxtext" / f"attempt-{ctx.attempt}{_rank_suffix()}.log"


class _Silent:
    """The event writer of ranks > 0: one writer per replica and attempt, and rank 0 is it."""

    def emit(self, kind: str, **fields: Any) -> None:
        return None

    def close(self) -> None:
        pass


def build_command(ctx: JobContext) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment."""
    overrides = maxtext_overrides(ctx)
    python = maxtext_python()
    if not python.exists():
        raise FileNotFoundError(
            f"MaxText's Python {python} does not exist: run scripts/setup-maxtext.sh "
            "or set WORKBENCH_MAXTEXT_PYTHON"
        )
    env = dict(os.environ)
    env.update(
        WORKBENCH_WRAPPER_PID=str(os.getpid()),
        WORKBENCH_MAXTEXT_MODULE=TRAIN_MODULE,
        WORKBENCH_LOCAL_COORDINATOR="1" if overrides.get("skip_jax_distributed_system") == "true" else "0",
        PYTHONUNBUFFERED="1",
    )
    # The main environment's paths would shadow MaxText's own packages.
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    if overrides.get("hardware") == "cpu":
        env.setdefault("JAX_PLATFORMS", "cpu")
    argv = [str(python), "-c", LAUNCHER, *(f"{k}={v}" for k, v in overrides.items())]
    return argv, env


def durable_checkpoints(directory: Path) -> dict[int, Path]:
    """MaxText step -> directory, for every finalized (renamed and committed) checkpoint."""
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return found
    for entry in entries:
        if entry.is_dir() and _DURABLE_NAME.match(entry.name):
            found[int(entry.name)] = Path(entry.path)
    return found


def leftover_tmp_checkpoints(directory: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(directory) if _TMP_NAME.match(e.name))
    except OSError:
        return []


def _checkpoint_facts(path: Path) -> tuple[Optional[float], int]:
    """(seconds from Orbax's init to commit, bytes on disk) of a finalized checkpoint."""
    seconds = None
    try:
        meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
        if meta.get("commit_timestamp_nsecs") and meta.get("init_timestamp_nsecs"):
            seconds = (meta["commit_timestamp_nsecs"] - meta["init_timestamp_nsecs"]) / 1e9
    except (OSError, ValueError):
        pass
    return seconds, dir_bytes(path)


class _Console:
    """Reads MaxText's console in a thread: keeps it on disk and picks out the facts."""

    def __init__(self, stream, log_path: Path, on_restored) -> None:
        self.stream = stream
        self.log_path = log_path
        self.on_restored = on_restored
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.cache_hits = 0
        self.cache_misses = 0
        self.devices = 1
        self.stopped_because: Optional[str] = None
        self.thread = threading.Thread(target=self._read, name="maxtext-console", daemon=True)

    def start(self) -> "_Console":
        self.thread.start()
        return self

    def _read(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in self.stream:
                log.write(line)
                log.flush()
                self._parse(line.rstrip("\n"))

    def _parse(self, line: str) -> None:
        self.tail.append(line)
        if line.startswith(_MARKER):
            try:
                fact = json.loads(line[len(_MARKER):])
            except ValueError:
                return
            if fact.get("compile_cache") == "hits":
                self.cache_hits += 1
            elif fact.get("compile_cache") == "misses":
                self.cache_misses += 1
            return
        if m := _RESTORED.search(line):
            self.on_restored(int(m.group(1)))
        elif m := _DEVICES.search(line):
            self.devices = int(m.group(1))
        elif m := _STOPPED.search(line):
            self.stopped_because = m.group(1)

    def error_line(self) -> Optional[str]:
        for line in reversed(self.tail):
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line):
                return line
        return self.tail[-1] if self.tail else None


class _Metrics:
    """Incremental reader of MaxText's metrics file (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = []
        for line in data[: end + 1].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
        return rows


def _finite(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def run(ctx: JobContext) -> None:
    """Run MaxText to ``steps`` (resuming from the last durable checkpoint) and report it."""
    writer = ctx.writer() if task_rank() == 0 else _Silent()
    t0 = time.time()
    steps = int(ctx.spec["steps"])
    heartbeat_s = float(ctx.spec.get("heartbeat_s", 1.0))
    try:
        argv, env = build_command(ctx)
    except (ValueError, FileNotFoundError) as e:
        writer.emit("start", trainer="maxtext", world_size=1, role="replica")
        writer.emit("exit", reason="error", step=None, error=str(e))
        writer.close()
        raise
    ckpt_dir = checkpoint_dir(ctx.run_dir, ctx.run_id)
    seen = set(durable_checkpoints(ckpt_dir))
    writer.emit("start", trainer="maxtext", world_size=1, role="replica", checkpoint_dir=str(ckpt_dir))
    for name in leftover_tmp_checkpoints(ckpt_dir):
        writer.emit("warning", message=f"half-written checkpoint {name} left by an earlier attempt; not restored")

    def on_restored(maxtext_step: int) -> None:
        writer.emit("phase", phase="restored", from_step=maxtext_step + 1, seconds=time.time() - t0)

    metrics_file(ctx).parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", bufsize=1,
    )
    writer.emit("phase", phase="launched", maxtext_pid=child.pid, seconds=time.time() - t0)
    console = _Console(child.stdout, console_log(ctx), on_restored).start()
    stop = _StopForwarder(child).install()
    metrics = _Metrics(metrics_file(ctx))
    last_step: Optional[int] = None
    first_step_reported = False
    last_beat = time.time()

    def drain() -> None:
        nonlocal last_step, first_step_reported
        for row in metrics.poll():
            step = int(row["step"]) + 1
            tokens = _finite(row.get("perf/per_device_tokens_per_sec"))
            writer.emit(
                "step", step=step, loss=_finite(row.get("learning/loss")),
                step_time_s=_finite(row.get("perf/step_time_seconds")),
                tokens_per_s=tokens * console.devices if tokens is not None else None,
                committed=True, participating=True, participants=1,
            )
            last_step = step if last_step is None else max(last_step, step)
            if not first_step_reported:
                first_step_reported = True
                writer.emit(
                    "phase", phase="first_step", step=step, seconds=time.time() - t0,
                    compile_cache_hits=console.cache_hits, compile_cache_misses=console.cache_misses,
                )
        for maxtext_step, path in sorted(durable_checkpoints(ckpt_dir).items()):
            if maxtext_step in seen:
                continue
            seconds, size = _checkpoint_facts(path)
            if seconds is None:
                continue  # renamed but not yet committed: look again next poll
            seen.add(maxtext_step)
            writer.emit(
                "checkpoint", step=maxtext_step + 1, path=str(path), seconds=seconds, bytes=size, durable=True
            )

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
        step=reached, saved_step=saved_step, returncode=rc,
        compile_cache_hits=console.cache_hits, compile_cache_misses=console.cache_misses,
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
    writer.emit("exit", reason=reason, error=error, **fields)
    writer.close()
    raise MaxTextIncomplete(f"maxtext {reason} at step {reached} of {steps} (exit code {rc}): {error or ''}")


class _StopForwarder:
    """Turns SIGTERM/SIGUSR2 on the wrapper into one SIGTERM to MaxText (its preemption notice)."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child = child
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def install(self) -> "_StopForwarder":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            return
        self.signum = signum  # reported by the main loop: emitting here could deadlock on the writer's lock
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)


__all__ = ["run", "build_command", "maxtext_overrides", "durable_checkpoints", "MaxTextIncomplete"]
