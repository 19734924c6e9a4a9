"""The event log: the only channel from jobs to the notebook.

Protocol
--------
Every process that has something to say (a replica attempt, the run controller,
a notebook that injects a fault) owns exactly one file,
``<run_dir>/events/<writer>.jsonl``, and appends one JSON object per line to it.
Nobody else writes that file and nobody rewrites it, so no locking is needed,
which is what works on NFS and Lustre.

A reader keeps a byte offset per file and, on each poll, reads only what was
appended since. A line without its trailing newline is a write in progress: the
reader leaves it for the next poll. A line that is complete but not valid JSON
(a disk that filled up mid-write, say) is skipped and counted, never fatal.

Writers never stop training: if the run directory disappears or the disk is
full, :class:`EventWriter` logs one warning and drops events from then on.

Every event has ``t`` (unix seconds), ``kind``, ``run``, ``replica`` (or
``None``), ``attempt``, ``host``, ``pid``; a ``start`` event also has
``pid_start``, the process's start in seconds since boot, which proves later that a PID is
still that process (``workbench.cluster.procs``). ``docs/events.md`` lists the kinds.
A line whose ``t`` is not a number, or that is not an object with a ``kind``,
is skipped and counted (``skipped_lines``) like a torn one: no line of any
file stops a reader.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

log = logging.getLogger(__name__)

EVENTS_DIR = "events"

KINDS = (
    "start",
    "exit",
    "heartbeat",
    "phase",
    "step",
    "quorum",
    "commit",
    "torchft_error",
    "heal",
    "checkpoint",
    "fault",
    "armed",
    "held",
    "restart",
    "requeue",
    "hang",
    "submit",
    "job",
    "lighthouse",
    "run_end",
    "warning",
)


class EventWriter:
    """Appends events to this process's own file in the run directory.

    ``fields`` are stamped on every event (``run``, ``replica``, ``attempt``).
    Each :meth:`emit` is one ``write`` of one whole line followed by a flush, so
    a reader sees either nothing or the complete line (or, after a crash
    mid-write, a torn tail it knows to ignore).
    """

    def __init__(self, run_dir: str | os.PathLike, writer: str, **fields: Any) -> None:
        self.path = Path(run_dir) / EVENTS_DIR / f"{writer}.jsonl"
        self.fields = {"run": None, "replica": None, "attempt": 0, **fields}
        self.fields.setdefault("host", socket.gethostname())
        self._lock = threading.Lock()
        self._file = None
        self._broken = False

    def _open(self):
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> dict | None:
        event = {"t": time.time(), "kind": kind, **self.fields, "pid": os.getpid(), **fields}
        if kind == "start" and "pid_start" not in fields and event["pid"] == os.getpid():
            from workbench.cluster.procs import start_time

            event["pid_start"] = start_time(os.getpid())
        line = json.dumps(event, default=_json_default, allow_nan=True) + "\n"
        with self._lock:
            if self._broken:
                return None
            try:
                if self._file is None:
                    self._file = self._open()
                self._file.write(line)
                self._file.flush()
            except OSError as e:
                self._broken = True
                log.warning("event log %s is not writable (%s); dropping further events", self.path, e)
                return None
        return event

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def new_lines(events_dir: Path, offsets: dict[Path, int]) -> Iterator[bytes]:
    """The whole lines appended to each ``*.jsonl`` file of ``events_dir`` since ``offsets``
    (advanced as they are read), one bytes block per file that has any, in file-name order.
    A last line without its newline is a writer mid-append: it stays for the next read."""
    try:
        files = sorted(events_dir.glob("*.jsonl"))
    except OSError:
        return
    for path in files:
        offset = offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            continue
        end = data.rfind(b"\n")
        if end < 0:
            continue
        offsets[path] = offset + end + 1
        yield data if end + 1 == len(data) else data[: end + 1]


class EventReader:
    """Incremental reader over every writer's file in ``<run_dir>/events``.

    :meth:`poll` returns the events appended since the previous call, in file
    order within a writer. Files that appear later are picked up on the next
    poll. Order across writers is by ``t`` only within a poll; consumers that
    need a causal order use ``(replica, attempt, step)``.
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.dir = Path(run_dir) / EVENTS_DIR
        self._offsets: dict[Path, int] = {}
        self.skipped_lines = 0

    def poll(self) -> list[dict]:
        out: list[dict] = []
        files = 0
        for data in new_lines(self.dir, self._offsets):
            files += 1
            out.extend(self._parse(data))
        if files > 1:
            out.sort(key=lambda e: e.get("t", 0.0))
        return out

    def _parse(self, data: bytes) -> Iterator[dict]:
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                try:  # NaN/Infinity (a diverged loss) are Python's JSON, not orjson's
                    event = json.loads(line)
                except ValueError:
                    self.skipped_lines += 1
                    continue
            if isinstance(event, dict) and "kind" in event and isinstance(event.get("t", 0.0), (int, float)):
                yield event
            else:
                self.skipped_lines += 1


def read_all(run_dir: str | os.PathLike) -> list[dict]:
    return EventReader(run_dir).poll()


def to_frame(events: Iterable[dict]):
    import pandas as pd

    df = pd.DataFrame(list(events))
    if df.empty:
        return pd.DataFrame(columns=["t", "kind", "run", "replica", "attempt", "host", "pid"])
    return df.sort_values("t", kind="stable").reset_index(drop=True)
