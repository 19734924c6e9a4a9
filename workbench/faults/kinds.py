"""The one table of fault kinds. Everything that names a fault reads it.

A fault kind says what it does to its target, not how a backend does it:
the spec's validation (``faults[].action``, ``chaos.actions``), the CLI's
``kill --how``, the dashboard's menu, replay, chaos schedules, the run-state
fold (which state a target is in after it), the recovery timeline and goodput
(which faults end a process and so bring the group back as a new attempt) and
the soak's mix are all built from :data:`KINDS`. How a kind is injected is the
backend's business (``Cluster.inject``): a kind with a ``signal`` is, on
every backend, that signal delivered to the target's processes (locally with
``kill(2)``, on Slurm with ``scancel --signal``), so a new signal-shaped fault
is one row here and nothing else.

| kind | target | what happens | undone by |
|---|---|---|---|
| ``kill`` | replica | SIGKILL: dies mid-step, as on a hardware fault | relaunch (new attempt) |
| ``abort`` | replica | SIGABRT: what a failed CUDA device assertion does to a rank | relaunch |
| ``preempt`` | replica | the backend's preemption signal: ends its step, exits preempted | relaunch |
| ``hang`` | replica | SIGSTOP for ``seconds``, then SIGCONT (a detached helper resumes it) | ``resume`` |
| ``node_down`` | replica | its node is set DOWN (Slurm): every job on it fails | node RESUME |
| ``slurmd_kill`` | replica | SIGKILL to its node's slurmd (dev cluster): the node stops answering | slurmd restart |
| ``partition`` | replica | its node's link down for ``seconds`` (dev cluster: nodes in namespaces) | link up |
| ``slow_link`` | replica | a ``tbf`` bandwidth cap on its node's link for ``seconds`` | qdisc deleted |
| ``straggler`` | replica | its processes throttled to a share of one CPU (cgroup ``cpu``) for ``seconds`` | cgroup removed |
| ``freeze`` | replica | its processes frozen (cgroup freezer) for ``seconds``: a hung driver | thawed |
| ``lighthouse_kill`` | lighthouse | SIGKILL to the lighthouse; the controller restarts it | controller |
| ``kill_store_host`` | replica | SIGKILL to the process hosting the group's rendezvous store | relaunch |
| ``kill_rank0`` | replica | SIGKILL to the group's rank 0 | relaunch |
| ``kill_during_checkpoint`` | replica | armed; SIGKILL once the checkpoint writer starts a save | relaunch |
| ``kill_in_allreduce`` | replica | armed; SIGKILL while its peers wait for it inside an all-reduce | relaunch |

Single points. ``process`` names which process of the target a kind hits, as
a field of the trainer's row (``trainers/registry.py``: ``store_host``,
``rank0``, ``checkpoint_writer``, ``collective_rank``); a trainer whose field is None has no such
process, and the kind does not apply to it (:meth:`FaultKind.supported_by`).
A kind with a ``trigger`` is not injected when asked: it is *armed*
(``workbench.faults.armed``) and the run controller injects it when the trigger
event arrives (``"checkpoint"``: the writer's ``checkpoint state=started``;
``"allreduce"``: the group's ``held`` event, as it is about to join an all-reduce
its peers have already entered).

A fault is recorded as one ``fault`` event (``action`` = the kind's name);
The machine-level kinds (``host`` set: cgroups, links, qdiscs) are done by
``workbench.faults.host`` on every backend that can (``needs`` says what a
backend must have, for the one-line refusal elsewhere); a kind that neither
ends nor pauses the process *impairs* it (``impairs``): the group carries on,
slowed or cut off, and ``leaves_quorum`` says whether its peers go on without it.
Its undo, where it has one, as a ``fault`` event with ``action="resume"``
(:data:`RESUME`) and ``resumed`` = the kind.
"""

from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Optional

RESUME = "resume"
ALL_BACKENDS: Optional[tuple[str, ...]] = None


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """One row of the table; see the module docstring.

    ``targets``: ``"replica"`` (a replica group, by index) or ``"lighthouse"``.
    ``ends_process``: the target's process is gone, and the group comes back as
    a new attempt (or a spare). ``pauses_process``: it is stopped for
    ``seconds`` and then carries on as the same process. ``signal``: the
    signal that *is* the fault on every backend (None: the backend does
    something else). ``backends``: the backends that can inject it (None:
    every backend, which is what a signal-shaped kind gets). ``state_after``:
    what the run-state fold calls the target once the fault is recorded.
    ``process``: ``"group"`` (the group's recorded process) or the name of
    the trainer-table field that says which process it is. ``trigger``: the
    event that fires an armed kind (None: injected at once).
    """

    name: str
    targets: str
    ends_process: bool
    pauses_process: bool
    has_duration: bool
    summary: str
    signal: Optional[int] = None
    default_seconds: Optional[float] = None
    backends: Optional[tuple[str, ...]] = ALL_BACKENDS
    state_after: Optional[str] = None
    process: str = "group"
    trigger: Optional[str] = None
    host: Optional[str] = None  # "cgroup" or "link": done by workbench.faults.host
    needs: Optional[str] = None
    leaves_quorum: bool = True

    @property
    def impairs(self) -> bool:
        return not self.ends_process and not self.pauses_process and self.targets == "replica" and self.has_duration

    def supported_on(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends

    def supported_by(self, trainer) -> bool:
        """Whether ``trainer`` (a ``TrainerKind``) has the process this kind hits."""
        return self.process == "group" or getattr(trainer, self.process, None) is not None


KINDS: dict[str, FaultKind] = {
    k.name: k
    for k in (
        FaultKind(
            "kill",
            "replica",
            True,
            False,
            False,
            "SIGKILL: dies mid-step, as on a hardware fault",
            signal=_signal.SIGKILL,
            state_after="dead",
        ),
        FaultKind(
            "abort",
            "replica",
            True,
            False,
            False,
            "SIGABRT: what a failed CUDA device assertion does",
            signal=_signal.SIGABRT,
            state_after="dead",
        ),
        FaultKind(
            "hang",
            "replica",
            False,
            True,
            True,
            "SIGSTOP for `seconds`, then SIGCONT",
            default_seconds=5.0,
            state_after="hung",
        ),
        FaultKind(
            "preempt",
            "replica",
            True,
            False,
            False,
            "preemption signal: the trainer ends its step and exits",
            state_after="dead",
        ),
        FaultKind(
            "node_down",
            "replica",
            True,
            False,
            True,
            "the group's node set DOWN, RESUME after `seconds`",
            default_seconds=10.0,
            backends=("slurm",),
            state_after="dead",
        ),
        FaultKind(
            "slurmd_kill",
            "replica",
            True,
            False,
            True,
            "SIGKILL to the node's slurmd, restarted after `seconds`",
            default_seconds=10.0,
            backends=("slurm",),
            state_after="dead",
        ),
        FaultKind(
            "partition",
            "replica",
            False,
            False,
            True,
            "its node's link down for `seconds`, then up",
            default_seconds=10.0,
            backends=("slurm",),
            state_after="partitioned",
            host="link",
            needs="nodes in network namespaces (the dev Slurm cluster)",
        ),
        FaultKind(
            "slow_link",
            "replica",
            False,
            False,
            True,
            "a tbf bandwidth cap (1 mbit/s) on its node's link",
            default_seconds=10.0,
            backends=("slurm",),
            state_after="slow",
            host="link",
            needs="nodes in network namespaces (the dev Slurm cluster)",
            leaves_quorum=False,
        ),
        FaultKind(
            "straggler",
            "replica",
            False,
            False,
            True,
            "its processes held to a quarter of one CPU (cgroup cpu)",
            default_seconds=10.0,
            state_after="slow",
            host="cgroup",
            leaves_quorum=False,
        ),
        FaultKind(
            "freeze",
            "replica",
            False,
            True,
            True,
            "its processes frozen (cgroup freezer), thawed after `seconds`",
            default_seconds=10.0,
            state_after="hung",
            host="cgroup",
        ),
        FaultKind(
            "lighthouse_kill",
            "lighthouse",
            False,
            False,
            False,
            "SIGKILL to the lighthouse; the controller restarts it",
        ),
        FaultKind(
            "kill_store_host",
            "replica",
            True,
            False,
            False,
            "SIGKILL to the rank hosting the group's rendezvous store",
            signal=_signal.SIGKILL,
            backends=("local",),
            state_after="dead",
            process="store_host",
        ),
        FaultKind(
            "kill_rank0",
            "replica",
            True,
            False,
            False,
            "SIGKILL to the group's rank 0",
            signal=_signal.SIGKILL,
            backends=("local",),
            state_after="dead",
            process="rank0",
        ),
        FaultKind(
            "kill_during_checkpoint",
            "replica",
            True,
            False,
            False,
            "armed: SIGKILL to the checkpoint writer once it starts a save",
            signal=_signal.SIGKILL,
            state_after="dead",
            process="checkpoint_writer",
            trigger="checkpoint",
        ),
        FaultKind(
            "kill_in_allreduce",
            "replica",
            True,
            False,
            False,
            "armed: SIGKILL to the group as it is about to join an all-reduce, its peers already inside",
            signal=_signal.SIGKILL,
            state_after="dead",
            process="collective_rank",
            trigger="allreduce",
        ),
    )
}


def kind(name: str) -> Optional[FaultKind]:
    return KINDS.get(name)


def names(backend: Optional[str] = None) -> list[str]:
    """Every kind's name, or those ``backend`` can inject, in table order."""
    return [k.name for k in KINDS.values() if backend is None or k.supported_on(backend)]


STRAGGLER_SHARE = 0.25


def ending_kinds() -> frozenset[str]:
    """Kinds after which the target group comes back as a new attempt."""
    return frozenset(k.name for k in KINDS.values() if k.ends_process)


def names_for(trainer, backend: Optional[str] = None) -> list[str]:
    """The kinds that apply to ``trainer`` (a ``TrainerKind``) and, given it, ``backend``."""
    return [n for n in names(backend) if KINDS[n].supported_by(trainer)]


def require(name: str, backend: Optional[str] = None) -> FaultKind:
    """The kind named ``name``, injectable on ``backend``; ValueError naming the allowed ones otherwise."""
    k = KINDS.get(name)
    if k is not None and backend is not None and not k.supported_on(backend) and k.needs:
        raise ValueError(f"{name!r} needs {k.needs}; cluster {backend} has none; allowed: {', '.join(names(backend))}")
    if k is None or (backend is not None and not k.supported_on(backend)):
        where = f" on cluster {backend}" if backend else ""
        raise ValueError(f"{name!r} is not a fault kind{where}; allowed: {', '.join(names(backend))}")
    return k
