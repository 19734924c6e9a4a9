"""Pre-submit checks of a spec against a Slurm cluster; nothing is queued.

``sbatch --test-only`` with the options submitit would use checks partition,
account, qos, time and node counts; the rest (is a controller up, is the
lighthouse address dialable, may Slurm requeue a replica group) is checked
here first, so each refusal names the spec field.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Optional

from workbench.cluster.slurm.client import executor_parameters, resolve_conf, slurm_cmd
from workbench.errors import SpecError
from workbench.trainers.registry import trainer_kind


def validate(spec) -> None:
    """Raise SpecError, naming the field, when the cluster would refuse or misrun this spec.

    Pins ``spec.slurm.conf``. Uses ``sbatch --test-only`` with the same
    options submitit would use, which checks partition, account, qos, time
    and node counts without queueing anything.
    """
    conf = resolve_conf(spec)
    if conf and not Path(conf).is_file():
        raise SpecError(f"slurm.conf: {conf!r} does not exist")
    where = f"SLURM_CONF={conf}" if conf else "the default slurm.conf"
    ping = slurm_cmd(conf, "scontrol", "ping", timeout=20)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        hint = " (start the local one with `workbench cluster up`)" if not conf else ""
        raise SpecError(
            f"cluster: slurm: no Slurm controller answers ({where}){hint}: {(ping.stderr or ping.stdout).strip()}"
        )
    elastic = trainer_kind(spec.trainer).elastic
    s = spec.slurm
    tasks = trainer_kind(spec.trainer).slurm_tasks
    if tasks is not None and s.nodes * s.tasks_per_node != tasks:
        raise SpecError(
            f"slurm.nodes x slurm.tasks_per_node: {spec.trainer} runs {tasks} process(es) per job; "
            f"got {s.nodes} x {s.tasks_per_node}, allowed: a product of {tasks}"
        )
    try:
        trainer_kind(spec.trainer).check_job(spec, s.nodes * s.tasks_per_node)
    except ValueError as e:
        raise SpecError(str(e)) from None
    if elastic and s.requeue:
        raise SpecError(
            "slurm.requeue: replica groups are resubmitted by the controller as the next attempt "
            "(a Slurm requeue would re-run the same attempt); allowed: false"
        )
    if elastic and spec.lighthouse.bind_host in ("0.0.0.0", "::", ""):
        raise SpecError(
            f"lighthouse.bind_host: {spec.lighthouse.bind_host!r} is not an address jobs can dial; "
            "give the submit host's address on the cluster network (127.0.0.1 for the dev cluster)"
        )
    if s.partition:
        listed = slurm_cmd(conf, "sinfo", "-h", "-o", "%R")
        partitions = sorted(set(listed.stdout.split()))
        if listed.returncode == 0 and s.partition not in partitions:
            raise SpecError(f"slurm.partition: {s.partition!r} does not exist; allowed: {', '.join(partitions)}")
    if s.account:
        accounts = _user_accounts(conf)
        if accounts is not None and s.account.lower() not in accounts:
            raise SpecError(
                f"slurm.account: {s.account!r} is not one of your accounts; "
                f"allowed: {', '.join(sorted(accounts)) or '(none)'}"
            )
    if s.qos:
        listed = slurm_cmd(conf, "sacctmgr", "-n", "-P", "show", "qos", "format=Name")
        qos = {q.strip().lower() for q in listed.stdout.split() if q.strip()}
        if listed.returncode == 0 and s.qos.lower() not in qos:
            raise SpecError(f"slurm.qos: {s.qos!r} does not exist; allowed: {', '.join(sorted(qos)) or '(none)'}")
    _test_only(spec, conf, elastic)
    spec.slurm.conf = conf


def _user_accounts(conf: Optional[str]) -> Optional[set[str]]:
    """The submitting user's accounts from sacctmgr, or None where accounting cannot say."""
    out = slurm_cmd(conf, "sacctmgr", "-n", "-P", "show", "associations", f"user={getpass.getuser()}", "format=Account")
    if out.returncode != 0:
        return None
    return {a.strip().lower() for a in out.stdout.split() if a.strip()}


_REFUSALS = (
    ("partition", "slurm.partition"),
    ("account", "slurm.account"),
    ("qos", "slurm.qos"),
    ("time limit", "slurm.time_min"),
    ("node count", "slurm.nodes"),
    ("node configuration", "slurm.nodes"),
    ("gres", "slurm.gpus_per_node"),
    ("cpu count", "slurm.cpus_per_task"),
)


def _test_only(spec, conf: Optional[str], elastic: bool) -> None:
    params = executor_parameters(spec, elastic)
    argv = [
        "sbatch",
        "--test-only",
        f"--time={params['time']}",
        f"--nodes={params['nodes']}",
        f"--ntasks-per-node={params['ntasks_per_node']}",
        f"--cpus-per-task={params['cpus_per_task']}",
    ]
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
