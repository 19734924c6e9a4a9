"""Where a group is stuck: the stacks of every process of a replica group (or of the controller), by py-spy.

Who asks: the hang watchdog, when it reports a ``hang`` (the controller writes the ``stacks`` event),
and a person, through ``Run.stacks``, ``workbench stacks RUN [--replica R | --controller]`` or the
dashboard's button (a control writer writes it, as it writes a fault: ``control-<pid>.jsonl``).
Each sample is one file, ``<run_dir>/stacks/r<R>.a<A>.<UTC time>.txt`` (``controller.<UTC time>.txt``),
and one ``stacks`` event naming it, with each process's ``where``: the innermost frame of the trainer's
own code, torchft's, torchtitan's or MaxText's (:data:`OWN_CODE`), and ``innermost``, the innermost frame
of all (the controller's ``where`` is in the workbench's code).

Which processes: the group's current attempt as the fold records it (``ReplicaView.live_proc``) and
every process it started (TorchTitan's ranks, MaxText's interpreter: ``Proc.descendants``). Reading a
process's memory is as intrusive as signalling it, so each must prove it is the run's first
(``Proc.why_not_ours`` with the run's marker); one that does not is named in ``error``, not read.
py-spy runs on this host: a process on another node (a Slurm job's) is named in ``error`` too.

How: ``py-spy dump --json`` per process, the processes of a group at once, each bounded by
:data:`TIMEOUT_S`. ``--native`` (C/C++ frames too: gloo's wait under an all-reduce) pauses the process
with ptrace, which fails on a process that is already stopped (a ``hang`` fault's SIGSTOP: py-spy
0.4.3 says "Failed to suspend process: unexpected waitpid result PtraceEvent(..., SIGSTOP, ...)"), so a
stopped process is read ``--nonblocking`` (it does not run: what is read is as consistent as a paused
read, and it stays stopped). A running process whose ``--native`` dump fails is dumped again without it.
Measured here (2 shared cores, load 1.8): a running torchft-lite group 0.5-0.65 s (``--native``), a stopped one
0.02 s (``--nonblocking``); a two-rank TorchTitan group 1.0 s (its ranks about 1 s each, at once).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Union

import psutil

from workbench.cluster.procs import Marker
from workbench.events.writer import EventWriter
from workbench.faults.inject import control_writer
from workbench.run.rank_pids import recorded_ranks
from workbench.state.fold import RunState

STACKS_DIR = "stacks"
TIMEOUT_S = 10.0  # per process, every attempt of a dump together
OWN_CODE = ("/workbench/trainers/", "/torchft/", "/torchtitan/", "/maxtext/")  # a frame here: where a group is
CONTROLLER_CODE = ("/workbench/",)
CONTROLLER = "controller"
ORIGINS = ("watchdog", "cli", "api", "button")


@dataclasses.dataclass
class Sample:
    """One process's dump: py-spy's threads (innermost frame first), or why there are none."""

    pid: int
    rank: Optional[int] = None
    own: tuple = OWN_CODE
    threads: list = dataclasses.field(default_factory=list)
    mode: str = ""  # the py-spy flags that worked: "--native", "" or "--nonblocking"
    stopped: bool = False
    error: Optional[str] = None
    seconds: float = 0.0

    def record(self) -> dict:
        where, innermost, thread = locate(self.threads, self.own)
        out = {"pid": self.pid, "rank": self.rank, "where": where, "innermost": innermost, "thread": thread}
        if self.error:
            out["error"] = self.error
        return out


def py_spy() -> Optional[str]:
    """The py-spy executable: beside this interpreter (the run's venv), else on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def is_stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP) or traced (``T``/``t`` in ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _py_spy_error(stderr: str) -> str:
    """py-spy's error in one line: its ``Error:`` line and the causes, without the Rust backtrace."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    keep = [ln for ln in lines if ln.startswith("Error:") or (ln[:1].isdigit() and ": " in ln[:4])]
    return " ".join(keep) or (lines[0] if lines else "py-spy failed")


def dump(pid: int, timeout: float = TIMEOUT_S) -> Sample:
    """``py-spy dump`` of ``pid`` (see the module docstring for the modes tried)."""
    t0 = time.monotonic()
    sample = Sample(pid, stopped=is_stopped(pid))
    exe = py_spy()
    if exe is None:
        sample.error = "py-spy is not installed (pip install py-spy)"
        return sample
    modes = ["--nonblocking"] if sample.stopped else ["--native", "", "--nonblocking"]
    errors = []
    for mode in modes:
        left = timeout - (time.monotonic() - t0)
        if left <= 0:
            errors.append(f"no time left for {mode or 'a blocking dump'}")
            break
        argv = [exe, "dump", "--pid", str(pid), "--json", "--full-filenames", *([mode] if mode else [])]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            errors.append(f"py-spy {mode or 'dump'} took over {timeout:g} s")
            break
        if r.returncode == 0:
            try:
                sample.threads, sample.mode = json.loads(r.stdout), mode
                break
            except json.JSONDecodeError as e:
                errors.append(f"py-spy {mode or 'dump'}: unreadable output ({e})")
                continue
        errors.append(f"py-spy {mode or 'dump'}: {_py_spy_error(r.stderr)}")
    if not sample.threads:
        sample.error = f"pid {pid}: " + "; ".join(errors)
    sample.seconds = round(time.monotonic() - t0, 3)
    return sample


def short_path(filename: str) -> str:
    """A frame's file as a reader knows it: from ``workbench/``, after ``site-packages/``, else its name."""
    for anchor, keep in (("/workbench/", True), ("/site-packages/", False), ("/dist-packages/", False)):
        i = filename.rfind(anchor)
        if i >= 0:
            return filename[i + 1 :] if keep else filename[i + len(anchor) :]
    return filename.rsplit("/", 1)[-1]


def frame_text(frame: dict) -> str:
    """``path:line in function`` (a native frame has no line)."""
    line = frame.get("line") or 0
    return f"{short_path(frame.get('filename') or '?')}{f':{line}' if line else ''} in {frame.get('name') or '?'}"


def is_own(frame: dict, own: tuple = OWN_CODE) -> bool:
    return any(part in (frame.get("filename") or "") for part in own)


def innermost(frames: list) -> Optional[str]:
    """The innermost frame with a name (a native frame py-spy could not symbolize is an address)."""
    named = next((f for f in frames if not str(f.get("name") or "0x").startswith("0x")), None)
    return frame_text(named) if named is not None else None


def locate(threads: list, own: tuple = OWN_CODE) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """(where, innermost, thread): the innermost frame under ``own`` and the innermost frame of all, in the
    main thread if it has one under ``own``, else in the first thread that has one. A Python frame before a
    native one: a rank waiting inside torchft's Rust extension (a condition variable's wait) is where its
    Python called it (``manager.py:LINE in should_commit``), not at the extension's symbol."""
    ordered = sorted(threads, key=lambda t: t.get("thread_name") != "MainThread")
    for t in ordered:
        frames = t.get("frames") or []
        mine = next((f for f in frames if is_own(f, own) and f.get("line")), None)
        mine = mine or next((f for f in frames if is_own(f, own)), None)
        if mine is not None:
            return frame_text(mine), innermost(frames), t.get("thread_name")
    first = next((t for t in ordered if t.get("frames")), None)
    return None, (innermost(first["frames"]) if first else None), (first or {}).get("thread_name")


def rank_of(pid: int, recorded: Optional[dict] = None) -> Optional[int]:
    """The rank a process is: as its job recorded it (``recorded``: pid -> rank, :mod:`.rank_pids`; a rank
    forked warm shows its job's environment in ``/proc``), else ``RANK`` in its environment (the ranks of a
    job that records none: titan-restart's, exec'd), if any."""
    if recorded and pid in recorded:
        return recorded[pid]
    try:
        value = psutil.Process(pid).environ().get("RANK")
    except (psutil.Error, OSError):
        return None
    return int(value) if value is not None and value.isdigit() else None


def group_processes(
    run_state: RunState, replica: int, marker: Optional[Marker], run_dir
) -> tuple[list, list[str], int]:
    """([(Proc, rank)], why some could not be read, attempt) of ``replica``'s current attempt: its process
    and every process it started, each proven the run's."""
    view = run_state.replicas.get(replica)
    if view is None:
        return [], [f"replica {replica} has not started"], 0
    proc = view.live_proc()
    if proc is None:
        return [], [f"replica {replica} attempt {view.attempt} has no live process"], view.attempt
    why = proc.why_not_ours(marker)
    if why is not None:
        return [], [why], view.attempt
    recorded = recorded_ranks(run_dir, replica, view.attempt)
    found, errors = [(proc, rank_of(proc.pid, recorded))], []
    for child in proc.descendants():
        why = child.why_not_ours(marker)
        if why is None:
            found.append((child, rank_of(child.pid, recorded)))
        elif "has exited" not in why:
            errors.append(why)
    return found, errors, view.attempt


def controller_processes(run_state: RunState, marker: Optional[Marker]) -> tuple[list, list[str]]:
    proc = run_state.controller
    if proc is None:
        return [], ["the run has no recorded controller"]
    why = proc.why_not_ours(marker)
    return ([], [why]) if why is not None else ([(proc, None)], [])


def sample(
    run_dir: Union[str, os.PathLike],
    writer: EventWriter,
    target: Union[int, str],
    processes: list,
    origin: str,
    attempt: Optional[int] = None,
    errors: Optional[list] = None,
    timeout: float = TIMEOUT_S,
) -> Optional[dict]:
    """Dump ``processes`` (``[(Proc, rank)]``) at once, write the file, emit the ``stacks`` event (returned)."""
    t = time.time()
    samples: list[Sample] = []
    if processes:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(processes))) as pool:
            samples = list(pool.map(lambda pr: dump(pr[0].pid, timeout), processes))
        for s, (_, rank) in zip(samples, processes):
            s.rank, s.own = rank, CONTROLLER_CODE if target == CONTROLLER else OWN_CODE
    errors = list(errors or []) + [s.error for s in samples if s.error]
    run_dir = Path(run_dir)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
    name = f"{CONTROLLER}.{stamp}.txt" if target == CONTROLLER else f"r{target}.a{attempt}.{stamp}.txt"
    path = run_dir / STACKS_DIR / name
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(render(target, attempt, origin, t, samples, errors))
    fields: dict = {"attempt": attempt} if target != CONTROLLER else {}
    if errors:
        fields["error"] = "; ".join(errors)
    return writer.emit(
        "stacks",
        target=target,
        origin=origin,
        path=str(path.relative_to(run_dir)),
        processes=[s.record() for s in samples],
        **fields,
    )


def render(target, attempt, origin: str, t: float, samples: list[Sample], errors: list[str]) -> str:
    """The file: a header, then each process: its ``where``, and every thread's frames, innermost first."""
    who = "the controller" if target == CONTROLLER else f"replica {target}, attempt {attempt}"
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d} UTC"
    out = [f"# stacks of {who}, taken {when}, asked by {origin}"]
    out += [f"# not sampled: {e}" for e in errors]
    for s in samples:
        rec = s.record()
        how = (s.mode or "blocking") + (", the process was stopped" if s.stopped else "")
        out += ["", f"== pid {s.pid}" + ("" if s.rank is None else f" rank {s.rank}") + f" ({how}, {s.seconds} s)"]
        out.append(f"   where:     {rec['where'] or '(no frame of its own code)'}")
        out.append(f"   innermost: {rec['innermost']}")
        for th in s.threads:
            state = "active" if th.get("active") else "idle"
            out.append(f'Thread {th.get("os_thread_id") or th.get("thread_id")} "{th.get("thread_name")}" ({state})')
            out += [f"    {frame_text(f)}" for f in th.get("frames") or []]
    return "\n".join(out) + "\n"


def take(run, target: Union[int, str, None] = None, origin: str = "api", writer: Optional[EventWriter] = None) -> list:
    """Sample ``target`` of ``run`` (a handle: ``run_dir``, ``run_state`` folded up to now, ``cluster.marker``):
    a replica index, :data:`CONTROLLER`, or None for every group; the ``stacks`` events written, one a target
    (one with no live process says so in its ``error``). Raises ValueError, nothing written, on a bad target or
    origin, or where no target has a live process of the run's."""
    if origin not in ORIGINS:
        raise ValueError(f"origin: {origin!r}; allowed: {', '.join(ORIGINS)}")
    state, marker = run.run_state, run.cluster.marker
    groups = state.groups
    if target is None:
        targets: list = list(range(groups))
    elif target == CONTROLLER:
        targets = [CONTROLLER]
    else:
        try:
            r = int(target)
        except (TypeError, ValueError):
            raise ValueError(f"replica: {target!r} is neither a replica index nor {CONTROLLER!r}") from None
        if not 0 <= r < groups or isinstance(target, bool):
            raise ValueError(f"replica: {target!r} out of range; allowed: 0..{groups - 1} or {CONTROLLER!r}")
        targets = [r]
    found = []
    for tgt in targets:
        if tgt == CONTROLLER:
            found.append((tgt, *controller_processes(state, marker), None))
        else:
            found.append((tgt, *group_processes(state, tgt, marker, run.run_dir)))
    if not any(procs for _, procs, _, _ in found):
        raise ValueError(f"replica: nothing to sample: {'; '.join(e for _, _, errors, _ in found for e in errors)}")
    writer = writer or control_writer(run.run_dir, getattr(run, "id", None))
    return [sample(run.run_dir, writer, tgt, procs, origin, attempt, errors) for tgt, procs, errors, attempt in found]
