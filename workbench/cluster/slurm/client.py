"""Talking to a Slurm cluster: which one (``slurm.conf``), its client commands, job states, and
the submitit parameters a spec's ``slurm`` section means. Shared by the backend
(``backend.py``), its validation and its faults; imports neither.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any, Optional

from workbench.cluster.slurm.statedir import running_slurm_conf
from workbench.trainers.forked import QUIET_ENV
from workbench.trainers.placement import node_address

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REVOKED",
    }
)


def resolve_conf(spec) -> Optional[str]:
    """The slurm.conf this spec's clients use: the spec's, else :func:`default_conf`."""
    if spec.slurm.conf:
        return str(Path(spec.slurm.conf).expanduser().resolve())
    return default_conf()


def default_conf() -> Optional[str]:
    """``$SLURM_CONF``, else that of a cluster running from its state directory on this host (the dev
    cluster's: :func:`~workbench.cluster.slurm.statedir.running_slurm_conf`), else None (Slurm's default)."""
    if os.environ.get("SLURM_CONF"):
        return str(Path(os.environ["SLURM_CONF"]).resolve())
    found = running_slurm_conf()
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


def kill_wait_s(conf: Optional[str]) -> Optional[float]:
    """``KillWait`` from ``scontrol show config`` (``KillWait = 30 sec``); None where no controller answers."""
    out = slurm_cmd(conf, "scontrol", "show", "config", timeout=10)
    m = re.search(r"^\s*KillWait\s*=\s*(\d+)", out.stdout, re.MULTILINE) if out.returncode == 0 else None
    return float(m.group(1)) if m else None


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


def job_end(conf: Optional[str], job_id: str, timeout: float = 5) -> Optional[dict]:
    """How job ``job_id`` ended, from accounting: ``{"state", "exit_code", "derived_exit_code", "node"}``
    (``sacct -X``: the allocation's record; ``state`` in full, ``CANCELLED by 0``); None while accounting
    has no terminal record of it (it lags slurmctld) or cannot be asked."""
    out = slurm_cmd(
        conf,
        "sacct",
        "-j",
        job_id,
        "-X",
        "-n",
        "-P",
        "-o",
        "JobID,State,ExitCode,DerivedExitCode,NodeList",
        timeout=timeout,
    )
    if out.returncode != 0:
        return None
    for line in out.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 5 and fields[0].strip() == job_id:
            state = fields[1].strip().replace("+", "")
            if state.split()[0].upper() not in TERMINAL_STATES:
                return None
            return {"state": state, "exit_code": fields[2], "derived_exit_code": fields[3], "node": fields[4]}
    return None


def controller_job_end(conf: Optional[str], job_id: str, timeout: float = 5) -> Optional[dict]:
    """The same from slurmctld (``scontrol show job``), which knows at once, for ``MinJobAge`` after the
    end; no ``by UID`` for a cancellation. None where it no longer knows the job."""
    out = slurm_cmd(conf, "scontrol", "-o", "show", "job", job_id, timeout=timeout)
    if out.returncode != 0:
        return None
    f = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
    if f.get("JobState", "").upper() not in TERMINAL_STATES:
        return None
    return {
        "state": f["JobState"],
        "exit_code": f.get("ExitCode", ""),
        "derived_exit_code": f.get("DerivedExitCode", ""),
        "node": f.get("NodeList", ""),
    }


def _parse_states(text: str) -> dict[str, str]:
    states = {}
    for line in text.splitlines():
        if "|" in line:
            job_id, state = line.split("|", 1)
            states[job_id.strip()] = state.split()[0].rstrip("+").upper() if state.strip() else "UNKNOWN"
    return states


def executor_parameters(spec, elastic: bool) -> dict[str, Any]:
    """submitit ``SlurmExecutor`` parameters from ``spec.slurm``.

    A checkpoint-restart job of several tasks is one program (MaxText's ``jax.distributed``):
    ``srun --kill-on-bad-exit=1`` ends the whole step when one task dies. Without it the
    survivors wait out JAX's heartbeat timeout (100 s, which MaxText does not expose;
    measured here: the surviving process aborted 75 s after its peer was SIGKILLed) before the
    job ends and can be resubmitted.

    With hot spares, a job's environment is ``forked.QUIET_ENV`` (exported before the user's
    ``setup``, which may set it otherwise): a spare imports its trainer while it waits and forks
    its ranks from itself (``trainers/titan/spare.py``), which it may only do with one thread, and
    submitit's job runner imports numpy, whose OpenBLAS pool would otherwise start a thread per
    core at once (seen on the dev cluster: "not fork-safe (2 threads)", the ranks exec'd).
    """
    s = spec.slurm
    srun_args = list(s.srun_args)
    if (
        not elastic
        and s.nodes * s.tasks_per_node > 1
        and not any(a.startswith(("--kill-on-bad-exit", "-K")) for a in srun_args)
    ):
        srun_args.append("--kill-on-bad-exit=1")
    quiet = [f"export {k}={v}" for k, v in QUIET_ENV.items()] if spec.spares else []
    params: dict[str, Any] = {
        "time": s.time_min,
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        "srun_args": srun_args,
        "setup": quiet + list(s.setup),
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


def submit_host_toward_nodes(conf: Optional[str], fallback: str) -> str:
    """This host's address on the way to the cluster's first node; ``fallback`` when that node is on loopback.

    The lighthouse binds it: on the dev cluster with namespaced nodes, the bridge's address.
    """
    first = (slurm_cmd(conf, "sinfo", "-h", "-N", "-o", "%N").stdout.split() or [None])[0]
    if first is None:
        return fallback
    try:
        addr = node_address(first, conf)
        if ipaddress.ip_address(addr).is_loopback:
            return fallback
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))  # UDP: picks the route, sends nothing
            return s.getsockname()[0]
    except (LookupError, ValueError, OSError):
        return fallback
