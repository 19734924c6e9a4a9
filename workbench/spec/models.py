"""The experiment spec: what to run, validated before anything starts.

:class:`Spec` is the whole experiment: the common fields and one section each
(:mod:`.sections`), pydantic with ``extra="forbid"`` everywhere. Its validator
applies the rules between sections, every choice read from its table instead
of comparing names: trainers and what each implements from
``trainers.registry``, backends and what each guarantees from
``cluster.backends``, fault kinds from ``faults.kinds``. ``spec.load`` builds a
Spec from a YAML file plus overrides and turns every validation failure into
one :class:`SpecError` whose message names each bad field and what it allows.
Values that leave Python as text (seeds, flags, script lines, file names) are
checked for range and form where they are declared (:mod:`.forms`);
``spec.preflight`` holds the checks that need the world (a writable run root).

The backends' table (``cluster.backends``) is read at import: its package
imports submitit (55 ms, 84 modules, measured), which validating any spec did
anyway. ``torch`` (1.5 s, 970 modules) is imported only by the check that
``ft.quantize`` can run on this machine, where a spec asks for it.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from workbench.cluster.backends import backend_class, backend_names
from workbench.faults import kinds as faultkinds
from workbench.spec import forms
from workbench.spec.sections import (
    DILOCO_FAMILY,
    ChaosSpec,
    CheckpointSpec,
    FaultSpec,
    FtSpec,
    HangSpec,
    LighthouseSpec,
    ModelSpec,
    Section,
    SlurmSpec,
    TorchftSpec,
)
from workbench.trainers.registry import trainer_kind, trainer_names
from workbench.trainers.torchft import pg_timeout

TRAINERS = trainer_names()
if TYPE_CHECKING:
    TrainerName = str  # the names come from the registry at run time: a type checker sees a str
else:
    TrainerName = Literal[TRAINERS]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Spec(Section):
    """One experiment. ``workbench.load_spec`` builds it; ``to_dict`` round-trips."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    trainer: TrainerName = "torchft-lite"
    cluster: str = "local"
    replicas: int = Field(3, ge=1, le=1024)
    min_replicas: int = Field(1, ge=1, le=1024)
    nproc_per_replica: int = Field(1, ge=1, le=64)
    steps: int = Field(200, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0, le=forms.SEED_MAX)
    run_root: str = Field(default_factory=lambda: os.environ.get("WORKBENCH_RUN_ROOT", "runs"))
    relaunch: Literal["auto", "off"] = "auto"
    relaunch_delay_s: float = Field(0.0, ge=0, le=3600)
    max_restarts: int = Field(20, ge=0, le=10_000)
    # Every group of an elastic run died at once and no durable state exists (controller/total_loss.py): fail
    # the run (the default: the model it was asked to train is gone), or go on from scratch and say so.
    on_state_loss: Literal["fail", "restart"] = "fail"
    spares: int = Field(0, ge=0, le=64)
    heartbeat_s: float = Field(1.0, gt=0, le=600)
    # How long a run goes on while its run root takes no write (workbench/controller/unwritable.py says why 60 s).
    unwritable_timeout_s: float = Field(60.0, gt=0, le=86_400)
    checksum_every: int = Field(10, ge=1, le=10_000_000)
    write_events: bool = True
    lighthouse: LighthouseSpec = Field(default_factory=LighthouseSpec)
    torchft: TorchftSpec = Field(default_factory=TorchftSpec)
    ft: FtSpec = Field(default_factory=FtSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    chaos: Optional[ChaosSpec] = None
    hang: HangSpec = Field(default_factory=HangSpec)
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    titan: dict[str, Any] = Field(default_factory=dict)
    maxtext: dict[str, Any] = Field(default_factory=dict)

    @field_validator("run_root")
    @classmethod
    def _run_root(cls, v: str) -> str:
        return forms.run_root(v)

    @field_validator("titan")
    @classmethod
    def _titan(cls, v: dict[str, Any]) -> dict[str, Any]:
        return forms.titan_section(v)

    @field_validator("maxtext")
    @classmethod
    def _maxtext(cls, v: dict[str, Any]) -> dict[str, Any]:
        return forms.maxtext_section(v)

    @field_validator("cluster")
    @classmethod
    def _backend(cls, v: str) -> str:
        if v not in backend_names():
            raise ValueError(f"got {v!r}; allowed: {', '.join(backend_names())}")
        return v

    @model_validator(mode="after")
    def _cross_field(self) -> "Spec":
        """The rules between sections, in this order (the first broken one is the message)."""
        if self.min_replicas > self.replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be <= replicas ({self.replicas})")
        self._check_faults()
        lh = self.lighthouse
        if backend_class(self.cluster).loopback_only and not lh.allow_non_loopback and not is_loopback(lh.bind_host):
            raise ValueError(
                f"lighthouse.bind_host: {lh.bind_host!r} is not a loopback address; a {self.cluster} "
                "run listens on 127.0.0.1 only (set lighthouse.allow_non_loopback: true to serve "
                "quorums to the network)"
            )
        if self.spares and not trainer_kind(self.trainer).supports_spares:
            with_spares = ", ".join(n for n in TRAINERS if trainer_kind(n).supports_spares)
            raise ValueError(f"spares ({self.spares}): hot spares are implemented for trainer {with_spares} only")
        self._check_algorithm()
        self._check_unread()
        if self.torchft.snapshot_every and self.trainer != "torchft-lite":
            raise ValueError(
                f"torchft.snapshot_every ({self.torchft.snapshot_every}) is for trainer torchft-lite; "
                f"trainer {self.trainer} keeps its own checkpoints"
            )
        if self.chaos and self.chaos.targets:
            bad = [t for t in self.chaos.targets if not 0 <= t < self.replicas]
            if bad:
                raise ValueError(f"chaos.targets {bad}: each must be in 0..{self.replicas - 1}")
        # The trainer's own section against a job of one process (MaxText: the keys the wrapper owns); the
        # Slurm validation checks it again against the job's real process count.
        trainer_kind(self.trainer).check_job(self, 1)
        return self

    def _check_faults(self) -> None:
        """Each scheduled fault and chaos action is a kind the backend injects and the trainer has a target for."""
        here = faultkinds.names(self.cluster)
        applies = faultkinds.names_for(trainer_kind(self.trainer), self.cluster)
        for i, f in enumerate(self.faults):
            if f.action not in here:
                k = faultkinds.kind(f.action)
                why = f"needs {k.needs}" if k is not None and k.needs else "is not a fault"
                raise ValueError(
                    f"faults[{i}].action: {f.action} {why} on cluster {self.cluster}; allowed: {', '.join(here)}"
                )
            if f.action not in applies:
                raise ValueError(
                    f"faults[{i}].action: {f.action} does not apply to trainer {self.trainer}; "
                    f"allowed: {', '.join(applies)}"
                )
            if f.target is not None and f.target >= self.replicas and faultkinds.KINDS[f.action].targets == "replica":
                raise ValueError(f"faults[{i}].target ({f.target}) must be < replicas ({self.replicas})")
        for a in self.chaos.actions if self.chaos else ():
            if a not in applies:
                raise ValueError(
                    f"chaos.actions: {a} is not a fault on cluster {self.cluster} for trainer "
                    f"{self.trainer}; allowed: {', '.join(applies)}"
                )

    def _check_algorithm(self) -> None:
        """``ft`` against what the trainer implements (its :class:`~workbench.trainers.registry.TrainerKind`).

        A semi-synchronous run also gets its torchft and lighthouse defaults
        changed where the user left them unset: DiLoCo's synchronous quorum,
        and a 30 s ``join_timeout_ms`` (see :class:`~workbench.spec.sections.FtSpec`).
        """
        ft, kind = self.ft, trainer_kind(self.trainer)
        if ft.algorithm not in kind.algorithms:
            with_it = ", ".join(n for n in TRAINERS if ft.algorithm in trainer_kind(n).algorithms)
            raise ValueError(
                f"ft.algorithm: {ft.algorithm} is not implemented by trainer {self.trainer} "
                f"(allowed: {', '.join(kind.algorithms)}); {ft.algorithm} runs on {with_it}"
            )
        if ft.algorithm == "ddp":
            return
        if ft.algorithm in DILOCO_FAMILY and self.torchft.use_async_quorum:
            if "use_async_quorum" in self.torchft.model_fields_set:
                raise ValueError(
                    f"torchft.use_async_quorum: true; ft.algorithm {ft.algorithm} needs false "
                    "(torchft's DiLoCo heals in a synchronous quorum at each sync)"
                )
            self.torchft.use_async_quorum = False
        if ft.quantize:
            self._check_quantize()
        for key, value in kind.outer_optimizer.items():
            if getattr(ft, key) != value:
                raise ValueError(
                    f"ft.{key} ({getattr(ft, key)}): trainer {self.trainer} cannot set it; {kind.upstream} "
                    f"builds DiLoCo's outer optimizer with {key.removeprefix('outer_')}={value}"
                )
        for key, why in kind.ft_unsupported.items():
            value = getattr(ft, key)
            if value != FtSpec.model_fields[key].default:
                with_it = ", ".join(
                    n
                    for n in TRAINERS
                    if ft.algorithm in trainer_kind(n).algorithms and key not in trainer_kind(n).ft_unsupported
                )
                shown = ": true" if value is True else f" ({value})"
                raise ValueError(f"ft.{key}{shown} is for trainer {with_it}; {why}")
        if kind.fragments_from_layers and ft.fragments > self.model.layers + 2:
            raise ValueError(
                f"ft.fragments ({ft.fragments}) must be <= model.layers + 2 ({self.model.layers + 2}): "
                "a fragment is the embeddings, one or more blocks, or the head"
            )
        if "join_timeout_ms" not in self.lighthouse.model_fields_set:
            self.lighthouse.join_timeout_ms = 30_000

    def _check_unread(self) -> None:
        """A setting the trainer does not read (its ``TrainerKind.unread``), set: refused, naming the field."""
        kind = trainer_kind(self.trainer)
        for where, why in kind.unread.items():
            section, _, prefix = where.partition(".overrides.")
            if prefix:
                keys = [k for k in (getattr(self, section).get("overrides") or {}) if k.startswith(prefix + ".")]
                if keys:
                    raise ValueError(f"{section}.overrides.{keys[0]}: trainer {self.trainer} cannot take it; {why}")
                continue
            model = getattr(self, where)
            for name, info in type(model).model_fields.items():
                if getattr(model, name) != info.get_default(call_default_factory=True):
                    raise ValueError(f"{where}.{name}: trainer {self.trainer} does not read it; {why}")

    def _check_quantize(self) -> None:
        """torchft quantizes with Triton on CUDA, and silently does not elsewhere: refuse it where the jobs
        have no GPU. Where they run elsewhere the backend names the spec key that gives them GPUs
        (``job_gpus_key``); where they run here, this machine must have CUDA and Triton."""
        key = backend_class(self.cluster).job_gpus_key
        if key is not None:
            section, _, field = key.partition(".")
            if getattr(getattr(self, section), field) < 1:
                raise ValueError(
                    "ft.quantize: true needs GPUs (torchft quantizes with Triton on CUDA); "
                    f"set {key} >= 1 or ft.quantize: false"
                )
            return
        import torch  # 1.5 s, and only this check needs it: see the module docstring

        if not (torch.cuda.is_available() and importlib.util.find_spec("triton")):
            raise ValueError(
                f"ft.quantize: true needs CUDA and Triton on this machine (cluster {self.cluster} "
                "runs here) and it has neither; allowed here: false"
            )

    @property
    def pg_timeout_ms(self) -> int:
        return pg_timeout.pg_timeout_ms(self.torchft.pg_timeout_ms, self.lighthouse.heartbeat_timeout_ms)

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")
