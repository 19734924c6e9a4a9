"""A Slurm cluster on this host, found through its state directory: a convention this backend owns.

The backend never imports what runs such a cluster (the dev cluster, :mod:`workbench.devcluster`, is
development tooling); the dev cluster follows this convention instead, and imports it from here.

- The state directory is ``$WORKBENCH_SLURM_DIR``, else ``~/.cache/workbench/slurm``
  (:func:`resolve_state_dir`); ``etc/slurm.conf`` in it is the cluster's configuration.
- ``state.json`` in it records the daemons that run now: ``daemons`` maps ``slurmctld``,
  ``slurmd-<node>`` and the rest to ``{"pid", "started", "argv"}``. ``started`` is
  :func:`workbench.cluster.procs.start_time`, so a PID the kernel has since reused is never taken
  for a daemon (:func:`alive`). ``restart_slurmd`` is the command that starts a node's slurmd again
  unless it runs, with the node's name as its last argument.
- ``process-marker`` in it is the state directory's marker (:func:`daemon_marker`,
  ``workbench.cluster.procs.Marker``): every daemon is started with it in ``$WORKBENCH_SLURM_DAEMON_MARKER``,
  and is signalled (by ``down``, by the ``slurmd_kill`` fault) only once its record, its owner and that
  marker prove it is one of the cluster's daemons: a forged record names no other process.

What the backend takes from it:

- its default ``slurm.conf`` (:func:`running_slurm_conf`): with none in the spec and no
  ``$SLURM_CONF``, that of the cluster in the state directory, while its recorded slurmctld runs;
- the ``slurmd_kill`` fault (:func:`recorded_slurmd`): a node's slurmd, killed by its recorded PID once
  proven, and the command the detached undo helper runs to start it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional

from workbench.cluster.procs import HOST, Marker, Proc

ENV_STATE_DIR = "WORKBENCH_SLURM_DIR"
DEFAULT_STATE_DIR = Path("~/.cache/workbench/slurm")
SLURM_CONF = Path("etc", "slurm.conf")  # in the state directory
STATE_FILE = "state.json"  # in the state directory
RESTART_SLURMD = "restart_slurmd"  # the state file's key for the command that restarts a node's slurmd
DAEMON_MARKER = "WORKBENCH_SLURM_DAEMON_MARKER"  # the variable the daemons carry the state directory's marker in

StateDir = Optional[os.PathLike | str]


def resolve_state_dir(state_dir: StateDir = None) -> Path:
    """The argument, else ``$WORKBENCH_SLURM_DIR``, else ``~/.cache/workbench/slurm``; absolute."""
    chosen = state_dir or os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR
    return Path(chosen).expanduser().resolve()


def state_dir_of(conf: os.PathLike | str) -> Optional[Path]:
    """The state directory whose ``etc/slurm.conf`` is ``conf``; None when ``conf`` is not where one keeps it."""
    path = Path(conf).expanduser().resolve()
    if path.name != SLURM_CONF.name or path.parent.name != SLURM_CONF.parent.name:
        return None
    return path.parent.parent


def read_state(state_dir: Path) -> Optional[dict]:
    """``state.json`` of ``state_dir``; None when there is none (never brought up)."""
    try:
        return json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def daemon_proc(entry: Mapping[str, Any]) -> Proc:
    """The process a daemon's entry records. An entry from an older workbench has ``create_time`` (wall
    clock) instead of ``started``: ``Proc`` tells the two apart by size."""
    return Proc(entry["pid"], HOST, entry.get("started", entry.get("create_time")))


def daemon_marker(state_dir: os.PathLike | str) -> Optional[Marker]:
    """The marker the daemons of ``state_dir`` carry; None for a state directory without one (an older
    workbench brought it up: its daemons prove nothing and are never signalled)."""
    return Marker.of(state_dir, DAEMON_MARKER)


def alive(entry: Optional[Mapping[str, Any]]) -> bool:
    """The recorded daemon still runs (same PID and start time, so not a reused PID) and is not a zombie."""
    if not entry:
        return False
    return daemon_proc(entry).alive()


def running_slurm_conf(state_dir: StateDir = None) -> Optional[Path]:
    """The ``slurm.conf`` of the cluster in ``state_dir``, or None when its slurmctld is not running."""
    root = resolve_state_dir(state_dir)
    state = read_state(root)
    conf = root / SLURM_CONF
    if state and alive(state["daemons"].get("slurmctld")) and conf.is_file():
        return conf
    return None


def recorded_slurmd(conf: Optional[str], node: str) -> tuple[Proc, Optional[Marker], list[str]]:
    """The running ``slurmd -N node`` of the cluster whose ``slurm.conf`` is ``conf``, the marker that
    proves it the cluster's (to signal it with), and the command that starts it again (the node's name to
    be appended).

    Raises LookupError, one line, when that slurmd is not one such a cluster records (``conf`` is another
    cluster's, or None), is not running, does not prove it is the cluster's, or the record has no restart
    command."""
    root = state_dir_of(conf) if conf else None
    state = (read_state(root) if root else None) or {}
    entry = state.get("daemons", {}).get(f"slurmd-{node}")
    if not entry:
        raise LookupError(
            f"node {node}'s slurmd is not one the dev cluster started (slurm.conf {conf}); on a real cluster ask its admins"
        )
    if not alive(entry):
        raise LookupError(f"node {node}'s slurmd (pid {entry['pid']}) is not running")
    proc, marker = daemon_proc(entry), daemon_marker(root) if root else None
    why = proc.why_not_ours(marker)
    if why is not None:
        raise LookupError(f"node {node}'s recorded slurmd: {why}; not signalled")
    restart = state.get(RESTART_SLURMD)
    if not restart:
        raise LookupError(
            f"the dev cluster of {conf} records no {RESTART_SLURMD} command (an older workbench brought it up); "
            "`workbench cluster up` records it"
        )
    return proc, marker, list(restart)
