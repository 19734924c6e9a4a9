"""What a MaxText job runs: the child's argv and environment, MaxText's overrides, and where it writes.

The wrapper (:mod:`.maxtext`) owns the run name, output directory, metrics
file and step count; the spec's ``maxtext`` section sets every other key of
MaxText's ``base.yml``. The child runs :data:`LAUNCHER` in MaxText's own
interpreter, with the main environment's Python paths removed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .base import JobContext

TRAIN_MODULE = "maxtext.trainers.pre_train.train"

# Keys the wrapper sets from the run itself; a spec may not override them.
OWNED_KEYS = ("run_name", "base_output_directory", "metrics_file", "steps")

# Runs in .venv-maxtext, which cannot import workbench (hence its own PR_SET_PDEATHSIG, not kit.die_with_parent):
# tie the child's life to the wrapper, leave SIGUSR2 to it, report compile-cache hits/misses, give JAX's
# preemption service a coordinator, then run MaxText's trainer. That coordinator serves this one process:
# it listens on 127.0.0.1 (JAX's default bind address is [::], every interface).
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
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0,
                               coordinator_bind_address=f"127.0.0.1:{port}")
runpy.run_module(os.environ["WORKBENCH_MAXTEXT_MODULE"], run_name="__main__", alter_sys=True)
"""


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
