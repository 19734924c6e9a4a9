"""The sections of an experiment spec: one pydantic model each, with the rules inside a section.

Every section forbids unknown keys (``extra="forbid"``) and re-validates on
assignment. A rule that needs two sections (a fault against the trainer, the
algorithm against the backend) is the whole spec's, in :mod:`.models`.
"""

from __future__ import annotations

from typing import Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workbench.faults import kinds as faultkinds
from workbench.spec import forms


class Section(BaseModel):
    """A part of the spec: unknown keys refused, every assignment validated, no infinite or NaN number
    (JSON has neither: ``run.json`` would hold ``Infinity``, and an infinite ``chaos.start_s`` draws faults
    that never fire)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LighthouseSpec(Section):
    """torchft's lighthouse: decides quorums from heartbeats.

    ``heartbeat_timeout_ms`` is how long a dead replica group holds survivors
    up: their next quorum forms once its heartbeats are that old (torchft's
    default is 5000 ms). 300 ms, chosen from a measurement (``bench/stall.py``,
    docs/benchmarks.md): the demo under a SIGKILL of group 1 or 2 every ~20 s
    with a second demo run training beside it (load median 8.5-9.2 on 2 cores),
    3 minutes and 9 kills per value. Survivor stall median 0.32 / 0.43 / 0.65 /
    1.25 s, p95 0.63 / 0.95 / 1.21 / 2.22 s at 200 / 300 / 500 / 1000 ms, and no
    live group evicted at any of them (``analysis.evictions``), in the chaos
    run or in the fault-free run beside it. 300 and not 200: 200 ms is the
    least the timeout rules allow (two heartbeats of
    ``torchft.heartbeat_interval_ms``, 100 ms), so one heartbeat late by a
    tenth of a second evicts a live group; 300 ms leaves a heartbeat of margin
    and still keeps the median stall under 0.5 s on a loaded machine. Then 30
    minutes at 300 ms, a kill every ~30 s, the same load beside (median 8.5):
    54 kills, stall median 0.38 s, p95 0.51 s, max 0.65 s, no live group
    evicted (``python -m bench --only stall``). The
    heartbeats come from torchft's Manager server, a task on its tokio thread
    (Rust, no GIL), so a group busy in a long step keeps heartbeating: what a
    short timeout risks is a machine that does not schedule that thread for
    the timeout. The process-group timeout followed it then (300 ms): the
    fault-free runs beside the chaos voted down 6 of 13,275 steps at 300 ms
    in the sweep (none at the other values) and 15 of 137,667 in the 30
    minutes, about one in 9,000. It no longer does (2 s unset, ``TorchftSpec``): 30 minutes
    of the same chaos (load median 8.1), 54 kills, stall median 0.37 s, p95 0.43 s, max
    0.45 s, no live group evicted, none of 179,775 steps beside voted down. The run controller
    restarts a lighthouse that died, on the same address, after
    ``restart_delay_s`` (non-zero to study an outage). On a backend whose runs
    listen on loopback only (``local``), ``bind_host`` must be a loopback
    address unless ``allow_non_loopback`` says otherwise: the lighthouse
    would take quorum requests from the network. ``bind_host`` is an IP
    address or a host name: it is the lighthouse's ``--bind host:port`` and
    the URL every group dials.
    """

    heartbeat_timeout_ms: int = Field(300, ge=50, le=600_000)
    join_timeout_ms: int = Field(1000, ge=0, le=3_600_000)
    quorum_tick_ms: int = Field(100, ge=10, le=10_000)
    bind_host: str = "127.0.0.1"
    port: Optional[int] = Field(None, ge=1, le=65535)
    restart_delay_s: float = Field(0.0, ge=0, le=3600)
    allow_non_loopback: bool = False

    @field_validator("bind_host")
    @classmethod
    def _host(cls, v: str) -> str:
        return forms.host(v)


class TorchftSpec(Section):
    """Timeouts of each replica group's torchft Manager and process group.

    ``pg_timeout_ms`` is how long a group waits in a collective for its slowest
    peer before it gives the step up (voted down, every group's work lost).
    It does not bound the stall of a kill: a killed peer's sockets reset at
    once for its ring neighbours, and with ``drop_failed_pg`` they fail the
    collective for the rest (without it, a survivor waiting on a peer that
    itself failed waits the whole timeout: measured 2.0 s with a 2 s timeout).
    It bounds the stall of a peer that stops without closing its sockets
    (``hang``, ``freeze``, a partition), and it is the most a live peer may lag:
    a pause shorter than it is waited out (the group stays in the quorum; its
    peers lose the pause, no step).
    Unset: 2000 ms, or the lighthouse heartbeat timeout where that is longer,
    for both trainers (TorchTitan's ``fault_tolerance.process_group_timeout_ms``);
    why, measured: ``trainers/torchft/pg_timeout.py``.

    ``drop_failed_pg`` (torchft-lite): a group whose collective failed destroys
    its process group at once, which fails the collective for the groups still
    waiting in it, instead of keeping it until the next quorum
    (``trainers/collective_failure.py``). False: torchft as it is.

    ``pg_timeout_only`` (torchft-lite): a collective's one timeout is its process group's.
    torchft's Manager also arms a timer of ``timeout_s`` on every collective's future, on a
    thread it wakes twice a step; where that timer is the longer one it cannot fire first, and
    it is skipped (``trainers/collective_failure.py``). False: torchft's timer on every future.

    ``tokio_worker_threads`` (torchft-lite): worker threads of each tokio runtime torchft's
    Manager starts in a group (its manager server and its client), through tokio's own
    ``TOKIO_WORKER_THREADS``. Tokio's default is one per core: on this 2-core machine that is
    4 threads per group, woken by every quorum and commit vote, for a group of one rank whose
    requests come one at a time. 1 measured faster in every pair (3 groups, fault-free,
    20 s windows, load 1.3-3.1): samples/s +15, +10 and +5 %, CPU per group-step -15, -10
    and -4 %; against plain DDP 4.0 % fewer samples/s (median) instead of 9.7 %. None: tokio's default.

    ``local_commit_vote`` (torchft-lite): the group has one rank, so torchft's commit vote,
    a gRPC round trip to the group's own ManagerServer, is answered in process with the
    same result (``trainers/commit_vote.py``). False: torchft's round trip.

    ``lean_ddp_hook`` (torchft-lite): torchft's DDP gradient hook waits for the all-reduce
    inside the hook; the workbench's does the same with the same outcomes, without the lazy
    future chain torchft builds and runs on the finished result (``trainers/ddp_hook.py``).
    False: torchft's hook.

    ``snapshot_every`` (torchft-lite): every N committed steps (a semi-synchronous algorithm: at the first
    committed sync from there) each group writes its whole torchft state, what a heal would send, to
    ``snapshots/replica-<r>.pt`` (atomically, one writer per file). A group that starts loads the newest one
    before its first quorum: a live peer ahead of it heals it as usual; with none left (every group died at
    once) the run resumes from it (``controller/total_loss.py``). 0: off, the state lives in memory only.

    ``rust_log``: the level of torchft's Rust logging (its ``RUST_LOG``, read once when
    ``torchft`` is imported) in the run's lighthouse and in every process of every group.
    At torchft's default, ``info``, each quorum is four lines on a group's stderr, one of
    them the whole quorum (1.6 KB a step per group, measured), and seven in the lighthouse's
    log (2.4 MB in 20 s with 3 groups), formatted and written on the tokio threads that carry
    the quorum. Measured, 3 groups: the lighthouse's CPU per group-step 0.14 ms at ``warn``
    against 0.23-0.26 ms at ``info``, the groups' manager runtimes 0.24 against 0.30-0.34 ms.
    ``warn`` keeps torchft's warnings and errors; what the info lines said is in the event log
    (``quorum``, ``commit``, ``heal`` events, with ``structured_logs``).
    """

    pg_timeout_ms: Optional[int] = Field(None, ge=100, le=3_600_000)
    timeout_s: float = Field(30.0, gt=0, le=3600)
    quorum_timeout_s: float = Field(60.0, gt=0, le=36_000)
    quorum_retries: int = Field(20, ge=0, le=1000)
    heartbeat_interval_ms: int = Field(100, ge=10, le=10_000)
    tokio_worker_threads: Optional[int] = Field(1, ge=1, le=1024)
    local_commit_vote: bool = True  # torchft-lite: the one-rank group's vote in process (trainers/commit_vote.py)
    lean_ddp_hook: bool = True  # torchft-lite: the gradient hook without torchft's future chain (trainers/ddp_hook.py)
    drop_failed_pg: bool = True  # torchft-lite: destroy a failed process group at once (trainers/collective_failure.py)
    pg_timeout_only: bool = True  # torchft-lite: no Manager timer on a collective the process group times out first
    use_async_quorum: bool = True
    rust_log: Literal["error", "warn", "info", "debug", "trace"] = "warn"
    snapshot_every: int = Field(0, ge=0, le=10_000_000)
    structured_logs: bool = True  # torchft-lite: torchft's quorum/commit/error records into the event log
    step_timing: bool = False  # torchft-lite: per-phase seconds (t_<phase>_s) in each step event (bench/stepcost.py)
    # torchft-lite heal: "pg" = torchft's PGTransport over the group's gloo process group, received in place
    # into the model and AdamW state; "http" = torchft's HTTPTransport (``http_chunks`` > 0: chunked, in parallel).
    # bench/heal.py measures both.
    checkpoint_transport: Literal["pg", "http"] = "pg"
    http_chunks: int = Field(0, ge=0, le=64)


Algorithm = Literal["ddp", "localsgd", "diloco", "streaming_diloco"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
DILOCO_FAMILY = ("diloco", "streaming_diloco")


class FtSpec(Section):
    """How replica groups synchronise: torchft's per-step DDP or one of its semi-synchronous algorithms.

    ``ddp``: gradients all-reduced every step (torchft ``DistributedDataParallel``).
    ``localsgd``: torchft ``LocalSGD``, parameters averaged every ``sync_every`` inner steps.
    ``diloco``: torchft ``DiLoCo``, pseudo-gradients averaged every ``sync_every`` inner
    steps and applied by an outer SGD (``outer_lr``, ``outer_momentum``, ``outer_nesterov``).
    ``streaming_diloco``: ``DiLoCo`` over ``fragments`` model fragments, one synced every
    ``sync_every / fragments`` inner steps, its all-reduce overlapping ``fragment_sync_delay``
    inner steps, the result mixed into the local weights by ``fragment_update_alpha``.
    ``quantize``: torchft's quantized all-reduce of the pseudo-gradients (Triton on CUDA only;
    torchft falls back to a plain all-reduce silently elsewhere, so the spec refuses it there).
    ``catch_up`` (torchft-lite): a group whose inner step stalled for longer than the lighthouse's
    ``heartbeat_timeout_ms`` (it was frozen) ends its window at its next inner step instead of
    finishing it (see ``trainers/semi_sync.py``, "Catching up"). Off by default: the algorithms
    run as torchft implements them, with a fixed ``sync_every``.
    ``bucket_cap_mb`` (torchft-lite, diloco family): torchft's bucketized all-reduce of the
    pseudo-gradients (``use_bucketization``: this torchft only reads ``bucket_cap_mb`` with it),
    packed into flat buffers of at most this many MB, instead of one all-reduce per parameter
    tensor (torchft's default, kept when unset). Each all-reduce is a ring through every group,
    so its latency grows with the groups, not the bytes: plain gloo here, 16 processes, the
    classroom model's 0.5 MB as 30 tensors 1.31 s, as one 0.07 s; in the classroom's syncs,
    last group in to first group out 1.0-1.27 s per tensor against 0.08-0.12 s bucketized.

    A semi-synchronous run's groups meet only at syncs: the lighthouse's
    ``join_timeout_ms`` is how long a group at a sync waits for a peer that is
    alive but not there yet (a replacement, a straggler). Unless set, it is
    raised to 30 s for these algorithms (torchft's own default is 60 s): with
    1 s a replacement asking to join between syncs would form a quorum alone
    and never meet its peers.
    """

    algorithm: Algorithm = "ddp"
    sync_every: int = Field(10, ge=1, le=1_000_000)
    fragments: int = Field(1, ge=1, le=1024)
    fragment_sync_delay: int = Field(0, ge=0, le=1_000_000)
    fragment_update_alpha: float = Field(0.0, ge=0.0, le=1.0)
    outer_lr: float = Field(0.7, gt=0, le=100)
    outer_momentum: float = Field(0.9, ge=0, lt=1)
    outer_nesterov: bool = True
    quantize: bool = False
    catch_up: bool = False
    bucket_cap_mb: Optional[float] = Field(None, gt=0, le=65536)

    @model_validator(mode="after")
    def _rules(self) -> "FtSpec":
        """Value-based (a resolved spec, every field written out, validates the same)."""
        algo = self.algorithm
        changed = [k for k, f in FtSpec.model_fields.items() if k != "algorithm" and getattr(self, k) != f.default]
        if algo == "ddp":
            if changed:
                raise ValueError(
                    f"{changed[0]}: only for a semi-synchronous ft.algorithm "
                    f"({', '.join(ALGORITHMS[1:])}); ddp syncs every step"
                )
            return self
        if algo != "streaming_diloco" and self.fragments != 1:
            raise ValueError(
                f"fragments ({self.fragments}): only for ft.algorithm streaming_diloco "
                f"(got {algo}, which syncs the whole model)"
            )
        if algo == "streaming_diloco":
            if self.fragments < 2:
                raise ValueError(
                    f"fragments ({self.fragments}): streaming_diloco needs at least 2 fragments "
                    "(1 fragment is ft.algorithm diloco)"
                )
            if self.sync_every % self.fragments:
                raise ValueError(
                    f"sync_every ({self.sync_every}) must be a multiple of ft.fragments "
                    f"({self.fragments}): one fragment syncs every sync_every / fragments steps"
                )
        if algo == "localsgd":
            for key in changed:
                if key not in ("sync_every", "catch_up"):
                    raise ValueError(
                        f"{key}: only for ft.algorithm {' or '.join(DILOCO_FAMILY)}; torchft's "
                        "LocalSGD averages the parameters (no outer optimizer, fragments, quantization "
                        "or bucketization)"
                    )
        elif self.fragment_sync_delay >= self.sync_every // self.fragments:
            raise ValueError(
                f"fragment_sync_delay ({self.fragment_sync_delay}) must be < sync_every / fragments "
                f"({self.sync_every // self.fragments}): a fragment must be synced before it is "
                "reduced again"
            )
        return self


class ModelSpec(Section):
    """The torchft-lite decoder language model and its synthetic data."""

    vocab_size: int = Field(256, ge=8, le=1_000_000)
    dim: int = Field(64, ge=8, le=16384)
    layers: int = Field(2, ge=1, le=256)
    heads: int = Field(4, ge=1, le=256)
    seq_len: int = Field(32, ge=4, le=65536)
    batch_size: int = Field(8, ge=1, le=65536)
    lr: float = Field(3e-3, gt=0, le=10)
    step_delay_s: float = Field(0.0, ge=0, le=60)

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> "ModelSpec":
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of heads ({self.heads})")
        return self


class FaultSpec(Section):
    """One scheduled fault: at a committed step, or ``at_s`` seconds after the first committed step."""

    action: str = "kill"
    target: Optional[int] = Field(None, ge=0)
    at_step: Optional[int] = Field(None, ge=0)
    at_s: Optional[float] = Field(None, ge=0)
    seconds: float = Field(5.0, gt=0, le=3600)

    @field_validator("action")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _fault_kind(v)

    @model_validator(mode="after")
    def _when(self) -> "FaultSpec":
        if (self.at_step is None) == (self.at_s is None):
            raise ValueError("give exactly one of at_step or at_s")
        return self


def _fault_kind(name: str) -> str:
    if name not in faultkinds.KINDS:
        raise ValueError(f"got {name!r}; allowed: {', '.join(faultkinds.names())}")
    return name


class ChaosSpec(Section):
    """Random faults with exponential inter-arrival times (a Poisson process of rate 1/mtbf_s).

    Drawn once, at submit, from ``seed``: the drawn list is written into the
    resolved spec's ``faults`` so the run records, and a replay repeats,
    exactly the faults that were injected.
    """

    mtbf_s: float = Field(..., gt=0, le=10_000_000)
    seed: int = Field(0, ge=0, le=forms.SEED_MAX)
    actions: list[str] = Field(default_factory=lambda: ["kill"], min_length=1)
    targets: Optional[list[int]] = None
    start_s: float = Field(5.0, ge=0)
    max_faults: int = Field(10, ge=1, le=100_000)
    hang_seconds: float = Field(3.0, gt=0, le=3600)

    @field_validator("actions")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        return [_fault_kind(a) for a in v]


class HangSpec(Section):
    """Hang detection: a replica group that made no step progress for ``timeout_s``.

    ``timeout_s: null`` derives it from the run: 20 × the median step interval,
    at least ``min_timeout_s``. ``action: kill`` kills and relaunches it.
    """

    timeout_s: Optional[float] = Field(None, gt=0, le=86_400)
    min_timeout_s: float = Field(3.0, gt=0, le=86_400)
    action: Literal["none", "kill"] = "none"


class SlurmSpec(Section):
    """Where and how Slurm runs the jobs (``cluster: slurm``); see docs/slurm.md.

    ``conf`` is the ``slurm.conf`` clients use: empty means ``$SLURM_CONF``, else
    the local dev cluster when it is up, else the machine's default; submit
    pins the choice here. Jobs are ``--no-requeue``: the controller resubmits an
    ended job as the next attempt. ``requeue: true`` (checkpoint-restart
    trainers only) lets Slurm requeue it instead, as the same attempt.
    ``sbatch_args`` are extra ``#SBATCH`` options (``{constraint: h100}``).
    Every value here is a line or an argument of the sbatch script submitit
    writes, so each is checked for form where it is declared (:mod:`.forms`):
    Slurm names for ``partition``, ``account`` and ``qos``, one line for the
    rest, counts Slurm stores.
    """

    conf: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = Field(60, ge=1, le=525_600)  # a year
    nodes: int = Field(1, ge=1, le=100_000)
    tasks_per_node: int = Field(1, ge=1, le=4096)
    gpus_per_node: int = Field(0, ge=0, le=1024)
    cpus_per_task: int = Field(1, ge=1, le=4096)
    requeue: bool = False
    srun_args: list[str] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list)
    sbatch_args: dict[str, str] = Field(default_factory=dict)

    @field_validator("conf")
    @classmethod
    def _conf(cls, v: Optional[str]) -> Optional[str]:
        """A path, given to every Slurm client as ``SLURM_CONF``."""
        return v if v is None else forms.one_line("", v)

    @field_validator("partition", "account", "qos")
    @classmethod
    def _names(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        """Each is an ``#SBATCH --<field>=value`` line and an argument of ``sbatch --test-only``."""
        return forms.slurm_name(v, str(info.field_name), several=info.field_name == "partition")

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, v: dict[str, str]) -> dict[str, str]:
        """submitit writes each as ``#SBATCH --key=value``: a newline would be a shell line."""
        forms.sbatch_args(v)
        return v

    @field_validator("srun_args", "setup")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        for i, value in enumerate(v):
            forms.one_line(f"[{i}]", value)
        return v


class CheckpointSpec(Section):
    """When the ``ddp-restart`` baseline writes its checkpoint: every ``every_steps`` committed
    steps, or every ``every_s`` seconds of training, whichever comes first (unset: never).
    ``keep`` durable checkpoints are kept; older ones are deleted."""

    every_steps: Optional[int] = Field(None, ge=1)
    every_s: Optional[float] = Field(None, gt=0)
    keep: int = Field(2, ge=1, le=1000)
