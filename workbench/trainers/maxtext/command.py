"""What a MaxText job runs: the child's argv and environment, MaxText's overrides, and where it writes.

The wrapper (:mod:`.maxtext`) owns the run name, output directory, metrics
file and step count; the spec's ``maxtext`` section sets every other key of
MaxText's ``base.yml``. The child runs ``launcher.py`` (:data:`LAUNCHER`) in MaxText's own
interpreter, with the main environment's Python paths removed.

More than one process
---------------------
A Slurm job of ``slurm.nodes`` x ``slurm.tasks_per_node`` tasks runs one
wrapper and one MaxText process per task, all one JAX program
(``jax.distributed``). MaxText starts it itself
(``max_utils.maybe_initialize_jax_distributed_system``) from the environment
its launcher would set: for ``hardware: cpu`` XPK's (``JAX_COORDINATOR_ADDRESS``,
``JOB_INDEX``, ``JOB_COMPLETION_INDEX``, ``PROCESSES_IN_JOB``,
``JAX_PROCESS_COUNT``), for ``hardware: gpu`` its own (``JAX_COORDINATOR_IP``/``_PORT``,
``NNODES``, ``NODE_RANK``); ``gpu_multiprocess`` is JAX's own Slurm detection. The
coordinator is the job's first node at the address Slurm records for it
(``NodeAddr``, :func:`workbench.trainers.placement.node_address`), and it
binds that address only (``JAX_COORDINATOR_BIND_ADDRESS``; JAX's default is
every interface). Its port is the job's own (:func:`coordinator_port`, from the
Slurm job id), so two jobs whose first node is the same node do not collide.
MaxText's CPU path dials port 1234 whatever the environment says
(``max_utils.initialize_jax_for_cpu``), so the launcher puts the job's port
into the address MaxText passes to ``jax.distributed.initialize``
(``WORKBENCH_COORDINATOR_PORT``). The processes' collectives are JAX's CPU collectives
(``jax_cpu_collectives_implementation``, gloo by default): each process's
gloo listens on its own node's ``NodeAddr`` and publishes it through the
coordinator's key-value store. The job runs ``srun --kill-on-bad-exit=1``
(``slurm_client.executor_parameters``): one lost task ends the job.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Optional

from workbench.paths import CHECKOUT
from workbench.trainers.base import JobContext
from workbench.trainers.placement import node_address

TRAIN_MODULE = "maxtext.trainers.pre_train.train"

# Keys the wrapper sets from the run itself; a spec may not override them.
OWNED_KEYS = ("run_name", "base_output_directory", "metrics_file", "steps")

# MaxText's initialize_jax_for_cpu dials the coordinator on this port ("the port XPK exposes for CPU workloads");
# the launcher replaces it with the job's (coordinator_port).
MAXTEXT_CPU_PORT = 1234
# Coordinator ports of Slurm jobs: below Linux's ephemeral range (32768-60999), so no outgoing connection holds
# one, and clear of the dev cluster's daemons (20000-30000), torch's default 29500 and the workbench's own
# listeners (8866, 9464).
COORDINATOR_PORTS = range(10000, 20000)
# The hardware values with which MaxText starts jax.distributed over several processes.
MULTI_PROCESS_HARDWARE = ("cpu", "gpu", "gpu_multiprocess")

# The child's program: launcher.py, run by MaxText's interpreter (see its docstring).
LAUNCHER = Path(__file__).with_name("launcher.py")


def maxtext_python() -> Path:
    """The interpreter of MaxText's environment: ``$WORKBENCH_MAXTEXT_PYTHON`` or ``.venv-maxtext``."""
    env = os.environ.get("WORKBENCH_MAXTEXT_PYTHON")
    if env:
        return Path(env)
    return CHECKOUT / ".venv-maxtext" / "bin" / "python"


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
    raise ValueError(f"maxtext.{key}: got {type(value).__name__}; allowed: a string, number, boolean or list of those")


def check_spec(maxtext: dict, processes: int) -> None:
    """The ``maxtext`` section against a job of ``processes`` processes; ValueError naming the key.

    Run before submit (the Slurm backend's validation) and again in the job.
    """
    for key in maxtext:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key):
            raise ValueError(f"maxtext.{key}: not a MaxText config key (letters, digits, _ and .)")
        if key in OWNED_KEYS:
            where = "steps" if key == "steps" else "the run directory"
            raise ValueError(f"maxtext.{key}: set by the workbench from {where}; remove it")
    if processes > 1:
        hardware = str(maxtext.get("hardware", "tpu"))
        if hardware not in MULTI_PROCESS_HARDWARE:
            raise ValueError(
                f"maxtext.hardware: {hardware!r} cannot run as {processes} processes of one job here; "
                f"allowed: {', '.join(MULTI_PROCESS_HARDWARE)}"
            )
        if maxtext.get("skip_jax_distributed_system") is True:
            raise ValueError(
                f"maxtext.skip_jax_distributed_system: true leaves the job's {processes} processes "
                "as separate programs; allowed: false"
            )


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """This task's place in its job: its rank, the job's process count, its nodes (rank 0 on the first)."""

    rank: int = 0
    processes: int = 1
    nodes: tuple[str, ...] = ()

    @property
    def first_node(self) -> Optional[str]:
        return self.nodes[0] if self.nodes else None


def job_layout() -> JobLayout:
    """From submitit's job environment (Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``)."""
    try:
        import submitit  # inside the try: without submitit, or outside its job, the Slurm variables below

        env = submitit.JobEnvironment()
        return JobLayout(env.global_rank, env.num_tasks, tuple(env.hostnames) if env.num_tasks > 1 else ())
    except (ImportError, RuntimeError):
        return JobLayout(int(os.environ.get("SLURM_PROCID", "0")), int(os.environ.get("SLURM_NTASKS", "1")))


def coordinator_address(layout: JobLayout) -> str:
    """Where rank 0's JAX coordinator listens: its node's address as Slurm records it, else loopback."""
    if layout.first_node and os.environ.get("SLURM_JOB_ID"):
        return node_address(layout.first_node)
    return "127.0.0.1"


def own_address() -> str:
    """This task's node address as Slurm records it, else loopback."""
    node = os.environ.get("SLURMD_NODENAME")
    if node and os.environ.get("SLURM_JOB_ID"):
        return node_address(node)
    return "127.0.0.1"


def coordinator_port(job_id: str) -> int:
    """The JAX coordinator's port for Slurm job ``job_id`` (every task of the job computes the same one).

    Two jobs share a port only when their ids are ``len(COORDINATOR_PORTS)`` apart; a requeued job keeps
    its id and its port, its earlier coordinator gone with it.
    """
    base = job_id.split("_", 1)[0]  # an array task's SLURM_JOB_ID is already its own; "123_4" is the display form
    if not base.isdigit():
        raise ValueError(f"SLURM_JOB_ID: {job_id!r}; allowed: a Slurm job id (digits)")
    return COORDINATOR_PORTS[int(base) % len(COORDINATOR_PORTS)]


def distributed_env(hardware: str, layout: JobLayout, address: str, own: str, port: int) -> dict[str, str]:
    """The environment MaxText reads to start ``jax.distributed`` for ``hardware`` (see the module's docstring).

    ``address`` is the coordinator's (rank 0's node), ``port`` the job's (:func:`coordinator_port`),
    ``own`` this task's node: gloo listens there.
    """
    if layout.processes == 1 or hardware == "gpu_multiprocess":
        return {}
    bind = f"[{address}]" if ":" in address else address
    env = {"JAX_COORDINATOR_BIND_ADDRESS": f"{bind}:{port}", "WORKBENCH_GLOO_HOSTNAME": own}
    if hardware == "cpu":
        env.update(
            JAX_COORDINATOR_ADDRESS=address,
            JOB_INDEX="0",
            JOB_COMPLETION_INDEX=str(layout.rank),
            PROCESSES_IN_JOB=str(layout.processes),
            JAX_PROCESS_COUNT=str(layout.processes),
            WORKBENCH_COORDINATOR_PORT=str(port),
        )
    elif hardware == "gpu":
        env.update(
            JAX_COORDINATOR_IP=address,
            JAX_COORDINATOR_PORT=str(port),
            NNODES=str(layout.processes),
            NODE_RANK=str(layout.rank),
        )
    return env


def maxtext_overrides(ctx: JobContext, processes: int = 1) -> dict[str, str]:
    """MaxText's ``key=value`` overrides for this job, in base.yml's names.

    The spec's ``maxtext`` section comes first; the wrapper adds the keys it owns
    (output paths, run name, steps) and defaults the ones restart and preemption
    depend on, unless the spec set them.
    """
    spec = ctx.spec
    user = spec.get("maxtext") or {}
    check_spec(user, processes)
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
        out.setdefault("skip_jax_distributed_system", processes == 1)
    return {k: _format_value(k, v) for k, v in out.items()}


def task_rank() -> int:
    """This task's rank in a multi-node job (one wrapper and one MaxText process per node); 0 alone."""
    return job_layout().rank


def _rank_suffix() -> str:
    rank = task_rank()
    return f".rank-{rank}" if rank else ""


def metrics_file(ctx: JobContext) -> Path:
    return Path(ctx.run_dir).resolve() / "maxtext" / f"metrics.attempt-{ctx.attempt}{_rank_suffix()}.jsonl"


def console_log(ctx: JobContext) -> Path:
    return Path(ctx.run_dir).resolve() / "maxtext" / f"attempt-{ctx.attempt}{_rank_suffix()}.log"


def build_command(ctx: JobContext, layout: Optional[JobLayout] = None) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment."""
    layout = layout or job_layout()
    overrides = maxtext_overrides(ctx, layout.processes)
    python = maxtext_python()
    if not python.exists():
        raise FileNotFoundError(
            f"MaxText's Python {python} does not exist: run scripts/setup-maxtext.sh or set WORKBENCH_MAXTEXT_PYTHON"
        )
    env = dict(os.environ)
    env.update(
        WORKBENCH_WRAPPER_PID=str(os.getpid()),
        WORKBENCH_REPLICA=str(ctx.replica),
        WORKBENCH_ATTEMPT=str(ctx.attempt),
        WORKBENCH_RANK=str(layout.rank),
        WORKBENCH_MAXTEXT_MODULE=TRAIN_MODULE,
        WORKBENCH_MAXTEXT_PRELOAD=TRAIN_MODULE,  # its module body only defines: imported before it runs (launcher.py)
        WORKBENCH_LOCAL_COORDINATOR="1" if overrides.get("skip_jax_distributed_system") == "true" else "0",
        PYTHONUNBUFFERED="1",
    )
    # The main environment's paths would shadow MaxText's own packages.
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    if overrides.get("hardware") == "cpu":
        env.setdefault("JAX_PLATFORMS", "cpu")
    # Every compile into the persistent cache (``jax_cache_dir``), not only those over JAX's default 1 s: a restart's
    # small compiles (the state's initialisation, the step's helpers) are hits too.
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    if layout.processes > 1:
        port = coordinator_port(os.environ["SLURM_JOB_ID"]) if os.environ.get("SLURM_JOB_ID") else MAXTEXT_CPU_PORT
        env.update(
            distributed_env(overrides.get("hardware", "tpu"), layout, coordinator_address(layout), own_address(), port)
        )
    argv = [str(python), str(LAUNCHER), *(f"{k}={v}" for k, v in overrides.items())]
    return argv, env
