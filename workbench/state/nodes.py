"""The nodes of a run, as the fold sees them: which process of which replica group runs where.

Part of :class:`~workbench.state.fold.RunState` (``state.nodes``), fed by the same
events. Every process that starts a piece of a replica group writes a
``start`` with its ``node`` (Slurm's node name, or the host), ``address`` (the
one address its listeners bind) and ``task`` (0 for the group's first or only
task; a titan group over N nodes has tasks 0..N-1). A node fault (``node_down``,
``slurmd_kill``) names its ``node``: every group with a part of its current
attempt there is hit, not only the group the fault was aimed at; its undo
(``resume`` with the node as target) brings the node back.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Optional

NODE_FAULTS = ("node_down", "slurmd_kill")


@dataclasses.dataclass
class Part:
    """One process of one attempt of a replica group, on one node."""

    replica: int
    attempt: int
    task: int
    node: str
    address: Optional[str]
    pid: Optional[int]
    proc: Optional[object] = None  # its procs.Proc (identity-checked), when the event carried one


@dataclasses.dataclass
class NodeView:
    name: str
    address: Optional[str] = None
    state: str = "up"  # up | down (a node fault, not yet resumed)
    fault: Optional[str] = None  # the kind that took it down
    health: Optional[dict] = None  # the newest ``node_health`` sample (workbench.controller.nodehealth)

    def as_dict(self) -> dict:
        return {
            "node": self.name,
            "address": self.address,
            "state": self.state,
            "fault": self.fault,
            "health": self.health,
        }


class NodeMap:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.parts: dict[tuple[int, int, int], Part] = {}

    def node(self, name: str) -> NodeView:
        if name not in self.nodes:
            self.nodes[name] = NodeView(name)
        return self.nodes[name]

    def start(self, e: dict, proc=None) -> None:
        node, replica = e.get("node"), e.get("replica")
        if not isinstance(node, str) or not isinstance(replica, int) or isinstance(replica, bool):
            return
        attempt, task, address, pid = e.get("attempt"), e.get("task"), e.get("address"), e.get("pid")
        attempt = attempt if isinstance(attempt, int) else 0
        task = task if isinstance(task, int) else 0
        address = address if isinstance(address, str) else None
        pid = pid if isinstance(pid, int) else None
        self.parts[(replica, attempt, task)] = Part(replica, attempt, task, node, address, pid, proc)
        view = self.node(node)
        view.address = address or view.address

    def procs(self) -> list:
        """The processes of every part other than a group's first (those the fold's views do not hold)."""
        return [p.proc for p in self.parts.values() if p.task > 0 and p.proc is not None]

    def placement(self, replica: int, attempt: int) -> list[Part]:
        """The parts of one attempt of a group, by task."""
        return sorted((p for (r, a, _), p in self.parts.items() if r == replica and a == attempt), key=lambda p: p.task)

    def groups_on(self, node: str, attempts: dict[int, int]) -> list[int]:
        """Replica groups whose current attempt (``attempts``: replica -> attempt) has a part on ``node``."""
        return sorted(
            {p.replica for p in self.parts.values() if p.node == node and attempts.get(p.replica) == p.attempt}
        )

    def fault(self, kind: str, node: str) -> None:
        view = self.node(node)
        view.state, view.fault = "down", kind

    def sampled(self, e: dict) -> None:
        if isinstance(e.get("node"), str):
            skip = ("kind", "node", "run", "source", "pid")
            self.node(e["node"]).health = {k: v for k, v in e.items() if k not in skip}

    def resume(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].state, self.nodes[node].fault = "up", None

    def table(self, attempts: dict[int, int]) -> list[dict]:
        """One row per node: address, state and the parts of current attempts on it (the dashboard's node view)."""
        rows = []
        for name in sorted(self.nodes):
            view = self.nodes[name]
            parts = [p for p in self.parts.values() if p.node == name and attempts.get(p.replica) == p.attempt]
            rows.append(
                {
                    **view.as_dict(),
                    "parts": [
                        {"replica": p.replica, "task": p.task, "pid": p.pid}
                        for p in sorted(parts, key=lambda p: (p.replica, p.task))
                    ],
                }
            )
        return rows


def hit_by(kind: Optional[str], node: Optional[str]) -> bool:
    return kind in NODE_FAULTS and isinstance(node, str)


def spans(parts: Iterable[Part]) -> list[str]:
    """The nodes a group's attempt runs on, in task order."""
    return [p.node for p in parts]
