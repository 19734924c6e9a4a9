"""Jobs on Slurm, through submitit's ``SlurmExecutor`` (no hand-written sbatch).

Which cluster
-------------
``spec.slurm.conf`` names the ``slurm.conf`` every client call uses. Left
empty, :meth:`SlurmCluster.validate` (run by ``workbench.submit``) pins it:
``$SLURM_CONF`` if set, else the local dev cluster's when that is up
(``devcluster.find_slurm_conf()``), else none (the machine's default Slurm).
The pinned value is in ``run.json``, so the controller, and any process that
attaches later and kills a job, talk to the same cluster. The controller sets
``SLURM_CONF`` in its own environment, which sbatch, sacct and scancel (and
so submitit) inherit. Job ids restart at 1 on a fresh cluster, so the
submitit folder is ``jobs/<ClusterName>-<hash of the conf path>/%j``: two
clusters never share one.

Replica groups
--------------
One Slurm job per torchft replica group, submitted ``--no-requeue``: Slurm
requeues a batch job after a node failure by default, and would re-run the
same pickled ``JobContext`` with the same attempt number. Instead a job that
ended is the controller's to resubmit, as attempt + 1. The lighthouse runs
inside the controller on the submit host, bound to ``lighthouse.bind_host``:
an address the compute nodes can reach (127.0.0.1 for the dev cluster).
A checkpoint-restart trainer (MaxText) is one job over ``slurm.nodes``
nodes, resubmitted the same way, and resumes from its last durable
checkpoint; ``slurm.requeue: true`` lets Slurm requeue it instead (the same
attempt runs again: its events show a second ``start``).

Job state
---------
submitit's sacct watcher backs off to one query per 10 minutes, and sacct lags
slurmctld. :meth:`SlurmCluster.is_done` asks slurmctld (``squeue -t all``,
at most every ``STATE_POLL_S``; sacct only for a job squeue no longer lists)
and calls a job done only in a terminal state: pending, requeued, suspended
or unknown jobs are alive.

Faults
------
``slurm_faults.py``: each kind of the table (``workbench.faultkinds``) the
way Slurm does it (``scancel --signal``, ``scontrol update``); validation at
submit is ``slurm_validate.py``.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional

import submitit

from .base import Cluster

STATE_POLL_S = 0.5
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED",
})


def resolve_conf(spec) -> Optional[str]:
    """The slurm.conf this spec's clients use: the spec's, ``$SLURM_CONF``, the dev cluster's, or None."""
    if spec.slurm.conf:
        return str(Path(spec.slurm.conf).expanduser().resolve())
    if os.environ.get("SLURM_CONF"):
        return str(Path(os.environ["SLURM_CONF"]).resolve())
    from .. import devcluster

    found = devcluster.find_slurm_conf()
    return str(found) if found else None


def client_env(conf: Optional[str]) -> dict[str, str]:
    env = dict(os.environ)
    if conf:
        env["SLURM_CONF"] = conf
    return env


def slurm_cmd(conf: Optional[str], *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run one Slurm client command against the cluster of ``conf``; never raises on a non-zero exit."""
    try:
        return subprocess.run(list(argv), env=client_env(conf), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: not installed")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]}: no answer within {timeout}s")


def cluster_identity(conf: Optional[str]) -> str:
    """``<ClusterName>-<8 hex of the conf path>``: names the submitit folder, one per cluster."""
    name = None
    if conf and Path(conf).is_file():
        m = re.search(r"^\s*ClusterName\s*=\s*(\S+)", Path(conf).read_text(), re.MULTILINE | re.IGNORECASE)
        name = m.group(1) if m else None
    if name is None:
        out = slurm_cmd(conf, "scontrol", "show", "config").stdout
        m = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.MULTILINE)
        name = m.group(1) if m else "slurm"
    digest = hashlib.sha1((conf or "default").encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest}"


class SlurmCluster(Cluster):
    name = "slurm"
    preempt_signal = signal.SIGUSR2  # submitit's preemption signal

    def __init__(self, spec, run_dir: Path) -> None:
        from ..trainers import trainer_kind

        self.conf = resolve_conf(spec)
        self.elastic = trainer_kind(spec.trainer).elastic
        self._states: dict[str, str] = {}
        self._polled_at = 0.0
        super().__init__(spec, run_dir)

    def _make_executor(self) -> submitit.SlurmExecutor:
        if self.conf:
            os.environ["SLURM_CONF"] = self.conf  # the controller's own environment: submitit's sbatch/sacct/scancel
        self.folder = self.run_dir / "jobs" / cluster_identity(self.conf) / "%j"
        ex = submitit.SlurmExecutor(folder=self.folder)
        ex.update_parameters(**executor_parameters(self.spec, self.elastic))
        return ex

    @classmethod
    def validate(cls, spec) -> None:
        """Check the spec against the cluster (``sbatch --test-only``: nothing is queued) and pin ``slurm.conf``."""
        from .slurm_validate import validate

        validate(spec)

    def submit(self, fn: Callable[..., Any], *args: Any, name: str) -> submitit.Job:
        self.executor.update_parameters(job_name=name)
        job = self.executor.submit(fn, *args)
        self._states[str(job.job_id)] = "PENDING"
        return job

    def is_done(self, job: submitit.Job) -> bool:
        job_id = str(job.job_id)
        if self._states.get(job_id) not in TERMINAL_STATES and time.monotonic() - self._polled_at > STATE_POLL_S:
            self._poll_states()
        return self._states.get(job_id) in TERMINAL_STATES

    def cancel(self, job: submitit.Job) -> None:
        slurm_cmd(self.conf, "scancel", str(job.job_id))

    def inject(self, kind, view, seconds, origin: str) -> dict:
        from .slurm_faults import inject

        return inject(self, kind, view, seconds, origin)

    def undo(self, payload: dict) -> dict:
        from .slurm_faults import undo

        return undo(self, payload)

    def stop_all(self, state) -> list[str]:
        """Cancel every job the run submitted, then the processes on this host."""
        job_ids = sorted({j for v in state.replicas.values() for j in v.jobs.values()})
        if job_ids:
            slurm_cmd(self.conf, "scancel", *job_ids)
        return super().stop_all(state)

    def _poll_states(self) -> None:
        self._polled_at = time.monotonic()
        live = [j for j, s in self._states.items() if s not in TERMINAL_STATES]
        if not live:
            return
        self._states.update(job_states(self.conf, live))


def job_states(conf: Optional[str], job_ids: list[str]) -> dict[str, str]:
    """Slurm state of each job: slurmctld's (squeue), else accounting's (sacct); absent when neither knows."""
    out = slurm_cmd(conf, "squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T")
    states = _parse_states(out.stdout) if out.returncode == 0 else {}
    missing = [j for j in job_ids if j not in states]
    if missing:
        acct = slurm_cmd(conf, "sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(missing))
        if acct.returncode == 0:
            states.update({j: s for j, s in _parse_states(acct.stdout).items() if j in missing})
    return states


def _parse_states(text: str) -> dict[str, str]:
    states = {}
    for line in text.splitlines():
        if "|" in line:
            job_id, state = line.split("|", 1)
            states[job_id.strip()] = state.split()[0].rstrip("+").upper() if state.strip() else "UNKNOWN"
    return states


def executor_parameters(spec, elastic: bool) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters from ``spec.slurm``."""
    s = spec.slurm
    params: dict[str, Any] = {
        "time": s.time_min,
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        "srun_args": list(s.srun_args),
        "setup": list(s.setup),
        "stderr_to_stdout": True,
    }
    if s.gpus_per_node:
        params["gpus_per_node"] = s.gpus_per_node
    for key in ("partition", "qos", "account"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    extra = dict(s.sbatch_args)
    extra["requeue" if s.requeue else "no-requeue"] = True
    params["additional_parameters"] = extra
    return params
