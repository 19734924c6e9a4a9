"""Jobs on Slurm, through submitit's ``SlurmExecutor`` (no hand-written sbatch).

Which cluster
-------------
``spec.slurm.conf`` names the ``slurm.conf`` every client call uses. Left
empty, :meth:`SlurmCluster.validate` (run by ``workbench.submit``) pins it:
``$SLURM_CONF`` if set, else the local dev cluster's when that is up (found
through its state directory, ``statedir.running_slurm_conf()``), else none
(the machine's default Slurm).
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
an address the compute nodes can reach. A loopback one is taken to mean "this
host": where the nodes are not on loopback (the dev cluster's namespaced nodes)
it becomes this host's address toward them (the bridge's, 198.18.0.1).
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

How a job ended (:meth:`SlurmCluster.exit_status`, once it is done) is accounting's record
(``sacct -X``: ``State`` in full, ``CANCELLED by 0``; ``ExitCode`` ``code:signal``; ``DerivedExitCode``,
the steps' worst, where the trainer's signal is when the batch script itself exited; ``NodeList``).
Accounting lags slurmctld (slurmdbd is told asynchronously): it is asked again for up to
``SACCT_WAIT_S``, which the controller's loop waits, then slurmctld's own record (``scontrol show job``,
the same but the canceller) is taken instead: a Slurm that does not answer holds the loop for about
``SACCT_WAIT_S + SCONTROL_TIMEOUT_S`` (2 s) at most. ``OUT_OF_MEMORY`` is the OOM killer's evidence (``oom:
slurm``): Slurm's cgroup plugin counted an OOM kill in the job's own cgroup.

Faults
------
``faults.py``: each kind of the table (``workbench.faults.kinds``) the
way Slurm does it (``scancel --signal``, ``scontrol update``); validation at
submit is ``validate.py``.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Optional

import submitit

from workbench.cluster import exits
from workbench.cluster.base import Cluster
from workbench.cluster.slurm import faults as slurm_faults
from workbench.cluster.slurm import validate as slurm_validate
from workbench.cluster.slurm.client import (
    TERMINAL_STATES,
    client_env,
    cluster_identity,
    controller_job_end,
    executor_parameters,
    job_end,
    job_states,
    kill_wait_s,
    resolve_conf,
    slurm_cmd,
    submit_host_toward_nodes,
)
from workbench.trainers.registry import trainer_kind

__all__ = ["SlurmCluster", "TERMINAL_STATES", "client_env", "executor_parameters", "resolve_conf", "slurm_cmd"]

STATE_POLL_S = 0.5
SACCT_WAIT_S = 1.0  # for accounting's record of a job slurmctld says ended (it lags), then slurmctld's
SACCT_RETRY_S = 0.2
SCONTROL_TIMEOUT_S = 1.0  # so that a Slurm that does not answer holds the loop for 2 s at most


class SlurmCluster(Cluster):
    name = "slurm"
    preempt_signal = signal.SIGUSR2  # submitit's preemption signal
    job_gpus_key = "slurm.gpus_per_node"  # jobs run on the nodes: the spec, not this machine, says their GPUs

    def __init__(self, spec, run_dir: Path) -> None:
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

    @property
    def lighthouse_host(self) -> str:
        """``lighthouse.bind_host``; a loopback one becomes this host's address toward the nodes when they
        are not on loopback (the dev cluster's namespaced nodes reach the head at the bridge's address)."""
        host = self.spec.lighthouse.bind_host
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host
        return submit_host_toward_nodes(self.conf, host) if loopback else host

    @classmethod
    def validate(cls, spec) -> None:
        """Check the spec against the cluster (``sbatch --test-only``: nothing is queued) and pin ``slurm.conf``."""
        slurm_validate.validate(spec)

    @classmethod
    def kill_wait_s(cls, spec) -> Optional[float]:
        """The cluster's ``KillWait`` (``scontrol show config``); None where no controller answers."""
        return kill_wait_s(resolve_conf(spec))

    def submit(self, fn: Callable[..., Any], *args: Any, name: str, whole_nodes: bool = False) -> submitit.Job:
        self.executor.update_parameters(job_name=name, exclusive=True if whole_nodes else None)
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

    def exit_status(self, job: submitit.Job) -> exits.ExitStatus:
        """Accounting's record of the job's end, waited for up to ``SACCT_WAIT_S``; else slurmctld's."""
        job_id = str(job.job_id)
        deadline = time.monotonic() + SACCT_WAIT_S
        end = job_end(self.conf, job_id, timeout=SACCT_WAIT_S)
        while end is None and time.monotonic() + SACCT_RETRY_S < deadline:
            time.sleep(SACCT_RETRY_S)
            end = job_end(self.conf, job_id, timeout=max(0.1, deadline - time.monotonic()))
        end = end or controller_job_end(self.conf, job_id, timeout=SCONTROL_TIMEOUT_S)
        if end is None:
            return exits.ExitStatus(slurm_state=self._states.get(job_id))
        return slurm_exit_status(end)

    def inject(self, kind, view, seconds, origin: str, proc=None) -> dict:
        """``proc`` is never given: the kinds that name another process than the group's are local only."""
        return slurm_faults.inject(self, kind, view, seconds, origin)

    def stop_all(self, state, remote_ended: bool = False) -> list[str]:
        """Cancel every job the run submitted (which ends its processes on the nodes), then the processes
        on this host; a line for each process on a node too where ``scancel`` failed."""
        job_ids = sorted({j for v in state.replicas.values() for j in v.jobs.values()})
        cancelled = not job_ids or slurm_cmd(self.conf, "scancel", *job_ids).returncode == 0
        return super().stop_all(state, remote_ended=remote_ended or cancelled)

    def _poll_states(self) -> None:
        self._polled_at = time.monotonic()
        live = [j for j, s in self._states.items() if s not in TERMINAL_STATES]
        if not live:
            return
        self._states.update(job_states(self.conf, live))


def slurm_exit_status(end: dict) -> exits.ExitStatus:
    """An :class:`~workbench.cluster.exits.ExitStatus` from :func:`~workbench.cluster.slurm.client.job_end`'s
    record: the signal of ``ExitCode``, else of ``DerivedExitCode`` (srun's task), else ``ExitCode``'s code."""
    status = exits.ExitStatus(
        slurm_state=end["state"] or None, slurm_exit_code=end["exit_code"] or None, node=end["node"] or None
    )
    codes = [_code_signal(end["exit_code"]), _code_signal(end["derived_exit_code"])]
    sig = next((s for _, s in filter(None, codes) if s), 0)
    if sig:
        status.signal = exits.signal_name(sig)
    elif codes[0] is not None:
        status.exit_code = codes[0][0]
    if end["state"].split()[0].upper() == "OUT_OF_MEMORY":
        status.oom = "slurm"
    if status.node in ("None assigned", "(null)"):
        status.node = None
    return status


def _code_signal(text: str):
    code, _, sig = (text or "").partition(":")
    return (int(code), int(sig)) if code.isdigit() and sig.isdigit() else None
