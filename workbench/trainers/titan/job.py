"""TorchTitan + TorchFT as a workbench trainer (``trainer: titan``): the job that starts a replica group's ranks.

:func:`run` runs inside the submitit job of one replica group and attempt. It
builds the offline assets, turns the spec's ``titan`` section and its TOML
config into torchtitan flags, and starts ``nproc_per_replica`` rank processes
of :mod:`.rank`, like ``torchrun`` does: the job process hosts the
group's TCPStore (``TORCHELASTIC_USE_AGENT_STORE``) and every rank dies with
the job (``PR_SET_PDEATHSIG``), so killing the job's PID kills the replica
group. It writes ``start`` and, if a rank fails, ``exit`` with
``reason="error"`` to the replica's file: how each rank ended, in order
(``processes``), the first that failed (``first_failed``) and the exception
its traceback shows (``exception``, with its ``rank``), read back from the
rank's stderr, which the job copies to its own stderr and to
``<run_dir>/titan/<writer>.rank-<k>.stderr`` (:mod:`.process_group`); rank 0 of the group writes every
other event of the replica to a file of its own,
``replica-<r>.attempt-<a>.rank-0.jsonl`` (one writer per file; see
:mod:`.rank`).

A preemption signal (SIGTERM locally, SIGUSR2 on Slurm: what the ``preempt``
fault sends to this process) is forwarded to every rank; the ranks stop
together at a step boundary (:mod:`.group_stop`) and rank 0 reports ``exit``
with ``reason="preempted"``. Each rank starts with the stop signals held
pending (:func:`.kit.hold_stop_signals`), so one that arrives while its
interpreter starts is delivered once its handler exists.

Ranks started warm
------------------
On the local backend the fork server has imported torch, the CPU patches and
torchtitan (``TrainerKind.warm_up``: :func:`.rank.warm_up`) before it forks this
job, so the job parses the config and forks its ranks from itself
(:mod:`workbench.trainers.forked`) before it opens the store: kill →
participating 2.7 s with one rank per group, 4.5 s with two, against 7.4 s
exec'd (medians of 6 kills each, ``bench/titan_recovery.py``; the new rank's
imports took 4.5 s of it). Elsewhere, or with
``WORKBENCH_TITAN_WARM_RANKS=0``, each rank is ``python -m`` :mod:`.rank`.

Every listener binds one address (``ctx.listen_host()``): 127.0.0.1 on a local
run, the node's own on Slurm; the ranks install :mod:`.loopback` with it
(``WORKBENCH_BIND_HOST``) before torchtitan builds torchft's Manager.

Over several nodes
------------------
With ``slurm.nodes: N`` the group's job has N Slurm tasks, one per node (the
``srun`` submitit does), each running :func:`run`: task ``t`` starts ranks
``t*nproc .. t*nproc+nproc-1`` (``GROUP_RANK=t``), so the group has
``N*nproc`` ranks. Task 0 hosts the group's TCPStore on its node's address and
publishes the port in ``rendezvous/replica-<r>.attempt-<a>.json`` (the run
directory is shared); the other tasks read it and point their ranks'
``MASTER_ADDR`` at task 0's node, as ``torchrun --rdzv-endpoint`` would. Task
0 writes the replica's ``start``/``exit``; task ``t > 0`` writes a ``start``
(its node, address and PID, ``task=t``) to ``replica-<r>.attempt-<a>.task-<t>``,
so the fold knows every node the group is on. Killing the job's step
(``scancel --signal=KILL JOB.0``) kills every task and so every rank on every node.

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
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Optional

from workbench.events.tracebacks import one_line
from workbench.paths import CHECKOUT, CONFIG_DIR
from workbench.run import rank_pids
from workbench.trainers import forked, loopback
from workbench.trainers.base import JobContext
from workbench.trainers.exits import error_exit, mark_told
from workbench.trainers.kit import die_with_parent, hold_stop_signals, on_stop_signals, signal_pid
from workbench.trainers.placement import placement
from workbench.trainers.process_group import ProcessGroup
from workbench.trainers.titan import spare as titan_spare
from workbench.trainers.titan.assets import ensure_assets
from workbench.trainers.titan.rank import forked_rank, parse_ahead
from workbench.trainers.torchft import pg_timeout

RANK_MODULE = "workbench.trainers.titan.rank"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SEMI_SYNC_METHOD = {"localsgd": "local_sgd", "diloco": "diloco", "streaming_diloco": "diloco"}
"""``ft.algorithm`` → TorchTitan's ``fault_tolerance.semi_sync_method`` (its ``maybe_semi_sync_training`` knows
these two; streaming DiLoCo is its ``diloco`` with ``num_fragments`` > 1)."""


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
    derived = {
        "training.steps": spec["steps"],
        "debug.seed": spec["seed"],
        "fault_tolerance.enable": True,
        "fault_tolerance.replica_id": ctx.replica,
        "fault_tolerance.group_size": spec["replicas"],
        "fault_tolerance.min_replica_size": spec["min_replicas"],
        "fault_tolerance.process_group_timeout_ms": pg_timeout.in_effect_ms(spec),
        "checkpoint.enable": True,
        "dump_folder": str(Path(ctx.run_dir) / "checkpoints" / "titan"),
        "hf_assets_path": str(assets / "tokenizer"),
        "dataloader.dataset_path": str(assets / "corpus"),
    }
    derived.update(ft_overrides(spec))
    return titan_flags(config, {**derived, **(titan.get("overrides") or {})}) + list(titan.get("extra_args") or [])


def ft_overrides(spec: dict) -> dict:
    """The spec's ``ft`` section as TorchTitan's own ``fault_tolerance`` options.

    torchtitan's ``maybe_semi_sync_training`` builds torchft's ``LocalSGD``
    (``semi_sync_method = "local_sgd"``) or ``DiLoCo`` (``"diloco"``) around
    its optimizers, with ``sync_every = sync_steps``; streaming DiLoCo is its
    ``diloco`` with ``num_fragments`` > 1 (the model spec's ``fragment_fn``
    splits the decoder: embeddings, layers, norm + head), and a semi-sync
    method makes its Manager's quorum synchronous. ``ddp`` leaves the TOML's
    per-step fault tolerance as it is. The outer optimizer is torchtitan's
    fixed one (spec validation refuses other values).
    """
    ft = spec.get("ft") or {}
    algorithm = ft.get("algorithm", "ddp")
    if algorithm == "ddp":
        return {}
    out: dict[str, Any] = {
        "fault_tolerance.semi_sync_method": SEMI_SYNC_METHOD[algorithm],
        "fault_tolerance.sync_steps": ft["sync_every"],
    }
    if algorithm != "localsgd":
        out.update(
            {
                "fault_tolerance.num_fragments": ft["fragments"],
                "fault_tolerance.fragment_sync_delay": ft["fragment_sync_delay"],
                "fault_tolerance.fragment_update_alpha": ft["fragment_update_alpha"],
                "fault_tolerance.should_quantize": ft["quantize"],
            }
        )
    return out


# -- the job -----------------------------------------------------------------
def run(ctx: JobContext) -> None:
    """The submitit job of one replica group: start the ranks, forward a stop to them, wait, report failure."""
    spec = ctx.spec
    nproc = int(spec.get("nproc_per_replica", 1))
    task, ntasks = int(os.environ.get("SLURM_PROCID", "0")), int(os.environ.get("SLURM_NTASKS", "1"))
    host, t0 = ctx.listen_host(), time.time()
    writer = titan_spare.job_writer(ctx, task)
    start = dict(trainer="titan", task=task, tasks=ntasks, world_size=nproc * ntasks, address=host, **placement())
    role = "task" if task else "replica" if ctx.spare_id is None else "spare"
    writer.emit("start", **start, role=role)
    ranks = ProcessGroup()
    stop = _StopForwarder(ranks.popens)
    restore = on_stop_signals(stop.handle)
    try:
        if ctx.spare_id is not None:
            writer = titan_spare.wait_as_spare(ctx, writer, task, lambda: stop.signum is not None, start, t0)
            if writer is None:
                return
        _run_ranks(ctx, nproc, writer, ranks, stop, host, task, ntasks)
    except Exception as e:
        error_exit(writer, e, step=None)
        raise
    finally:
        restore()
        ranks.close()
        writer.close()


def rendezvous_file(ctx: JobContext) -> Path:
    return Path(ctx.run_dir) / "rendezvous" / f"{ctx.writer_name}.json"


def _rendezvous(ctx: JobContext, host: str, task: int, timeout_s: float = 120.0) -> tuple[Optional[object], str, int]:
    """Task 0: host the group's store on ``host`` and publish it. Others: wait for it. -> (store, addr, port)."""
    path = rendezvous_file(ctx)
    if task == 0:
        store = loopback.loopback_store()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"addr": host, "port": store.port}))
        tmp.replace(path)
        return store, host, store.port
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"titan replica {ctx.replica}: task 0's rendezvous {path} not there in {timeout_s}s")
        time.sleep(0.1)
    found = json.loads(path.read_text())
    return None, found["addr"], int(found["port"])


def rank_stderr(ctx: JobContext, rank: int) -> Path:
    """A rank's stderr, as the job copies it (it also goes to the job's own stderr)."""
    return Path(ctx.run_dir) / "titan" / f"{ctx.writer_name}.rank-{rank}.stderr"


def _run_ranks(
    ctx: JobContext, nproc: int, writer, ranks: ProcessGroup, stop: "_StopForwarder", host: str, task: int, ntasks: int
) -> None:
    """Start this task's ranks and wait for them all; if one ends unclean, ``exit`` says how each ended."""
    argv = job_flags(ctx, ensure_assets())
    if stop.signum is not None:
        writer.emit("exit", reason="preempted", step=None)
        return
    waiting = [forked.fork_waiting(forked_rank, argv) for _ in range(nproc)] if warm_ranks(argv) else []
    try:
        loopback.bind_to(host)
        store, master, port = _rendezvous(ctx, host, task)  # noqa: F841 (task 0 serves on it while the ranks run)
        env = rank_env(ctx, nproc, port, master=master, host=host, task=task, ntasks=ntasks)
    except BaseException:
        for child in waiting:
            child.abandon()
        raise
    for local in range(nproc):
        rank = task * nproc + local
        rank_vars = {**env, "RANK": str(rank), "LOCAL_RANK": str(local), "ROLE_RANK": str(rank)}
        if waiting:
            ranks.adopt(rank, waiting[local].release(rank_vars), stderr_path=rank_stderr(ctx, rank))
            continue
        ranks.start(
            rank,
            [sys.executable, "-m", RANK_MODULE, *argv],
            stderr_path=rank_stderr(ctx, rank),
            env=rank_vars,
            stdin=subprocess.DEVNULL,
            preexec_fn=functools.partial(_rank_preexec, os.getpid()),
        )
    rank_pids.record(ctx.run_dir, ctx.writer_name, task, ranks.ranks)
    if stop.signum is not None:
        stop.forward()  # it came while the ranks were being started
    failed = ranks.wait()
    if failed is not None:
        fields = ranks.exit_fields()
        end = next(p for p in fields["processes"] if p["rank"] == failed)
        how = f"exited with {end['exit_code']}" if "exit_code" in end else f"was killed by {end['signal']}"
        error = one_line(fields["exception"]) if "exception" in fields else f"rank {failed} {how}"
        writer.emit("exit", reason="error", step=None, error=error, **fields)
        raise mark_told(RuntimeError(f"titan replica {ctx.replica}: rank {failed} {how}"))


def warm_ranks(argv: list[str]) -> bool:
    """Fork the ranks from this process (:mod:`workbench.trainers.forked`) rather than exec them: where the fork
    server forked this job warm (torchtitan imported: ``rank.warm_up``), no thread or socket is open yet, and
    ``WORKBENCH_TITAN_WARM_RANKS`` is not ``0``; then the config is parsed here, once (``rank.parse_ahead``).
    Else (Slurm, an accelerator) each rank is a fresh interpreter."""
    if os.environ.get("WORKBENCH_TITAN_WARM_RANKS", "1") == "0" or "torchtitan.train" not in sys.modules:
        return False
    parse_ahead(argv)
    why = forked.fork_safety()
    if why is not None:
        print(f"titan: ranks exec'd, not forked: this job is not fork-safe ({why})", file=sys.stderr, flush=True)
    return why is None


def rank_env(
    ctx: JobContext,
    nproc: int,
    store_port: int,
    master: str = "127.0.0.1",
    host: str = "127.0.0.1",
    task: int = 0,
    ntasks: int = 1,
) -> dict[str, str]:
    """The environment every rank of the group's task shares (``RANK`` and friends are added per rank)."""
    import torch  # late: after the job's ``start`` event (importing torch takes 1.5 s)

    spec = ctx.spec
    env = {
        **os.environ,
        **OFFLINE_ENV,
        "MASTER_ADDR": master,
        "MASTER_PORT": str(store_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "WORLD_SIZE": str(nproc * ntasks),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(task),
        "WORKBENCH_BIND_HOST": host,
        "GLOO_SOCKET_IFNAME": loopback.interface_of(host),
        "WORKBENCH_RUN_DIR": ctx.run_dir,
        "WORKBENCH_RUN_ID": ctx.run_id,
        "WORKBENCH_REPLICA": str(ctx.replica),
        "WORKBENCH_ATTEMPT": str(ctx.attempt),
        "WORKBENCH_HEARTBEAT_S": str(spec.get("heartbeat_s", 1.0)),
        "WORKBENCH_CHECKSUM_EVERY": str(spec.get("checksum_every", 10)),
        "TORCHFT_TIMEOUT_SEC": str(max(1, round(spec["torchft"]["timeout_s"]))),
        "TORCHFT_QUORUM_TIMEOUT_SEC": str(max(1, round(spec["torchft"]["quorum_timeout_s"]))),
        "TORCHFT_QUORUM_RETRIES": str(spec["torchft"]["quorum_retries"]),
        "PYTHONPATH": str(CHECKOUT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    if ctx.lighthouse_addr:
        env["TORCHFT_LIGHTHOUSE"] = ctx.lighthouse_addr
    env.setdefault("NCCL_SOCKET_IFNAME", env["GLOO_SOCKET_IFNAME"])
    if not torch.accelerator.is_available():
        env["OMP_NUM_THREADS"] = str((spec.get("titan") or {}).get("threads", 1))
    return env


def _rank_preexec(parent_pid: int) -> None:
    hold_stop_signals()
    die_with_parent(parent_pid)


class _StopForwarder:
    """Records the first stop signal the job gets and sends it on to every rank started so far.

    It runs as a signal handler on the job's main thread: it only records and
    calls ``kill(2)``; the events are written by the ranks.
    """

    def __init__(self, ranks: list[subprocess.Popen]) -> None:
        self.ranks = ranks
        self.signum: Optional[int] = None

    def handle(self, signum: int) -> None:
        self.signum = self.signum or signum
        self.forward()

    def forward(self) -> None:
        for p in list(self.ranks):
            if p.returncode is None:
                signal_pid(p.pid, self.signum)
