"""The writing side of the event log: one process, one file, whole lines appended.

Every process that has something to say (a replica attempt, the run controller,
a notebook that injects a fault) owns exactly one file,
``<run_dir>/events/<writer>.jsonl``, and appends one JSON object per line to it.
Nobody else writes that file and nobody rewrites it, so no locking is needed,
which is what works on NFS and Lustre. :class:`~workbench.events.layout.Writer`
names the writers and their files, :class:`~workbench.events.kinds.Kind` what
they write.

Writers never stop training, and they never go silent. When an append fails (a
full disk, a quota, a file-size limit, a run directory gone), :meth:`EventWriter.emit`
returns ``None``, keeps the event in a bounded in-memory backlog
(:data:`BACKLOG_BYTES`; beyond it the oldest are dropped and counted) and
retries on the next emit. Once an append works again the backlog is written,
oldest first and each with its own ``t``, then a ``write_gap`` event that says
since when, how many events came late (``delayed``) or never (``lost``) and the
first error; the fold counts these (``RunState.write_gaps``). Each failing
episode is said once on stderr when it begins and once when it ends, never per
event. A trainer whose disk is full keeps training.

The contract holds through an episode: each line is in the file whole and
once. Appends are ``os.write`` on an ``O_APPEND`` descriptor, so the writer
knows how many bytes of a line went in; when a disk fills in the middle of a
line, the rest of that line is the first thing written when the disk has room
again (a reader leaves a line without its newline for later, so it never sees
the half), and nothing is written twice. All the :class:`EventWriter`\\ s of
one file in one process share that state (and one lock), so a second writer of
the same file cannot append after a half line.

Every event has ``t`` (unix seconds), ``kind``, ``run``, ``replica`` (or
``None``), ``attempt``, ``host``, ``pid``; a ``start`` event also has
``pid_start``, the process's start in seconds since boot, which proves later that a PID is
still that process (``workbench.cluster.procs``).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from workbench.events.layout import EVENTS_DIR

# Lines kept in memory while a file cannot be written: about 2000 step events, minutes of a fast trainer.
# Beyond it the oldest are dropped (the newest say where the run is now) and ``write_gap`` counts them.
BACKLOG_BYTES = 1 << 20


@dataclass
class WriteEpisode:
    """A time a file could not be written: from the first event that did not go in to the append that worked."""

    since: float  # the ``t`` of the first event not written
    error: str  # the first error
    events: int = 0  # events not written when they were emitted
    lost: int = 0  # of them, dropped: the backlog was full, or a half line's file was replaced

    @property
    def delayed(self) -> int:
        """Events not written when emitted that are in the file now (at the episode's end)."""
        return self.events - self.lost


class AppendFile:
    """This process's appends to one file: its descriptor, the rest of a half-written line, the backlog,
    the episode. Shared by every :class:`EventWriter` of the file in the process (:func:`_append_file`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()  # an emit writes its episode's ``write_gap`` through a nested emit
        self.fd: Optional[int] = None
        self.opened = False
        self.identity: Optional[tuple[int, int]] = None
        self.tail = b""  # what a short write left of a line: written before anything else, never dropped
        self.backlog: deque[bytes] = deque()
        self.backlog_bytes = 0
        self.episode: Optional[WriteEpisode] = None
        self.error = ""

    def append(self, line: bytes, t: float) -> bool:
        """Append ``line`` now, or keep it for later (its start may already be in); True if it is whole in the file.
        Outside an episode it is tried; in one (:meth:`recover` just failed) it waits behind the backlog."""
        if self.episode is None:
            n = self._put(line)
            if n == len(line):
                return True
            self.episode = WriteEpisode(since=t, error=self.error)
            _say(
                f"event log {self.path} is not writable ({self.error}); keeping up to {BACKLOG_BYTES} bytes of its "
                "events in memory and retrying on each event"
            )
            if n:
                self.tail = line[n:]
            else:
                self._keep(line)
        else:
            self._keep(line)
        self.episode.events += 1
        return False

    def recover(self) -> Optional[WriteEpisode]:
        """In an episode: write what is pending, oldest first; the episode, ended, if all of it went in."""
        if self.episode is None or not self._write_pending():
            return None
        episode, self.episode = self.episode, None
        return episode

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit the module's globals may be gone
            pass

    def _keep(self, line: bytes) -> None:
        self.backlog.append(line)
        self.backlog_bytes += len(line)
        while self.backlog_bytes > BACKLOG_BYTES and len(self.backlog) > 1:
            self.backlog_bytes -= len(self.backlog.popleft())
            if self.episode is not None:
                self.episode.lost += 1

    def _write_pending(self) -> bool:
        while self.tail or self.backlog:
            if self.fd is None and not self._reopen():
                return False
            if not self.tail:  # (a reopen drops a half line whose file was replaced)
                line = self.backlog.popleft()
                self.backlog_bytes -= len(line)
                n = self._put(line)
                if n == 0:  # nothing of it went in: it stays first
                    self.backlog.appendleft(line)
                    self.backlog_bytes += len(line)
                    return False
                self.tail = line[n:]
            else:
                self.tail = self.tail[self._put(self.tail) :]
            if self.tail:
                return False
        return True

    def _put(self, data: bytes) -> int:
        """Append ``data``: how many of its bytes went in (all, or fewer and ``error`` says why)."""
        done = 0
        try:
            fd = self.fd if self.fd is not None else self._open()
            view = memoryview(data)
            while done < len(data):
                n = os.write(fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "write appended nothing")
                done += n
        except OSError as e:
            self._failed(e)
        return done

    def _reopen(self) -> bool:
        try:
            self._open()
            return True
        except OSError as e:
            self._failed(e)
            return False

    def _failed(self, e: OSError) -> None:
        self.error = f"{type(e).__name__}: {e}"
        self.close()  # reopened on the next try: a replaced file, a stale NFS handle

    def _open(self) -> int:
        # The first open makes the run directory; a reopen makes at most ``events/``, so a writer whose run
        # directory was removed under it does not bring it back.
        self.path.parent.mkdir(mode=0o700, parents=not self.opened, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        st = os.fstat(fd)
        identity = (st.st_dev, st.st_ino)
        if self.tail and identity != self.identity and self.episode is not None:
            self.tail = b""  # the half line's start is in a file that is gone: its event is lost, not glued to another
            self.episode.lost += 1
        self.fd, self.identity, self.opened = fd, identity, True
        return fd


_FILES: weakref.WeakValueDictionary[tuple[int, str], AppendFile] = weakref.WeakValueDictionary()
_FILES_LOCK = threading.Lock()


def _append_file(path: Path) -> AppendFile:
    """The one :class:`AppendFile` of ``path`` in this process (a forked child gets its own)."""
    key = (os.getpid(), os.path.abspath(path))
    with _FILES_LOCK:
        f = _FILES.get(key)
        if f is None:
            f = _FILES[key] = AppendFile(path)
        return f


class EventWriter:
    """Appends events to this process's own file in the run directory.

    ``fields`` are stamped on every event (``run``, ``replica``, ``attempt``).
    Each :meth:`emit` is one append of one whole line, so a reader sees either
    nothing or the complete line (or, after a crash mid-write, a torn tail it
    knows to ignore). An append that fails is kept and retried (module docstring).
    """

    def __init__(self, run_dir: str | os.PathLike, writer: str, **fields: Any) -> None:
        self.path = Path(run_dir) / EVENTS_DIR / f"{writer}.jsonl"
        self.fields = {"run": None, "replica": None, "attempt": 0, **fields}
        self.fields.setdefault("host", socket.gethostname())
        self._file = _append_file(self.path)

    def emit(self, kind: str, **fields: Any) -> dict | None:
        """Append one event; the event, or None if it is not in the file now (kept for later, or dropped and counted)."""
        event = {"t": time.time(), "kind": kind, **self.fields, "pid": os.getpid(), **fields}
        if kind == "start" and "pid_start" not in fields and event["pid"] == os.getpid():
            # The one identity the signalling side (workbench.cluster.procs) trusts: read the same way there.
            from workbench.cluster.procs import start_time

            event["pid_start"] = start_time(os.getpid())
        line = (json.dumps(event, default=_json_default, allow_nan=True) + "\n").encode()
        with self._file.lock:
            self._write_gap(event["t"])
            written = self._file.append(line, event["t"])
        return event if written else None

    @property
    def failing_since(self) -> Optional[float]:
        """When the current episode began (the ``t`` of the first event not written), or None while appends work."""
        episode = self._file.episode
        return episode.since if episode is not None else None

    def close(self) -> None:
        """Write what is pending if the file takes it now (say on stderr what it does not), and close the file."""
        with self._file.lock:
            self._write_gap(time.time())
            episode = self._file.episode
            if episode is not None:
                _say(f"event log {self.path}: {episode.delayed} events not written yet at close ({self.error})")
            self._file.close()

    @property
    def error(self) -> str:
        """The last error an append met ('' if none did)."""
        return self._file.error

    def _write_gap(self, t: float) -> None:
        """If an episode just ended (everything pending is in), say so and append its ``write_gap`` at ``t``
        (the event that found the file writable: the file's order stays the order of ``t``)."""
        episode = self._file.recover()
        if episode is not None:
            _say(
                f"event log {self.path} is writable again: {episode.delayed} events written late, {episode.lost} "
                f"lost, since {time.strftime('%H:%M:%S', time.localtime(episode.since))}"
            )
            self.emit(
                "write_gap", t=t, since=episode.since, delayed=episode.delayed, lost=episode.lost, error=episode.error
            )


def _say(message: str) -> None:
    """One line on stderr, which a full disk or a closed stream must not turn into an error."""
    try:
        if sys.stderr is not None:
            print(f"workbench: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)
