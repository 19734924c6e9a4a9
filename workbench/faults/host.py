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

Whose fault. Several runs share the machine (and the dev cluster's nodes),
so a cleanup undoes only what belongs to the run it cleans up, or to runs
that have ended. Before a fault makes anything it writes an owner record,
``RECORD_DIR/<object>.json`` (``{run_id, run_dir, kind, node}``; the object
is the cgroup's name, or ``wbn-<node>.<kind>`` for a link), and its undo
removes the record after it: a fault object that exists always has its
record, unless something other than a run made it. A cgroup's name also
carries its run's id, matched whole (:func:`cgroups`). :func:`release_run`
undoes its run's records and cgroups, and a link it is told of only when no
other run's record holds that link; :func:`sweep` undoes an object whose
record's run has ended (``ended(run_dir)``, which the caller answers:
``cluster down`` asks the run's directory) or that has no record, and leaves
the rest. Two runs never hold the same fault on one link: :func:`cut_link`
refuses the second, naming the first. ``RECORD_DIR`` is on ``/run`` (a tmpfs,
root's, like the cgroups and links it describes: a reboot clears all three).

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
import json
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Optional, Union

PREFIX = "wbn-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
CONTROLLERS = {"straggler": "cpu", "freeze": "freezer"}
LINK_KINDS = ("partition", "slow_link")
TBF = ("rate", "1mbit", "burst", "32kbit", "latency", "400ms")
RECORD_DIR = Path("/run/wbn-faults")
Owner = Union[str, os.PathLike]  # the run directory of the run that makes a fault


class HostFaultError(RuntimeError):
    """The machine refused (no cgroup v1 controller, no namespace); the message says what."""


def cgroup_name(run_id: str, replica: int, kind: str) -> str:
    return f"{PREFIX}{run_id}-r{replica}-{kind}"


def link_object(node: str, kind: str) -> str:
    """The name of a link fault's owner record (a link has no name of its own per fault)."""
    return f"{PREFIX}{node}.{kind}"


def _record_path(name: str) -> Path:
    return RECORD_DIR / f"{name}.json"


def write_record(name: str, owner: Owner, kind: str, node: Optional[str] = None, claim: bool = False) -> str:
    """Record that the run in directory ``owner`` holds fault object ``name``; returns the record's path.
    ``claim``: FileExistsError if a record is there already (``link``: atomic, two runs cannot both win)."""
    RECORD_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = _record_path(name)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    record = {"run_id": Path(owner).name, "run_dir": str(Path(owner).resolve()), "kind": kind, "node": node}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    if not claim:
        os.replace(tmp, path)
        return str(path)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return str(path)


def records() -> dict[str, dict]:
    """Every owner record, by object name; unreadable ones left out."""
    out: dict[str, dict] = {}
    try:
        paths = sorted(RECORD_DIR.glob("*.json"))
    except OSError:
        return out
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("run_id"), str) and isinstance(record.get("kind"), str):
            out[path.name[: -len(".json")]] = record
    return out


def _drop_record(name: str) -> None:
    try:
        _record_path(name).unlink()
    except FileNotFoundError:
        pass


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
    record: Optional[str] = None  # the owner record, removed after the undo

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
        if self.record:
            lines.append(f"rm -f {shlex.quote(self.record)}")
        return "\n".join(f"{line} 2>/dev/null" for line in lines) + "\ntrue\n"

    def undo_argv(self) -> list[str]:
        return ["sh", "-c", self.undo_script()]

    def undo(self) -> None:
        subprocess.run(self.undo_argv(), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def confine(kind: str, name: str, pids: Iterable[int], share: float = 0.25, owner: Optional[Owner] = None) -> Made:
    """Move ``pids`` into a new cgroup ``name`` that throttles (``straggler``) or freezes (``freeze``) them;
    ``owner``: the run directory of the run it is for (its owner record; module docstring).

    On failure undoes what it did and raises :class:`HostFaultError`.
    """
    controller = CONTROLLERS[kind]
    base = CGROUP_ROOT / controller
    if not (base / "cgroup.procs").exists():
        raise HostFaultError(f"{kind}: no cgroup v1 {controller} controller at {base}")
    cgroup = base / name
    made = Made(kind, cgroup=str(cgroup))
    try:
        if owner is not None:
            made.record = write_record(name, owner, kind)
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


def cut_link(kind: str, node: str, owner: Optional[Owner] = None) -> Made:
    """``partition``: the node's veth down; ``slow_link``: a ``tbf`` cap on both of its ends. ``owner``:
    the run directory of the run it is for; refused while another run holds this fault on this node."""
    host, ns = f"{PREFIX}{node}", f"{PREFIX}{node}"
    inside = f"{PREFIX}{node}p"
    if not Path(f"/run/netns/{ns}").exists() or not Path(f"/sys/class/net/{host}").exists():
        raise HostFaultError(f"{kind}: node {node} has no network namespace {ns} (the dev cluster's `up` makes one)")
    name, made = link_object(node, kind), Made(kind)
    try:
        if owner is not None:
            made.record = write_record(name, owner, kind, node, claim=True)
        elif name in records():
            raise FileExistsError
    except FileExistsError:
        held = records().get(name)
        if owner is None or held is None or held["run_id"] != Path(owner).name:
            raise HostFaultError(
                f"{kind}: node {node}'s link already has a {kind} of run {(held or {}).get('run_id', '?')}; "
                "a run never undoes another run's fault, so it is not cut twice"
            ) from None
        made.record = str(_record_path(name))  # this run's own second fault of the kind there
    except OSError as e:
        raise HostFaultError(f"{kind}: node {node}: owner record: {e.strerror or e}") from None
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
    """The undo of a link fault on ``node``, for a run that stops mid-fault (its owner record goes too)."""
    host, ns, inside = f"{PREFIX}{node}", f"{PREFIX}{node}", f"{PREFIX}{node}p"
    record = str(_record_path(link_object(node, kind)))
    if kind == "partition":
        return Made(kind, commands=[["ip", "link", "set", host, "up"]], record=record)
    return Made(
        kind,
        commands=[["tc", "qdisc", "del", "dev", host, "root"], ["tc", "-n", ns, "qdisc", "del", "dev", inside, "root"]],
        record=record,
    )


def cgroups(run_id: Optional[str] = None) -> list[str]:
    """Every cgroup a fault made (of run ``run_id``, its whole id in the name, or of any run), as absolute
    directories."""
    kinds = "|".join(CONTROLLERS)
    pattern = re.compile(rf"{re.escape(PREFIX)}{re.escape(run_id)}-r\d+-({kinds})\Z" if run_id else re.escape(PREFIX))
    out = []
    for controller in sorted(set(CONTROLLERS.values())):
        base = CGROUP_ROOT / controller
        if base.is_dir():
            out += [str(p) for p in sorted(base.iterdir()) if p.is_dir() and pattern.match(p.name)]
    return out


def cgroup_undo(path: str) -> Made:
    """Thaw, move every process to the controller's root, remove (and its owner record): for a cgroup
    whose origins are lost."""
    kind = "freeze" if Path(path, "freezer.state").exists() else "straggler"
    return Made(kind, cgroup=path, record=str(_record_path(Path(path).name)))


def release_cgroup(path: str) -> None:
    cgroup_undo(path).undo()


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
    """Undo what run ``run_id``'s faults still hold: its cgroups (by name), what its owner records name,
    and ``links`` ((kind, node) each) unless another run's record holds that link now."""
    held = records()
    mine = {name: r for name, r in held.items() if r["run_id"] == run_id}
    paths = cgroups(run_id)
    paths += [
        str(CGROUP_ROOT / CONTROLLERS[r["kind"]] / name)
        for name, r in mine.items()
        if r["kind"] in CONTROLLERS and (CGROUP_ROOT / CONTROLLERS[r["kind"]] / name).is_dir()
    ]
    undone = []
    for path in dict.fromkeys(paths):
        release_cgroup(path)
        undone.append(path)
    for kind, node in dict.fromkeys([*((r["kind"], r["node"]) for r in mine.values() if r.get("node")), *links]):
        record = held.get(link_object(node, kind))
        if record is not None and record["run_id"] != run_id:
            continue  # another run's fault on this link now
        link_undo(kind, node).undo()
        undone.append(f"{kind}:{node}")
    for name in mine:  # the records whose object was gone already
        _drop_record(name)
    return undone


def _run_dir_gone(run_dir: str) -> bool:
    return not Path(run_dir).is_dir()


def _left(ended: Callable[[str], bool]) -> tuple[list[tuple[str, Made]], list[str]]:
    """What a sweep undoes: (label, its undo) of each fault object that no live run holds; and the
    records of ended runs. The records are read after the objects are listed: a fault writes its
    record before it makes its object, so an object listed has its record read."""
    found = [(path, Path(path).name, cgroup_undo(path)) for path in cgroups()]
    for link in qdiscs():
        node = link[len(PREFIX) :]
        found.append((f"tbf:{link}", link_object(node, "slow_link"), link_undo("slow_link", node)))
    for link in links_down():
        node = link[len(PREFIX) :]
        if link != f"{PREFIX}br":
            found.append((f"down:{link}", link_object(node, "partition"), link_undo("partition", node)))
    held, answers = records(), {}
    for record in held.values():
        run_dir = str(record.get("run_dir"))
        if run_dir not in answers:
            answers[run_dir] = ended(run_dir)
    dead = [name for name, record in held.items() if answers[str(record.get("run_dir"))]]
    return [(label, undo) for label, name, undo in found if name not in held or name in dead], dead


def sweep(ended: Callable[[str], bool] = _run_dir_gone) -> list[str]:
    """Undo every fault object that no live run holds (``cluster down``): cgroups, ``tbf`` qdiscs and
    downed links with the prefix whose owner record names a run that has ended (``ended(run_dir)``; by
    default: its directory is gone) or that have no record. Another run's faults stay."""
    left, dead = _left(ended)
    for _, undo in left:
        undo.undo()
    for name in dead:  # records of ended runs whose object was gone already
        _drop_record(name)
    return [label for label, _ in left]


def leftovers(ended: Callable[[str], bool] = _run_dir_gone) -> list[str]:
    """What :func:`sweep` would undo, named; empty when no fault outlived its run."""
    return [label for label, _ in _left(ended)[0]]
