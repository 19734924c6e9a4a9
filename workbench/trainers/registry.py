"""The trainers the workbench can run, and what the rest of the package must know about each.

Every rule elsewhere that depends on which trainer a spec names (the spec's
choices and cross-checks, the controller's lighthouse, the Slurm checks, the
goodput accounting) reads it from a :class:`TrainerKind` here instead of
comparing names. This module imports no trainer and no torch: the spec
imports it.

Two recovery models:

- **elastic**: torchft replica groups under one lighthouse. A relaunched
  group heals from a live peer; the controller runs one job per group.
- **checkpoint-restart**: one job for the whole run. Any fault costs the job,
  which restarts from its last durable checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional


@dataclasses.dataclass(frozen=True)
class TrainerKind:
    """One trainer, described by data the rest of the package decides on.

    ``sections`` are the spec sections the trainer reads besides the common
    fields (steps, seed, replicas, heartbeat_s, ...). ``batch_from_model``:
    a ``step`` event stands for ``model.batch_size`` samples (the trainers
    whose batches come from the spec's ``model`` section); otherwise for one.
    ``writer_per_replica``: each of ``spec.replicas`` (replica groups, or the
    ranks of a one-job trainer) writes its own ``step`` events; otherwise the
    run has one step writer. ``slurm_tasks``: the number of Slurm tasks
    (nodes × tasks per node) a job of this trainer must have, None for any.
    ``checkpoint_period``: the dotted spec key of the trainer's checkpoint
    period in steps, for the preflight warning that no checkpoint is written.
    ``warm_up``: ``"module:function"`` the local fork server calls with the
    spec's ``model`` section before it forks the trainer's attempts, so that
    each fork inherits what the trainer's first step would otherwise pay for
    (torchft-lite: the first AdamW step's imports, 2.1 s measured).
    ``check_processes``: ``"module:function"`` that checks the trainer's own
    section against a job of N processes (``function(section, N)``, ValueError
    naming the key), called by the spec's validation (N = 1) and by the Slurm
    validation before submit (N = the job's tasks).

    Which process of a group the single-point fault kinds hit (``faultkinds``:
    a kind's ``process`` names one of these fields; None: the trainer has no
    such process and the kind does not apply): ``store_host`` hosts the
    group's rendezvous TCPStore, ``rank0`` is its rank 0, ``checkpoint_writer``
    writes its checkpoints and emits ``checkpoint`` with ``state="started"``
    before each write (``held=True`` when it holds the save for an armed fault),
    ``collective_rank`` joins the group's all-reduces and, for an armed
    ``kill_in_allreduce``, holds before its next one (``held`` event). ``"group"``: the group's own recorded process;
    ``"replica0"``: the process recorded as replica 0 (the rank 0 of a one-job
    trainer); ``"child_rank0"``: the group's child its job recorded as rank 0 (``run/rank_pids.py``).

    ``algorithms``: the spec's ``ft.algorithm`` values the trainer implements
    (``ddp``: per-step all-reduce; the semi-synchronous ones: torchft's
    ``LocalSGD``/``DiLoCo``, see :mod:`.semi_sync`).

    What a semi-synchronous run of the trainer can be asked (the spec's ``ft``
    section, checked in ``spec.models``): ``outer_optimizer`` holds DiLoCo's
    outer optimizer settings (``ft.outer_*``) where the trainer's loop builds
    that optimizer itself, the only values the spec may give (empty: it takes
    the spec's); ``upstream`` names the project whose training loop the trainer
    drives, in messages (empty: the workbench's own loop). ``ft_unsupported`` maps
    an ``ft`` option the trainer does not implement to why not; the spec
    refuses it set to anything but its default. ``fragments_from_layers``:
    streaming DiLoCo's fragments are the model's embeddings, blocks and head,
    so there are at most ``model.layers + 2``. ``says_waiting_at_sync``: in a
    semi-synchronous run its heartbeats say ``waiting`` while the group waits
    for its peers at a sync (``trainers/kit.py``), so the hang detector does
    not take a group waiting out a dead peer for hung (``workbench timeouts``
    needs no window beyond the process-group timeout for it).

    ``unread``: spec settings the trainer does not read, each with why; the
    spec refuses one set to anything but its default (a section name: any of
    its fields; ``titan.overrides.<prefix>``: any override key under that
    prefix, whatever its value), so a setting cannot look applied when it is not.
    """

    name: str
    module: str
    elastic: bool
    sections: tuple[str, ...]
    supports_spares: bool = False
    batch_from_model: bool = False
    writer_per_replica: bool = True
    slurm_tasks: Optional[int] = None
    checkpoint_period: Optional[str] = None
    check_processes: Optional[str] = None
    warm_up: Optional[str] = None
    store_host: Optional[str] = None
    rank0: Optional[str] = None
    checkpoint_writer: Optional[str] = None
    collective_rank: Optional[str] = None
    algorithms: tuple[str, ...] = ("ddp",)
    upstream: str = ""
    outer_optimizer: Mapping[str, object] = dataclasses.field(default_factory=dict, hash=False)
    ft_unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    fragments_from_layers: bool = False
    says_waiting_at_sync: bool = False
    unread: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)

    def samples_per_step(self, spec) -> int:
        """Samples one writer's committed step trains on."""
        return spec.model.batch_size if self.batch_from_model else 1

    def check_job(self, spec, processes: int) -> None:
        """``check_processes`` on the spec's first section; ValueError naming the key."""
        if self.check_processes:
            import importlib

            module, _, function = self.check_processes.partition(":")
            getattr(importlib.import_module(module), function)(getattr(spec, self.sections[0]), processes)

    def step_writers(self, spec) -> int:
        """How many event streams report ``step`` events in a fault-free run."""
        return spec.replicas if self.writer_per_replica else 1


KINDS: tuple[TrainerKind, ...] = (
    TrainerKind(
        "torchft-lite",
        "workbench.trainers.lite.trainer",
        elastic=True,
        sections=("model", "torchft", "lighthouse"),
        supports_spares=True,
        batch_from_model=True,
        slurm_tasks=1,
        store_host="group",
        rank0="group",
        collective_rank="group",
        algorithms=("ddp", "localsgd", "diloco", "streaming_diloco"),
        fragments_from_layers=True,
        says_waiting_at_sync=True,
        warm_up="workbench.trainers.lite.model:warm_up_adamw",
    ),
    TrainerKind(
        "titan",
        "workbench.trainers.titan.job",
        elastic=True,
        sections=("titan", "torchft", "lighthouse"),
        checkpoint_period="titan.checkpoint_interval",
        warm_up="workbench.trainers.titan.rank:warm_up",
        supports_spares=True,
        store_host="group",
        rank0="child_rank0",
        algorithms=("ddp", "localsgd", "diloco", "streaming_diloco"),
        upstream="TorchTitan",
        # TorchTitan builds DiLoCo's outer optimizer itself: SGD(lr=0.7, momentum=0.9, nesterov=True).
        outer_optimizer={"outer_lr": 0.7, "outer_momentum": 0.9, "outer_nesterov": True},
        ft_unsupported={
            "catch_up": "TorchTitan's own semi-sync loop keeps a fixed sync_every",
            "bucket_cap_mb": "TorchTitan's fault_tolerance options do not pass DiLoCo's bucketization on",
        },
    ),
    TrainerKind(
        "maxtext",
        "workbench.trainers.maxtext.job",
        elastic=False,
        sections=("maxtext",),
        upstream="MaxText",
        writer_per_replica=False,
        checkpoint_period="maxtext.checkpoint_period",
        check_processes="workbench.trainers.maxtext.command:check_spec",
        supports_spares=True,
    ),
    TrainerKind(
        "ddp-restart",
        "workbench.trainers.ddp_restart",
        elastic=False,
        sections=("model", "checkpoint", "torchft"),
        batch_from_model=True,
        store_host="replica0",
        rank0="replica0",
        checkpoint_writer="replica0",
    ),
    TrainerKind(
        "titan-restart",
        "workbench.trainers.titan.restart",
        elastic=False,
        sections=("titan",),
        upstream="TorchTitan",
        slurm_tasks=1,
        checkpoint_period="titan.checkpoint_interval",
        # the ranks' TCPStore is the launcher's, a process the fold does not record: no store_host
        rank0="replica0",
        checkpoint_writer="replica0",
        unread={
            "torchft": "it runs TorchTitan with fault_tolerance.enable=false (no torchft Manager)",
            "titan.overrides.fault_tolerance": "it sets TorchTitan's fault_tolerance off (checkpoint-restart)",
        },
    ),
)
_BY_NAME = {k.name: k for k in KINDS}


class UnknownTrainer(KeyError):
    """A trainer name not in :data:`KINDS`; the message names the allowed ones."""

    def __str__(self) -> str:
        return str(self.args[0])


def trainer_names() -> tuple[str, ...]:
    """The names a spec's ``trainer`` may take, in the order the spec lists them."""
    return tuple(_BY_NAME)


def trainer_kind(name: str) -> TrainerKind:
    """The trainer called ``name``; KeyError naming the allowed names otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownTrainer(f"trainer: {name!r}; allowed: {', '.join(_BY_NAME)}") from None
