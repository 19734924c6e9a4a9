"""Faults done to the machine, not by a signal: cgroup v1 ``cpu`` and ``freezer``, a node's link, ``tbf``.

| kind | what is made | undone by |
|---|---|---|
| ``straggler`` | cgroup ``cpu/wbn-<run>-r<N>-straggler``, ``cfs_quota_us`` = share × ``cfs_period_us`` | procs moved back, rmdir |
| ``freeze`` | cgroup ``freezer/wbn-<run>-r<N>-freeze``, ``FROZEN`` | ``THAWED``, procs moved back, rmdir |
| ``partition`` | the node's veth (head side ``wbn-<node>``) set down | set up |
| ``slow_link`` | a root ``tbf`` on both ends of the node's veth | qdisc deleted |

Every name starts with :data:`PREFIX` (the dev cluster's, ``wbn-``), which
the workbench owns, so whatever a fault made is found by name when nothing
else remembers it: :func:`release_run` (the controller's shutdown, ``Run.stop``
of a run whose controller is gone) and :func:`sweep` (``cluster down``).

Each fault's undo is a shell script (:func:`Made.undo_argv`) handed to the
detached undo helper (``workbench.faults.undo``): it runs before the helper imports
the package (seconds on a busy host), so a 10 s freeze lasts 10 s. Each moved
process goes back to the cgroup it came from (read from ``/proc/<pid>/cgroup``
before the move); a process that appeared inside the fault's cgroup goes to
the root. The cgroup v1 ``cpu`` throttle applies to whole processes (every
thread: ``cgroup.procs``), so a group's share is of one CPU for all its
threads together, which is what a slow or oversubscribed node is.

Imports only the standard library: the undo helper's script and ``cluster
down`` run it without torch.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path
from typing import Iterable, Optional

PREFIX = "wbn-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
CONTROLLERS = {"straggler": "cpu", "freeze": "freezer"}
LINK_KINDS = ("partition", "slow_link")
TBF = ("rate", "1mbit", "burst", "32kbit", "latency", "400ms")


class HostFaultError(RuntimeError):
    """The machine refused (no cgroup v1 controller, no namespace); the message says what."""


def cgroup_name(run_id: str, replica: int, kind: str) -> str:
    return f"{PREFIX}{run_id}-r{replica}-{kind}"


def _origin(pid: int, controller: str) -> str:
    """The cgroup path ``pid`` is in for ``controller`` (v1), e.g. ``/`` or ``/slurm/uid_0/job_3``."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    return "/"


@dataclasses.dataclass
class Made:
    """What one fault made, enough to undo it from a shell."""

    kind: str
    cgroup: Optional[str] = None  # absolute directory
    origins: dict = dataclasses.field(default_factory=dict)  # pid -> absolute cgroup dir it came from
    commands: list = dataclasses.field(default_factory=list)  # argv lists that undo a link fault

    def undo_script(self) -> str:
        lines = []
        if self.cgroup:
            g = shlex.quote(self.cgroup)
            root = shlex.quote(str(Path(self.cgroup).parent))
            if self.kind == "freeze":
                lines.append(f"echo THAWED > {g}/freezer.state")
            for pid, back in self.origins.items():
                lines.append(f"echo {int(pid)} > {shlex.quote(back)}/cgroup.procs")
            lines.append(f"for p in $(cat {g}/cgroup.procs); do echo $p > {root}/cgroup.procs; done")
            lines.append(f"rmdir {g}")
        lines += [shlex.join(argv) for argv in self.commands]
        return "\n".join(f"{line} 2>/dev/null" for line in lines) + "\ntrue\n"

    def undo_argv(self) -> list[str]:
        return ["sh", "-c", self.undo_script()]

    def undo(self) -> None:
        subprocess.run(self.undo_argv(), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def confine(kind: str, name: str, pids: Iterable[int], share: float = 0.25) -> Made:
    """Move ``pids`` into a new cgroup ``name`` that throttles (``straggler``) or freezes (``freeze``) them.

    On failure undoes what it did and raises :class:`HostFaultError`.
    """
    controller = CONTROLLERS[kind]
    base = CGROUP_ROOT / controller
    if not (base / "cgroup.procs").exists():
        raise HostFaultError(f"{kind}: no cgroup v1 {controller} controller at {base}")
    cgroup = base / name
    made = Made(kind, cgroup=str(cgroup))
    try:
        os.makedirs(cgroup)
        if kind == "straggler":
            quota = max(1000, int(CPU_PERIOD_US * share))
            (cgroup / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (cgroup / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in pids:
            try:
                back = str(base) + _origin(pid, controller).rstrip("/")
                (cgroup / "cgroup.procs").write_text(str(pid))
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited meanwhile
            made.origins[pid] = back or str(base)
        if kind == "freeze":
            (cgroup / "freezer.state").write_text("FROZEN")
    except OSError as e:
        made.undo()
        raise HostFaultError(f"{kind}: cgroup {made.cgroup}: {e.strerror or e}") from None
    return made


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    if r.returncode:
        raise HostFaultError(f"`{shlex.join(argv)}` failed: {(r.stderr or r.stdout).strip()}")


def cut_link(kind: str, node: str) -> Made:
    """``partition``: the node's veth down; ``slow_link``: a ``tbf`` cap on both of its ends."""
    host, ns = f"{PREFIX}{node}", f"{PREFIX}{node}"
    inside = f"{PREFIX}{node}p"
    if not Path(f"/run/netns/{ns}").exists() or not Path(f"/sys/class/net/{host}").exists():
        raise HostFaultError(f"{kind}: node {node} has no network namespace {ns} (the dev cluster's `up` makes one)")
    made = Made(kind)
    try:
        if kind == "partition":
            made.commands.append(["ip", "link", "set", host, "up"])
            _run(["ip", "link", "set", host, "down"])
        else:
            made.commands += [
                ["tc", "qdisc", "del", "dev", host, "root"],
                ["tc", "-n", ns, "qdisc", "del", "dev", inside, "root"],
            ]
            _run(["tc", "qdisc", "replace", "dev", host, "root", "tbf", *TBF])
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", inside, "root", "tbf", *TBF])
    except HostFaultError:
        made.undo()
        raise
    return made


def link_undo(kind: str, node: str) -> Made:
    """The undo of a link fault on ``node``, for a run that stops mid-fault."""
    host, ns, inside = f"{PREFIX}{node}", f"{PREFIX}{node}", f"{PREFIX}{node}p"
    if kind == "partition":
        return Made(kind, commands=[["ip", "link", "set", host, "up"]])
    return Made(
        kind,
        commands=[["tc", "qdisc", "del", "dev", host, "root"], ["tc", "-n", ns, "qdisc", "del", "dev", inside, "root"]],
    )


def cgroups(run_id: Optional[str] = None) -> list[str]:
    """Every cgroup a fault made (of run ``run_id``, or of any run), as absolute directories."""
    stem = PREFIX if run_id is None else f"{PREFIX}{run_id}-"
    out = []
    for controller in sorted(set(CONTROLLERS.values())):
        base = CGROUP_ROOT / controller
        if base.is_dir():
            out += [str(p) for p in sorted(base.iterdir()) if p.is_dir() and p.name.startswith(stem)]
    return out


def release_cgroup(path: str) -> None:
    """Thaw, move every process to the controller's root, remove: for a cgroup whose origins are lost."""
    kind = "freeze" if Path(path, "freezer.state").exists() else "straggler"
    Made(kind, cgroup=path).undo()


def qdiscs() -> list[str]:
    """Head-side links with :data:`PREFIX` that carry a ``tbf`` (namespaced ends go with ``cluster down``)."""
    r = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, timeout=20)
    return sorted(
        {
            line.split(" dev ")[1].split()[0]
            for line in r.stdout.splitlines()
            if line.startswith("qdisc tbf") and f" dev {PREFIX}" in line
        }
    )


def links_down() -> list[str]:
    """Head-side veths with :data:`PREFIX` that are administratively down."""
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=20)
    out = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        name = parts[1].strip().split("@")[0] if len(parts) > 2 else ""
        flags = parts[2].split(">")[0] if len(parts) > 2 else ""
        if name.startswith(PREFIX) and not name.endswith("p") and "UP" not in flags.lstrip(" <").split(","):
            out.append(name)
    return out


def release_run(run_id: str, links: Iterable[tuple[str, str]] = ()) -> list[str]:
    """Undo what run ``run_id``'s faults still hold: its cgroups (by name), and ``links`` ((kind, node) each)."""
    undone = []
    for path in cgroups(run_id):
        release_cgroup(path)
        undone.append(path)
    for kind, node in links:
        link_undo(kind, node).undo()
        undone.append(f"{kind}:{node}")
    return undone


def sweep() -> list[str]:
    """Undo every fault any run left (``cluster down``): cgroups, ``tbf`` qdiscs and downed links with the prefix."""
    undone = []
    for path in cgroups():
        release_cgroup(path)
        undone.append(path)
    for link in qdiscs():
        subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], capture_output=True, timeout=20)
        undone.append(f"tbf:{link}")
    for link in links_down():
        if link != f"{PREFIX}br":
            subprocess.run(["ip", "link", "set", link, "up"], capture_output=True, timeout=20)
            undone.append(f"down:{link}")
    return undone


def leftovers() -> list[str]:
    """What :func:`sweep` would undo, named; empty when no fault outlived itself."""
    return cgroups() + [f"tbf:{x}" for x in qdiscs()] + [f"down:{x}" for x in links_down() if x != f"{PREFIX}br"]
