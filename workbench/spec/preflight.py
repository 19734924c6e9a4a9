"""Checks before submit that need the world or judge how well a valid spec will run.

:func:`preflight` raises :class:`~workbench.errors.SpecError` for what cannot
work and returns warnings for what works badly; nothing is created or started.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Optional

from workbench.cluster.backends import backend_class
from workbench.errors import SpecError
from workbench.spec.models import Spec
from workbench.spec.timeouts import Measured, pg_timeout, timeout_warnings
from workbench.trainers.registry import trainer_kind


def _port_busy(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def preflight(spec: Spec, measured: Optional[Measured] = None) -> list[str]:
    """World-facing and cross-field checks before submit.

    Raises :class:`SpecError` for what cannot work; returns warnings for what
    works badly. Each message names the values and says why. Nothing is
    created: the run root's writability is judged on its nearest existing
    ancestor. The timeouts are judged against each other (:mod:`.timeouts`),
    and with ``measured`` (a measured run's figures) also against what the run
    did, and against the cluster's ``KillWait``, which is asked then only.
    """
    root = Path(spec.run_root).expanduser().resolve()
    probe = root
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(f"run_root: {str(root)!r} is not writable (checked {str(probe)!r})")
    lh, tf = spec.lighthouse, spec.torchft
    if lh.port is not None and _port_busy(lh.bind_host, lh.port):
        raise SpecError(f"lighthouse.port: {lh.bind_host}:{lh.port} is already in use; pick another or leave it unset")
    if lh.join_timeout_ms >= tf.quorum_timeout_s * 1000:
        raise SpecError(
            f"lighthouse.join_timeout_ms ({lh.join_timeout_ms}) must be below torchft.quorum_timeout_s "
            f"({tf.quorum_timeout_s} s): replicas would time out their quorum while the lighthouse still waits for stragglers"
        )
    warnings: list[str] = []
    hb = lh.heartbeat_timeout_ms
    pg, pg_ms = pg_timeout(spec)
    if pg_ms < hb:
        warnings.append(
            f"{pg} < lighthouse.heartbeat_timeout_ms ({hb}): "
            "a slow step fails its collective and is discarded, yet the next quorum still waits "
            "for the heartbeat timeout"
        )
    if tf.quorum_timeout_s * 1000 <= hb:
        warnings.append(
            f"torchft.quorum_timeout_s ({tf.quorum_timeout_s}) must exceed lighthouse.heartbeat_timeout_ms "
            f"({hb} ms), or a quorum times out before a dead replica is dropped"
        )
    if lh.join_timeout_ms < 2 * lh.quorum_tick_ms:
        warnings.append(
            f"lighthouse.join_timeout_ms ({lh.join_timeout_ms}) < 2 × quorum_tick_ms ({lh.quorum_tick_ms}): "
            "a group that is already heartbeating (a replacement about to ask to join) is left out of the "
            "next quorum and splits off into a later one"
        )
    kind = trainer_kind(spec.trainer)
    if kind.elastic and kind.checkpoint_period is None and spec.relaunch == "auto" and spec.replicas == 1:
        if not spec.torchft.snapshot_every:
            warnings.append(
                "replicas is 1: a relaunched group has no live peer to heal from; its model state is lost "
                f"(on_state_loss: {spec.on_state_loss}; torchft.snapshot_every resumes it from a snapshot)"
            )
    for i, f in enumerate(spec.faults):
        if f.at_step is not None and f.at_step >= spec.steps:
            warnings.append(f"faults[{i}].at_step ({f.at_step}) >= steps ({spec.steps}): it never fires")
    key = kind.checkpoint_period
    section, _, name = (key or "").partition(".")
    period = getattr(spec, section).get(name) if key else None
    if isinstance(period, int) and period > spec.steps:
        warnings.append(
            f"checkpoint period ({period}) is longer than the run (steps={spec.steps}): no checkpoint is "
            "ever written, so a restart starts from step 0"
        )
    kill_wait = backend_class(spec.cluster).kill_wait_s(spec) if measured is not None else None
    return warnings + timeout_warnings(spec, measured, kill_wait)
