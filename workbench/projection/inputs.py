"""The projection's inputs: the job, its failure process, and each strategy's costs.

Defaults are published figures (``sources``, each cited) or named as
assumptions in the field's comment; units are in the field names (``_s``
seconds, ``_h`` hours, ``_gbps`` GB/s). :meth:`~workbench.projection.model.Projection.replace`
changes any of them by name (:func:`input_names`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from workbench.projection.closed_form import daly_period

GB = 1e9


@dataclass
class Job:
    """What is trained, on how much, for how long. Units in the field names' comments."""

    gpus: int = 1024
    groups: int = 8  # replica groups (elastic, DiLoCo); checkpoint-restart runs them as one job
    step_s: float = 10.0  # fault-free step time of the synchronous job, s
    params: float = 70e9  # model parameters
    state_bytes_per_param: float = 16.0  # bf16 weights + fp32 master + Adam moments (ZeRO, Rajbhandari et al. 2020)
    horizon_s: float = 30 * 86400.0  # wall window projected, s

    @property
    def state_bytes(self) -> float:
        return self.params * self.state_bytes_per_param

    @property
    def gpus_per_group(self) -> float:
        return self.gpus / self.groups


@dataclass
class Failures:
    """Per-device Poisson failures (``device_mtbf_h``), or a recorded ``trace`` of (t_s, group)."""

    device_mtbf_h: Optional[float] = None
    trace: Optional[Sequence[tuple[float, int]]] = None

    def job_mtbf_s(self, job: Job) -> float:
        if self.trace is not None:
            return job.horizon_s / max(1, len(self.trace))
        return self.device_mtbf_h * 3600.0 / job.gpus

    def draw(self, job: Job, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Failure times in [0, horizon) and the group each one hits."""
        if self.trace is not None:
            tr = sorted((float(t), int(g)) for t, g in self.trace if 0 <= t < job.horizon_s)
            return np.array([t for t, _ in tr], dtype=float), np.array([g for _, g in tr], dtype=int)
        rate = 1.0 / self.job_mtbf_s(job)
        n = rng.poisson(rate * job.horizon_s)
        t = np.sort(rng.uniform(0.0, job.horizon_s, n))
        return t, rng.integers(0, job.groups, n)


@dataclass
class CheckpointRestart:
    """Checkpoint-restart costs. ``None``: from the job's state and the bandwidths (GB/s, aggregate)."""

    period_s: Optional[float] = None  # training time between writes; None: Daly's optimum
    write_s: Optional[float] = None
    write_gbps: float = 2000.0  # Llama 3's Tectonic: 2 TB/s sustained
    restore_s: Optional[float] = None
    read_gbps: float = 2000.0
    detect_s: float = 100.0  # TorchTitan's default comm.train_timeout_seconds
    restart_s: float = 900.0  # Clockwork's stated assumption: 15 min to restart training

    def costs(self, job: Job, mtbf_s: float) -> dict:
        write = self.write_s if self.write_s is not None else job.state_bytes / (self.write_gbps * GB)
        restore = self.restore_s if self.restore_s is not None else job.state_bytes / (self.read_gbps * GB)
        period = self.period_s if self.period_s is not None else daly_period(write, mtbf_s)
        return {"write_s": write, "restore_s": restore, "period_s": period, "down_s": self.detect_s + self.restart_s}


# torchft's cross-group gradient all-reduce over Gloo, per accelerator: what Clockwork's 64-H200 run
# implies (sources.CLOCKWORK_GLOO_GBPS; its replica-group count, 2, is an assumption).
GLOO_GBPS = 0.65  # = sources.clockwork_gloo_gbps(), rounded


@dataclass
class Elastic:
    """Per-step elastic (torchft) costs. Defaults: ``sources`` (published) or named as assumptions."""

    overhead: Optional[float] = None  # per-step overhead, fraction of step_s; None: the all-reduce below
    grad_bytes_per_param: float = 2.0  # bf16 gradients all-reduced across groups every step
    cross_gbps: float = GLOO_GBPS  # per accelerator, between groups (Gloo), GB/s
    stall_s: float = 5.0  # survivors' loss per failure: torchft's default 5-s heartbeat timeout bounds it
    replacement_s: float = 900.0  # a group restarted on new nodes: Clockwork's 15-min restart assumption
    spares: int = 0
    spare_s: float = 60.0  # a spare group's processes started (assumption: scheduling a warm allocation)
    restart_s: float = 120.0  # process start → ready to heal (assumption: imports, model, NCCL init)
    heal_s: Optional[float] = None  # None: the group's state / (heal_gbps per accelerator)
    heal_gbps: float = GLOO_GBPS  # a heal is a state transfer between groups over the same transport
    rejoin_s: float = 0.0  # heal done → taking part again, s
    min_groups: int = 1
    startup_s: float = 0.0  # groups joining after the window began (a measured run's stagger), group-s

    def heal(self, job: Job) -> float:
        return self.heal_s if self.heal_s is not None else job.state_bytes / job.gpus_per_group / (self.heal_gbps * GB)

    def step_overhead(self, job: Job) -> float:
        """The given overhead, else a ring all-reduce of each accelerator's gradient shard across groups."""
        if self.overhead is not None:
            return self.overhead
        if job.groups < 2:
            return 0.0
        shard = job.params * self.grad_bytes_per_param / job.gpus_per_group
        return 2 * (job.groups - 1) / job.groups * shard / (self.cross_gbps * GB) / job.step_s


@dataclass
class DiLoCo(Elastic):
    """Semi-synchronous (DiLoCo) costs; replacement and heal as elastic, no per-step all-reduce."""

    overhead: Optional[float] = 0.0
    sync_steps: int = 500  # inner steps between outer steps: DiLoCo's H (Douillard et al. 2023)
    outer_bytes_per_param: float = 4.0  # fp32 pseudo-gradients
    outer_gbps: float = GLOO_GBPS  # per accelerator, between groups, GB/s
    overlap: bool = False  # streaming DiLoCo hides the outer step behind inner steps

    def sync_s(self, job: Job) -> float:
        if self.overlap or job.groups < 2:
            return 0.0
        shard = job.params * self.outer_bytes_per_param / job.gpus_per_group
        return 2 * (job.groups - 1) / job.groups * shard / (self.outer_gbps * GB)


def input_names() -> set[str]:
    """Every input's name, as ``Projection.replace`` takes it."""
    return {f.name for cls in (Job, Failures, CheckpointRestart, Elastic, DiLoCo) for f in dataclasses.fields(cls)}
