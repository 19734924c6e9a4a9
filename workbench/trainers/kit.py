"""What every trainer does the same way: liveness, weight checksums, stop signals, child processes, checkpoints.

One definition each, so that the trainers agree on what their events mean:
two ``weights`` checksums are comparable across trainers and replica groups
because one function computes them, a ``heartbeat`` means the same thread is
alive, and ``durable`` means the commit rule of :class:`CheckpointLayout`.

Importing this module imports no torch (every trainer imports it before its
``start`` event, torch after); the functions that need it import it when called.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
"""What a planned stop arrives as: SIGTERM (scancel, the controller) or SIGUSR2 (Slurm's ``--signal``,
submitit's preemption notice, the workbench's ``preempt`` fault)."""


class Heartbeat(threading.Thread):
    """Emits ``heartbeat`` with the current ``step`` every ``period`` seconds, also while a step is slow.

    The training loop sets ``step``; the hang detector reads the heartbeats.
    While the loop waits for its peers (``waiting("sync")`` around a
    semi-synchronous sync: its quorum, all-reduce and vote), each heartbeat
    says so (``waiting``): a group that waits for a hung peer is not itself
    the hung one.
    """

    def __init__(self, writer, period: float) -> None:
        super().__init__(daemon=True, name="workbench-heartbeat")
        self.writer, self.period, self.step = writer, period, 0
        self.waiting_for: Optional[str] = None
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.period):
            waiting = self.waiting_for
            self.writer.emit("heartbeat", step=self.step, **({"waiting": waiting} if waiting else {}))

    @contextlib.contextmanager
    def waiting(self, what: str):
        self.waiting_for = what
        try:
            yield
        finally:
            self.waiting_for = None

    def stop(self) -> None:
        self._stopped.set()


class StepPhases:
    """Per-phase seconds of one training step, for a trainer's timing mode (``torchft.step_timing``).

    ``timed(name, fn)`` wraps a callable so each call adds its duration to
    ``name``; ``take()`` returns the step's totals (``t_<name>_s``) and starts
    the next. Calls from other threads (torchft's quorum thread) add to the
    same step. Off by default: the wrappers are only installed when asked.
    """

    def __init__(self) -> None:
        self._clock = time.perf_counter
        self._acc: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self._acc[name] = self._acc.get(name, 0.0) + seconds

    def timed(self, name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            t0 = self._clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, self._clock() - t0)

        return wrapper

    def take(self) -> dict[str, float]:
        acc, self._acc = self._acc, {}
        return {f"t_{k}_s": v for k, v in acc.items()}


def local_shard(tensor):
    """A DTensor's local shard, anything else as it is.

    An object can only be a DTensor once ``torch.distributed.tensor`` is
    imported, so a trainer that never uses one does not pay for that import.
    """
    dtensor = sys.modules.get("torch.distributed.tensor")
    if dtensor is not None and isinstance(tensor, dtensor.DTensor):
        return tensor.to_local()
    return tensor


def weights_checksum(state: Mapping[str, Any]) -> str:
    """A short hash of a model state dict (this rank's shards), comparable across replica groups.

    Every tensor is hashed as contiguous float32 on the CPU, by name order, so
    two groups holding the same weights agree whatever device or sharding
    produced them.
    """
    h = hashlib.sha1()
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(local_shard(t).detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def state_bytes(obj: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: what a heal transferred. DTensors count their local shard."""
    import torch  # see the module docstring

    obj = local_shard(obj)
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def die_with_parent(parent_pid: Optional[int] = None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``).

    A cancelled or killed job must not leave ranks or a training child behind:
    the next attempt would share the checkpoint directory (or the port) with
    a live predecessor. With ``parent_pid`` this also closes the race of a
    parent that died before the call: the process exits (code 1) at once.
    Usable as ``subprocess.Popen(preexec_fn=...)``. A no-op where prctl does
    not exist.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def on_stop_signals(handler: Callable[[int], None]) -> Callable[[], None]:
    """Call ``handler(signum)`` on each of :data:`STOP_SIGNALS`; returns a function that restores the previous handlers.

    Python runs signal handlers on the main thread only and refuses to install
    them from another; there this installs nothing (the restore is a no-op).
    The handler runs between bytecodes of the main thread: it must not take a
    lock that thread may hold (an event writer's), so it should only record.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, lambda signum, _frame: handler(signum)) for sig in STOP_SIGNALS}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)
        previous.clear()

    return restore


def hold_stop_signals() -> None:
    """Block :data:`STOP_SIGNALS` in this process; one that arrives stays pending, also across ``exec``.

    For a child (``Popen(preexec_fn=...)``) whose handlers exist only once its
    interpreter has started: until then a SIGTERM would kill it. The child
    installs its handlers and then calls :func:`release_stop_signals`, which
    delivers any that arrived meanwhile.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class StopRequest:
    """A planned stop, as a flag the training loop polls between steps: ``reason`` is None or ``"preempted"``."""

    def __init__(self) -> None:
        self.reason: Optional[str] = None
        self.restore = on_stop_signals(self._record)

    def _record(self, signum: int) -> None:
        self.reason = self.reason or "preempted"


def signal_pid(pid: int, sig: int) -> None:
    """``os.kill`` that ignores a process already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@dataclasses.dataclass(frozen=True)
class CheckpointLayout:
    """How a trainer names its checkpoints in one directory, where the name is the commit marker.

    A checkpoint is written under a name matching ``in_progress`` and renamed
    to one matching ``committed`` (whose first group is the step) only once it
    is complete, so a name that matches ``committed`` is durable and a name
    that matches ``in_progress`` is a write that never finished.
    """

    committed: re.Pattern
    in_progress: re.Pattern

    def durable(self, directory: os.PathLike | str) -> dict[int, Path]:
        """Step → path of every committed checkpoint in ``directory`` (empty if it does not exist)."""
        found: dict[int, Path] = {}
        for entry in _entries(directory):
            match = self.committed.match(entry.name)
            if match:
                found[int(match.group(1))] = Path(entry.path)
        return found

    def leftovers(self, directory: os.PathLike | str) -> list[str]:
        """Names of the unfinished writes in ``directory``, sorted."""
        return sorted(e.name for e in _entries(directory) if self.in_progress.match(e.name))


def _entries(directory: os.PathLike | str) -> list[os.DirEntry]:
    try:
        return list(os.scandir(directory))
    except OSError:
        return []
