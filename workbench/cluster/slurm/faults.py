"""Faults on Slurm: the kinds of the table (``workbench.faults.kinds``) as Slurm does them.

The target is the replica group's newest submitted job that has not ended,
from the run-state fold (``ReplicaView.current_job``: the controller's
``submit`` event, or the ``restart`` of a spare's takeover, names its job id;
the trainer's ``start`` event its node).

| kind | what happens |
|---|---|
| a kind with a ``signal`` | ``scancel --signal=SIG JOB.0``: every task of the job's step (submitit's one ``srun``) gets it [1] |
| ``preempt`` | ``scancel --signal=USR2 JOB`` (submitit's preemption signal): the trainer ends its step, exits |
| ``hang`` | ``scancel --signal=STOP JOB``, then ``--signal=CONT`` after ``seconds`` |
| ``node_down`` | ``scontrol update NodeName=N State=DOWN``: fails the jobs on it; RESUME after ``seconds`` |
| ``partition``, ``slow_link`` | dev cluster only: the node's veth down / a ``tbf`` on it (``workbench.faults.host``) |
| ``straggler``, ``freeze`` | the group's processes (on this host: the dev cluster) in a throttling / frozen cgroup |
| ``slurmd_kill`` | dev cluster only: SIGKILL to the node's slurmd (its state directory's record, ``statedir``), restarted after ``seconds`` |

[1] Not the job: a plain ``scancel`` sends SIGTERM first, which the trainer takes as a preemption, and so does
``--signal=KILL --full JOB``: it kills the batch shell too, whose end makes Slurm cancel the job's step (SIGTERM,
``KillWait``, SIGKILL) before the step's own SIGKILL lands. Measured on the dev cluster (TorchTitan, 2 nodes × 1
rank): the group exited ``preempted`` 1.8 s after a kill and the controller saw the job end 3.3 s after it; signalled
by step, slurmstepd SIGKILLs the tasks at once, the job ends ``FAILED`` by SIGKILL, seen 0.55 s after the kill.

Undoing (CONT, RESUME, slurmd restart) is the detached helper's
(``workbench.faults.undo``), so it happens even if the notebook dies: each is one
command, a slurmd's restart the one its state directory records. The ``resume``
event of a node's fault has the node's name as ``target`` and ``replica_hit``.
"""

from __future__ import annotations

import signal
from typing import Optional

from workbench.cluster.slurm import statedir
from workbench.cluster.slurm.client import client_env, slurm_cmd
from workbench.errors import FaultError
from workbench.faults import undo as undo_helper
from workbench.faults.kinds import FaultKind

NODE_KINDS = ("node_down", "slurmd_kill")


def inject(cluster, kind: FaultKind, view, seconds: Optional[float], origin: str) -> dict:
    conf = cluster.conf
    current = view.current_job()
    if current is None:
        raise FaultError(f"target: replica {view.replica} has no live Slurm job to {kind.name}")
    attempt, job_id = current
    node = view.node if attempt == view.attempt else None
    if (kind.name in NODE_KINDS or kind.host == "link") and not node:
        node = slurm_cmd(conf, "squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip() or None
    if node and ("," in node or "[" in node):  # a multi-node job: its first node
        node = (slurm_cmd(conf, "scontrol", "show", "hostnames", node).stdout.split() or [None])[0]

    def started_node() -> str:
        """The node a node's fault (or a link's) acts on; FaultError before anything is done if there is none."""
        if not node:
            raise FaultError(f"target: replica {view.replica}'s job {job_id} has not started on a node yet")
        return node

    def run_or_fail(*argv: str) -> None:
        result = slurm_cmd(conf, *argv)
        if result.returncode != 0:
            raise FaultError(f"{kind.name}: `{' '.join(argv)}` failed: {(result.stderr or result.stdout).strip()}")

    if kind.host is not None:
        if kind.host == "link":
            started_node()
        return {**cluster.inject_host(kind, view, seconds, node=node), "job_id": job_id, "node": node}
    env = client_env(conf)
    node_fields = {"target": node, "node": node, "replica_hit": view.replica}  # a node's undo names the node
    if kind.pauses_process:
        duration = _duration(kind, seconds)
        run_or_fail("scancel", "--signal=STOP", job_id)
        undo_helper.later(
            cluster.run_dir,
            kind.name,
            duration,
            argv=["scancel", "--signal=CONT", job_id],
            env=env,
            fields={"target": view.replica, "job_id": job_id},
        )
    elif kind.name == "node_down":
        name, duration = started_node(), _duration(kind, seconds)
        run_or_fail(
            "scontrol",
            "update",
            f"NodeName={name}",
            "State=DOWN",
            f"Reason=workbench fault ({origin}) on replica {view.replica}",
        )
        undo_helper.later(
            cluster.run_dir,
            kind.name,
            duration,
            argv=["scontrol", "update", f"NodeName={name}", "State=RESUME"],
            env=env,
            fields=node_fields,
        )
    elif kind.name == "slurmd_kill":
        name, duration = started_node(), _duration(kind, seconds)
        try:
            slurmd, marker, restart = statedir.recorded_slurmd(conf, name)
        except LookupError as e:
            raise FaultError(f"slurmd_kill: {e}") from None
        if not slurmd.signal(signal.SIGKILL, marker):
            raise FaultError(f"slurmd_kill: node {name}'s slurmd: {slurmd.why_not_ours(marker)}; not signalled")
        undo_helper.later(cluster.run_dir, kind.name, duration, argv=[*restart, name], env=env, fields=node_fields)
    elif kind.signal is not None:
        run_or_fail("scancel", f"--signal={signal.Signals(kind.signal).name[3:]}", f"{job_id}.0")
    else:
        run_or_fail("scancel", f"--signal={signal.Signals(cluster.preempt_signal).name[3:]}", job_id)
    proc = view.live_proc(attempt)
    return {
        "target": view.replica,
        "attempt": attempt,
        "node": node,
        "job_id": job_id,
        "pid": proc.pid if proc else None,
    }


def _duration(kind: FaultKind, seconds: Optional[float]) -> float:
    """How long a fault the helper undoes lasts (``faults.inject`` gives every such kind its seconds); checked
    before the fault is done, which nothing would undo otherwise."""
    if seconds is None:
        raise FaultError(f"seconds: a {kind.name} lasts a number of seconds; none given")
    return seconds
