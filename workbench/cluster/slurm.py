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

Faults (:func:`inject`)
-----------------------
A fault finds the replica group's current job in the event log: the
controller's newest ``submit`` event names its ``job_id``, the trainer's
``start`` event its ``node`` and ``pid``.

| action | what happens |
|---|---|
| ``kill`` | ``scancel --signal=KILL --full JOB``: the job dies mid-step, as on a hardware fault [1] |
| ``hang`` | ``scancel --signal=STOP JOB``, then ``--signal=CONT`` after ``seconds`` |
| ``preempt`` | ``scancel --signal=USR2 JOB`` (submitit's preemption signal): the trainer ends its step, exits |
| ``node_down`` | ``scontrol update NodeName=N State=DOWN``: fails the jobs on it; RESUME after ``seconds`` |
| ``slurmd_kill`` | dev cluster only: SIGKILL to the node's slurmd (devcluster's PID); restarted after ``seconds`` |
| ``lighthouse_kill`` | SIGKILL to the lighthouse on the submit host, as locally |

[1] A plain ``scancel`` sends SIGTERM first, which the trainer takes as a preemption.

Resuming (CONT, RESUME, slurmd restart) is done by a detached helper
process, so it happens even if the notebook
dies. Each fault is one ``fault`` event with ``target``, ``attempt``,
``node``, ``job_id`` and ``origin``; its undo a ``fault`` event with
``action="resume"`` and ``resumed`` (``hang``, ``node_down``,
``slurmd_kill``; the target of a node's resume is the node's name).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import submitit

from ..spec import SpecError
from .base import Cluster

ACTIONS = ("kill", "hang", "preempt", "node_down", "slurmd_kill", "lighthouse_kill")
STATE_POLL_S = 0.5
TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED",
})
DEFAULT_SECONDS = {"hang": 5.0, "node_down": 10.0, "slurmd_kill": 10.0}


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

    def __init__(self, spec, run_dir: Path) -> None:
        from ..trainers import ELASTIC

        self.conf = resolve_conf(spec)
        if self.conf:
            os.environ["SLURM_CONF"] = self.conf  # the controller's own environment: submitit's sbatch/sacct/scancel
        self.elastic = spec.trainer in ELASTIC
        self._states: dict[str, str] = {}
        self._polled_at = 0.0
        super().__init__(spec, run_dir)

    def _make_executor(self) -> submitit.SlurmExecutor:
        self.folder = self.run_dir / "jobs" / cluster_identity(self.conf) / "%j"
        ex = submitit.SlurmExecutor(folder=self.folder)
        ex.update_parameters(**executor_parameters(self.spec, self.elastic))
        return ex

    @classmethod
    def validate(cls, spec) -> None:
        """Check the spec against the cluster (``sbatch --test-only``: nothing is queued) and pin ``slurm.conf``."""
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


# --- validation --------------------------------------------------------------


def validate(spec) -> None:
    """Raise SpecError, naming the field, when the cluster would refuse or misrun this spec.

    Pins ``spec.slurm.conf``. Uses ``sbatch --test-only`` with the same
    options submitit would use, which checks partition, account, qos, time
    and node counts without queueing anything.
    """
    from ..trainers import ELASTIC

    conf = resolve_conf(spec)
    if conf and not Path(conf).is_file():
        raise SpecError(f"slurm.conf: {conf!r} does not exist")
    where = f"SLURM_CONF={conf}" if conf else "the default slurm.conf"
    ping = slurm_cmd(conf, "scontrol", "ping", timeout=20)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        hint = " (start the local one with `workbench cluster up`)" if not conf else ""
        raise SpecError(f"cluster: slurm: no Slurm controller answers ({where}){hint}: "
                        f"{(ping.stderr or ping.stdout).strip()}")
    elastic = spec.trainer in ELASTIC
    s = spec.slurm
    if spec.trainer == "torchft-lite" and s.nodes * s.tasks_per_node != 1:
        raise SpecError(f"slurm.nodes x slurm.tasks_per_node: torchft-lite runs one process per replica group; "
                        f"got {s.nodes} x {s.tasks_per_node}, allowed: 1 x 1")
    if elastic and s.requeue:
        raise SpecError("slurm.requeue: replica groups are resubmitted by the controller as the next attempt "
                        "(a Slurm requeue would re-run the same attempt); allowed: false")
    if elastic and spec.lighthouse.bind_host in ("0.0.0.0", "::", ""):
        raise SpecError(f"lighthouse.bind_host: {spec.lighthouse.bind_host!r} is not an address jobs can dial; "
                        "give the submit host's address on the cluster network (127.0.0.1 for the dev cluster)")
    if s.partition:
        listed = slurm_cmd(conf, "sinfo", "-h", "-o", "%R")
        partitions = sorted(set(listed.stdout.split()))
        if listed.returncode == 0 and s.partition not in partitions:
            raise SpecError(f"slurm.partition: {s.partition!r} does not exist; allowed: {', '.join(partitions)}")
    if s.account:
        accounts = _user_accounts(conf)
        if accounts is not None and s.account.lower() not in accounts:
            raise SpecError(f"slurm.account: {s.account!r} is not one of your accounts; "
                            f"allowed: {', '.join(sorted(accounts)) or '(none)'}")
    if s.qos:
        listed = slurm_cmd(conf, "sacctmgr", "-n", "-P", "show", "qos", "format=Name")
        qos = {q.strip().lower() for q in listed.stdout.split() if q.strip()}
        if listed.returncode == 0 and s.qos.lower() not in qos:
            raise SpecError(f"slurm.qos: {s.qos!r} does not exist; allowed: {', '.join(sorted(qos)) or '(none)'}")
    _test_only(spec, conf, elastic)
    spec.slurm.conf = conf


def _user_accounts(conf: Optional[str]) -> Optional[set[str]]:
    """The submitting user's accounts from sacctmgr, or None where accounting cannot say."""
    import getpass

    out = slurm_cmd(conf, "sacctmgr", "-n", "-P", "show", "associations", f"user={getpass.getuser()}",
                    "format=Account")
    if out.returncode != 0:
        return None
    return {a.strip().lower() for a in out.stdout.split() if a.strip()}


_REFUSALS = (
    ("partition", "slurm.partition"), ("account", "slurm.account"), ("qos", "slurm.qos"),
    ("time limit", "slurm.time_min"), ("node count", "slurm.nodes"), ("node configuration", "slurm.nodes"),
    ("gres", "slurm.gpus_per_node"), ("cpu count", "slurm.cpus_per_task"),
)


def _test_only(spec, conf: Optional[str], elastic: bool) -> None:
    params = executor_parameters(spec, elastic)
    argv = ["sbatch", "--test-only", f"--time={params['time']}", f"--nodes={params['nodes']}",
            f"--ntasks-per-node={params['ntasks_per_node']}", f"--cpus-per-task={params['cpus_per_task']}"]
    for key in ("partition", "qos", "account", "gpus_per_node"):
        if key in params:
            argv.append(f"--{key.replace('_', '-')}={params[key]}")
    for key, value in params["additional_parameters"].items():
        argv.append(f"--{key}" if value is True else f"--{key}={value}")
    result = slurm_cmd(conf, *argv, "--wrap=true")
    if result.returncode == 0:
        return
    message = (result.stderr or result.stdout).strip().replace("sbatch: error: ", "")
    lowered = message.lower()
    field = next((f for word, f in _REFUSALS if word in lowered), "slurm")
    raise SpecError(f"{field}: the cluster refuses this job: {message}")


# --- faults --------------------------------------------------------------------


def current_job(events: list[dict], replica: int) -> Optional[dict]:
    """The replica group's newest submitted job that has not ended.

    ``job_id`` and ``attempt`` from the controller's ``submit`` event; ``node``,
    ``pid`` and ``host`` from the trainer's ``start`` event (None before it started).
    """
    submits = [e for e in events if e.get("kind") == "submit" and e.get("replica") == replica]
    if not submits:
        return None
    sub = submits[-1]
    attempt = sub.get("attempt", 0)
    ended = any(e.get("kind") == "job" and e.get("replica") == replica and e.get("attempt") == attempt
                for e in events)
    if ended:
        return None
    job = {"job_id": str(sub["job_id"]), "attempt": attempt, "node": None, "pid": None, "host": None}
    for e in events:
        if (e.get("kind") == "start" and e.get("replica") == replica and e.get("attempt") == attempt
                and e.get("role") != "controller"):
            job.update(node=e.get("node"), pid=e.get("pid"), host=e.get("host"))
    return job


def _conf_of(run_dir: Path) -> Optional[str]:
    from ..rundir import read_record

    return (read_record(run_dir)["spec"].get("slurm") or {}).get("conf")


def inject(run_dir, action: str, target: Optional[int], origin: str, seconds: Optional[float], writer, events) -> dict:
    """Inject one fault on a Slurm run and record it; raises FaultError (nothing done) on bad input."""
    from ..faults import FaultError, _alive, lighthouse_pid

    run_dir = Path(run_dir)
    if action not in ACTIONS:
        raise FaultError(f"action: {action!r} is not a fault on Slurm; allowed: {', '.join(ACTIONS)}")
    conf = _conf_of(run_dir)
    if action == "lighthouse_kill":
        pid = lighthouse_pid(run_dir, events)
        if not pid or not _alive(pid):
            raise FaultError("lighthouse_kill: this run has no live lighthouse")
        os.kill(pid, signal.SIGKILL)
        return writer.emit("fault", action=action, target="lighthouse", pid=pid, node=None, job_id=None,
                           origin=origin)
    if target is None:
        raise FaultError(f"target: {action} needs a replica index")
    target = int(target)
    job = current_job(events, target)
    if job is None:
        raise FaultError(f"target: replica {target} has no live Slurm job to {action}")
    if action in DEFAULT_SECONDS:
        seconds = float(seconds if seconds is not None else DEFAULT_SECONDS[action])
        if seconds <= 0:
            raise FaultError(f"seconds: a {action} lasts > 0 seconds, got {seconds}")
    else:
        seconds = None
    if action in ("node_down", "slurmd_kill") and not job["node"]:
        job["node"] = slurm_cmd(conf, "squeue", "-h", "-j", job["job_id"], "-o", "%N").stdout.strip() or None
    if job["node"] and ("," in job["node"] or "[" in job["node"]):  # a multi-node job: its first node
        job["node"] = (slurm_cmd(conf, "scontrol", "show", "hostnames", job["node"]).stdout.split() or [None])[0]
    if action in ("node_down", "slurmd_kill") and not job["node"]:
        raise FaultError(f"target: replica {target}'s job {job['job_id']} has not started on a node yet")

    def run_or_fail(*argv: str) -> None:
        result = slurm_cmd(conf, *argv)
        if result.returncode != 0:
            raise FaultError(f"{action}: `{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()}")

    if action == "kill":
        run_or_fail("scancel", "--signal=KILL", "--full", job["job_id"])
    elif action == "preempt":
        run_or_fail("scancel", "--signal=USR2", job["job_id"])
    elif action == "hang":
        run_or_fail("scancel", "--signal=STOP", job["job_id"])
        _later(run_dir, conf, "cont", job["job_id"], seconds, target)
    elif action == "node_down":
        run_or_fail("scontrol", "update", f"NodeName={job['node']}", "State=DOWN",
                    f"Reason=workbench fault ({origin}) on replica {target}")
        _later(run_dir, conf, "resume_node", job["node"], seconds, target)
    elif action == "slurmd_kill":
        os.kill(_slurmd_pid(conf, job["node"]), signal.SIGKILL)
        _later(run_dir, conf, "restart_slurmd", job["node"], seconds, target)
    return writer.emit("fault", action=action, target=target, attempt=job["attempt"], node=job["node"],
                       job_id=job["job_id"], pid=job["pid"], origin=origin, seconds=seconds)


def _slurmd_pid(conf: Optional[str], node: str) -> int:
    """PID of the dev cluster's running ``slurmd -N node``, or FaultError: only the dev cluster's slurmd is ours."""
    from .. import devcluster
    from ..faults import FaultError

    try:
        return devcluster.slurmd_pid(conf, node)
    except devcluster.DevClusterError as e:
        raise FaultError(f"slurmd_kill: {e}") from None


# The undo helper sleeps and runs the Slurm command before it imports anything heavy: importing
# workbench takes seconds on a busy host, which would lengthen a short hang.
_UNDO_HELPER = """
import json, subprocess, sys, time
until, what, run_dir, subject, target, argv = json.loads(sys.argv[1])
time.sleep(max(0.0, until - time.time()))
if argv:
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
t = time.time()
from workbench.cluster.slurm import _undone
_undone(what, run_dir, subject, target, t)
"""


def _later(run_dir: Path, conf: Optional[str], what: str, subject: str, seconds: float, target: int) -> None:
    """Undo a fault ``seconds`` from now, from a detached helper that outlives the notebook."""
    argv = {
        "cont": ["scancel", "--signal=CONT", subject],
        "resume_node": ["scontrol", "update", f"NodeName={subject}", "State=RESUME"],
    }.get(what)
    payload = json.dumps([time.time() + seconds, what, str(run_dir), subject, target, argv])
    subprocess.Popen(
        [sys.executable, "-c", _UNDO_HELPER, payload], env=client_env(conf), cwd=_REPO_ROOT,
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


_REPO_ROOT = str(Path(__file__).resolve().parents[2])


def _undone(what: str, run_dir: str, subject: str, target: int, t: float) -> None:
    """Finish an undo in the helper (restart a slurmd) and record it as a ``resume`` fault event at ``t``."""
    from ..faults import _control_writer

    fields: dict[str, Any] = {"t": t, "action": "resume", "origin": "schedule"}
    if what == "cont":
        fields.update(resumed="hang", target=target, job_id=subject)
    elif what == "resume_node":
        fields.update(resumed="node_down", target=subject, node=subject, replica_hit=target)
    elif what == "restart_slurmd":
        from .. import devcluster

        devcluster.restart_slurmd(_conf_of(Path(run_dir)), subject)
        fields.update(t=time.time(), resumed="slurmd_kill", target=subject, node=subject, replica_hit=target)
    _control_writer(Path(run_dir)).emit("fault", **fields)
