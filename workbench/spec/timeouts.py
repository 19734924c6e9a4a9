"""Every timeout a run sets, against the others and against a measured run: the warnings preflight adds.

A fault is detected, waited out or recovered from by one timeout, and each of them only works if
the ones below it fire first. The timeouts of a run, by who reads them:

========================  ===========================================  ====================================
who                       timeout (spec key)                            bounds
========================  ===========================================  ====================================
lighthouse                ``lighthouse.heartbeat_timeout_ms``           how long a silent group counts as alive
lighthouse                ``lighthouse.join_timeout_ms``                how long a quorum waits for a straggler
torchft Manager           ``torchft.heartbeat_interval_ms``             how often a group says it is alive
torchft process group     ``torchft.pg_timeout_ms`` (TorchTitan:        one cross-group collective
                          ``fault_tolerance.process_group_timeout_ms``)
torchft Manager           ``torchft.timeout_s``                         a collective's future, a heal, a commit
torchft Manager           ``torchft.quorum_timeout_s``                  one quorum request
TorchTitan                ``comm.train_timeout_seconds``,               the group's own (FSDP) collectives,
                          ``comm.init_timeout_seconds``                 after and until its first step
workbench controller      ``hang.timeout_s``                            a group without progress (hang detector)
Slurm                     ``KillWait`` (slurm.conf),                    a stopped job's last seconds; the job
                          ``slurm.time_min``                            (submitit signals it 90 s before)
MaxText / JAX             ``jax_distributed_initialization_timeout``    the job's processes finding each other
                          (below ``slurm.time_min``)
MaxText                   ``checkpoint_period`` (steps)                 the work a crash loses
========================  ===========================================  ====================================

Rules between two settings need only the spec (:func:`timeout_warnings` without ``measured``);
rules against what a run does (the slowest step, heal, save, quorum) need a measured run
(:class:`Measured`, from ``analysis.timeouts.measure``): ``workbench timeouts RUN --check CONFIG``.
The orderings for TorchTitan are its issue #2899's (torchft's process group, then the group's
training timeout, then its init timeout); the heal against ``torchft.timeout_s`` is torchft #329's.
Each message is one line: both settings, their values, and what is required.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Optional

from workbench.paths import CONFIG_DIR
from workbench.spec.models import Spec
from workbench.trainers.registry import trainer_kind
from workbench.trainers.torchft.pg_timeout import DEFAULT_MS as DEFAULT_PG_MS

SIGNAL_DELAY_S = 90
"""submitit's ``--signal=USR2@90``: a Slurm job is told to stop this long before its time limit."""

TITAN_DEFAULTS: dict[str, float] = {"comm.train_timeout_seconds": 15, "comm.init_timeout_seconds": 300}
"""TorchTitan 0.3.0 where neither the TOML nor ``titan.overrides`` sets them: its torchft config
functions set ``CommConfig(train_timeout_seconds=15)``; ``init_timeout_seconds`` is ``CommConfig``'s 300."""

MAXTEXT_INIT_TIMEOUT_S = 300
"""MaxText's ``base.yml`` ``jax_distributed_initialization_timeout``: how long the job's processes wait
for each other in ``jax.distributed.initialize``."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """What a measured run says, for the rules that need it. Seconds; None where the run has none.

    ``step_p50_s``/``step_p99_s``/``step_max_s``: committed steps' ``step_time_s`` over ``steps``
    steps. ``interval_max_s``: the longest gap between a group's consecutive committed steps (a
    save, a heal or a stall inside it). ``heal_max_s``: the slowest heal's transfer. ``save_max_s``:
    the slowest durable checkpoint save. ``quorum_max_s``: the slowest new quorum, from the group's
    last step (or its Manager's start) to the quorum. ``restart_max_s``: the slowest relaunch, from
    the ``restart`` event to the new attempt's first step. ``source``: the run it comes from.
    """

    steps: int = 0
    step_p50_s: Optional[float] = None
    step_p99_s: Optional[float] = None
    step_max_s: Optional[float] = None
    interval_max_s: Optional[float] = None
    heal_max_s: Optional[float] = None
    save_max_s: Optional[float] = None
    quorum_max_s: Optional[float] = None
    restart_max_s: Optional[float] = None
    source: str = ""


def titan_config(spec: Spec) -> dict[str, Any]:
    """The TorchTitan settings a titan job passes: its TOML's ``section.key`` values under ``titan.overrides``."""
    name = str(spec.titan.get("config", "titan-cpu-debug.toml"))
    flat: dict[str, Any] = {}
    for path in (Path(name).expanduser(), CONFIG_DIR / name, CONFIG_DIR / f"{name}.toml"):
        if path.is_file():
            for section, values in tomllib.loads(path.read_text()).items():
                if isinstance(values, dict) and section != "job":
                    flat.update({f"{section}.{k}": v for k, v in values.items()})
            break
    return {**flat, **(spec.titan.get("overrides") or {})}


def pg_timeout(spec: Spec) -> tuple[str, float]:
    """The cross-group process group's timeout as the trainer sets it: (the key and where it comes from, ms).

    Both torchft trainers take ``torchft.pg_timeout_ms``, unset the default of
    ``trainers/torchft/pg_timeout.py`` (or the heartbeat timeout where longer); TorchTitan's
    job (``trainers/titan/job.py``) passes it unless ``titan.overrides`` sets
    ``fault_tolerance.process_group_timeout_ms``. The text reads
    ``key (value)``: ``torchft.pg_timeout_ms (2000, unset: max(2000, lighthouse.heartbeat_timeout_ms))``.
    """
    unset = (
        ""
        if spec.torchft.pg_timeout_ms is not None
        else f", unset: max({DEFAULT_PG_MS}, lighthouse.heartbeat_timeout_ms)"
    )
    if "titan" in trainer_kind(spec.trainer).sections:
        key = "fault_tolerance.process_group_timeout_ms"
        override = (spec.titan.get("overrides") or {}).get(key)
        if isinstance(override, (int, float)):
            return f"titan.overrides.{key} ({override:g})", float(override)
    return f"torchft.pg_timeout_ms ({spec.pg_timeout_ms}{unset})", float(spec.pg_timeout_ms)


def _s(x: float) -> str:
    return f"{x:.3g} s"


def timeout_warnings(spec: Spec, measured: Optional[Measured] = None, kill_wait_s: Optional[float] = None) -> list[str]:
    """The warnings for timeouts that undo each other; with ``measured``, also against the run's measurements.

    ``kill_wait_s``: the cluster's grace between a stop signal and SIGKILL (Slurm's ``KillWait``),
    where the backend has one.
    """
    kind = trainer_kind(spec.trainer)
    out: list[str] = []
    if kind.elastic and "torchft" in kind.sections:
        out += _torchft_rules(spec, measured)
    if "titan" in kind.sections:
        out += _titan_rules(spec, measured)
    if "maxtext" in kind.sections:
        out += _maxtext_rules(spec, measured)
    out += _slurm_rules(spec, measured, kill_wait_s)
    if measured is not None and spec.hang.timeout_s is not None and measured.interval_max_s is not None:
        if spec.hang.timeout_s <= measured.interval_max_s:
            out.append(
                f"hang.timeout_s ({spec.hang.timeout_s}) <= the slowest step interval of {measured.source} "
                f"({_s(measured.interval_max_s)}): required hang.timeout_s > it, or a group in a slow step "
                "(a save, a heal, a stall) is reported hung" + (" and killed" if spec.hang.action == "kill" else "")
            )
    return out


def _torchft_rules(spec: Spec, m: Optional[Measured]) -> list[str]:
    lh, tf = spec.lighthouse, spec.torchft
    out = []
    if lh.heartbeat_timeout_ms < 2 * tf.heartbeat_interval_ms:
        out.append(
            f"lighthouse.heartbeat_timeout_ms ({lh.heartbeat_timeout_ms}) < 2 × torchft.heartbeat_interval_ms "
            f"({tf.heartbeat_interval_ms}): required at least two heartbeats per timeout, or one late heartbeat "
            "drops a live group from the quorum"
        )
    pg, pg_ms = pg_timeout(spec)
    if tf.timeout_s * 1000 <= pg_ms:
        out.append(
            f"torchft.timeout_s ({tf.timeout_s}) <= {pg}: required torchft.timeout_s > the "
            "process-group timeout, or torchft's Manager times the collective out first and the process "
            "group's timeout is not the one in effect"
        )
    if m is None:
        return out
    if m.step_max_s is not None and pg_ms <= m.step_max_s * 1000:
        out.append(
            f"{pg} <= the slowest step of {m.source} ({_s(m.step_max_s)}): required the "
            "process-group timeout > the slowest step, or a collective waiting for a slow peer times out "
            "and the step is discarded"
        )
    if m.heal_max_s is not None and tf.timeout_s <= m.heal_max_s:
        out.append(
            f"torchft.timeout_s ({tf.timeout_s}) <= the slowest heal of {m.source} ({_s(m.heal_max_s)}): "
            "required torchft.timeout_s > the checkpoint transfer, or a heal of this size times out and "
            "the group fails again"
        )
    if m.quorum_max_s is not None and tf.quorum_timeout_s <= m.quorum_max_s:
        out.append(
            f"torchft.quorum_timeout_s ({tf.quorum_timeout_s}) <= the slowest quorum of {m.source} "
            f"({_s(m.quorum_max_s)}): required torchft.quorum_timeout_s > it, or a group gives up on a "
            "quorum that was about to form"
        )
    return out


def _titan_rules(spec: Spec, m: Optional[Measured]) -> list[str]:
    config = titan_config(spec)

    def value(key: str) -> tuple[str, float]:
        if key in (spec.titan.get("overrides") or {}):
            return f"titan.overrides.{key}", float(config[key])
        if key in config:
            return f"titan config {key}", float(config[key])
        return f"TorchTitan's {key}", float(TITAN_DEFAULTS[key])

    out = []
    pg, pg_ms = pg_timeout(spec)
    train_key, train_s = value("comm.train_timeout_seconds")
    init_key, init_s = value("comm.init_timeout_seconds")
    torchft = trainer_kind(spec.trainer).elastic  # titan-restart runs TorchTitan with no torchft
    if torchft and train_s * 1000 <= pg_ms:
        out.append(
            f"{train_key} ({train_s:g}) <= {pg}: required the group's training timeout > "
            "torchft's process-group timeout (torchft's all-reduce runs inside FSDP's collectives), or a "
            "dead peer kills the whole group instead of failing one step"
        )
    if init_s < train_s:
        out.append(
            f"{init_key} ({init_s:g}) < {train_key} ({train_s:g}): required the init timeout >= the training "
            "timeout (the first step also loads, compiles and heals)"
        )
    if torchft and init_s <= spec.torchft.timeout_s:
        out.append(
            f"{init_key} ({init_s:g}) <= torchft.timeout_s ({spec.torchft.timeout_s}): required the init "
            "timeout > torchft's, which bounds a relaunched group's heal in its first step while its other "
            "ranks wait in a collective"
        )
    if m is not None and m.step_max_s is not None and train_s <= m.step_max_s:
        out.append(
            f"{train_key} ({train_s:g}) <= the slowest step of {m.source} ({_s(m.step_max_s)}): required the "
            "group's training timeout > the slowest step, or its ranks time out waiting for a slow rank"
        )
    return out


def _maxtext_rules(spec: Spec, m: Optional[Measured]) -> list[str]:
    out = []
    period = spec.maxtext.get("checkpoint_period")
    if m is not None and isinstance(period, int) and m.step_p50_s is not None:
        between = period * m.step_p50_s
        if spec.chaos is not None and between >= spec.chaos.mtbf_s:
            out.append(
                f"maxtext.checkpoint_period ({period}) × the median step of {m.source} ({_s(m.step_p50_s)}) "
                f"= {_s(between)} >= chaos.mtbf_s ({spec.chaos.mtbf_s}): required saves more often than "
                "faults, or most faults land before a save and the run redoes its work"
            )
        if m.save_max_s is not None and m.save_max_s >= between:
            out.append(
                f"the slowest save of {m.source} ({_s(m.save_max_s)}) >= maxtext.checkpoint_period ({period}) × "
                f"the median step ({_s(m.step_p50_s)}) = {_s(between)}: required a save shorter than the "
                "steps between saves, or the run spends more time saving than training"
            )
    init = spec.maxtext.get("jax_distributed_initialization_timeout", MAXTEXT_INIT_TIMEOUT_S)
    processes = spec.slurm.nodes * spec.slurm.tasks_per_node
    if (
        spec.cluster == "slurm"
        and processes > 1
        and isinstance(init, (int, float))
        and init >= spec.slurm.time_min * 60
    ):
        where = "maxtext.jax_distributed_initialization_timeout"
        shown = (
            f"{where} ({init})"
            if "jax_distributed_initialization_timeout" in spec.maxtext
            else f"MaxText's {where} ({init}, unset)"
        )
        out.append(
            f"{shown} >= slurm.time_min ({spec.slurm.time_min} min): required below the time limit, or a job "
            f"of {processes} processes one of which never comes up holds its nodes until the limit instead of "
            "failing and being resubmitted"
        )
    return out


def _slurm_rules(spec: Spec, m: Optional[Measured], kill_wait_s: Optional[float]) -> list[str]:
    if spec.cluster != "slurm":
        return []
    out = []
    limit_s = spec.slurm.time_min * 60
    if limit_s <= SIGNAL_DELAY_S:
        out.append(
            f"slurm.time_min ({spec.slurm.time_min}) is within submitit's stop signal lead (--signal=USR2@"
            f"{SIGNAL_DELAY_S}): required slurm.time_min > {SIGNAL_DELAY_S / 60:g}, or each job is told to stop "
            "as it starts"
        )
    step_s, what = (m.step_p50_s, f"the median step of {m.source}") if m and m.step_p50_s else (None, "")
    if step_s is None and spec.model.step_delay_s > 0 and "model" in trainer_kind(spec.trainer).sections:
        step_s, what = spec.model.step_delay_s, "model.step_delay_s"
    if step_s is not None and spec.steps * step_s > limit_s - SIGNAL_DELAY_S:
        out.append(
            f"slurm.time_min ({spec.slurm.time_min}) < steps ({spec.steps}) × {what} ({_s(step_s)}) = "
            f"{spec.steps * step_s / 60:.3g} min (+ {SIGNAL_DELAY_S} s of stop signal lead): required a time limit "
            "that holds the planned steps, or every job is stopped before the run ends"
        )
    if kill_wait_s is not None and m is not None and m.save_max_s is not None:
        needed = m.save_max_s + (m.step_max_s or 0.0)
        if kill_wait_s <= needed:
            out.append(
                f"Slurm's KillWait ({kill_wait_s:g} s) <= the slowest step + save of {m.source} "
                f"({_s(m.step_max_s or 0.0)} + {_s(m.save_max_s)}): required KillWait > it, or a preempted "
                "job is SIGKILLed before its save is durable and restarts from the save before"
            )
    return out
