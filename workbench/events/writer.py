"""The writing side of the event log: one process, one file, whole lines appended.

Every process that has something to say (a replica attempt, the run controller,
a notebook that injects a fault) owns exactly one file,
``<run_dir>/events/<writer>.jsonl``, and appends one JSON object per line to it.
Nobody else writes that file and nobody rewrites it, so no locking is needed,
which is what works on NFS and Lustre. :class:`~workbench.events.layout.Writer`
names the writers and their files, :class:`~workbench.events.kinds.Kind` what
they write.

Writers never stop training: if the run directory disappears or the disk is
full, :class:`EventWriter` logs one warning and drops events from then on.

Every event has ``t`` (unix seconds), ``kind``, ``run``, ``replica`` (or
``None``), ``attempt``, ``host``, ``pid``; a ``start`` event also has
``pid_start``, the process's start in seconds since boot, which proves later that a PID is
still that process (``workbench.cluster.procs``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any

from workbench.events.layout import EVENTS_DIR

log = logging.getLogger(__name__)


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
        self._file: IO[str] | None = None
        self._broken = False

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> dict | None:
        event = {"t": time.time(), "kind": kind, **self.fields, "pid": os.getpid(), **fields}
        if kind == "start" and "pid_start" not in fields and event["pid"] == os.getpid():
            # The one identity the signalling side (workbench.cluster.procs) trusts: read the same way there.
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
