"""A job's group of child processes: started with their stderr kept, waited for together, told how each ended.

TorchTitan's job starts its ranks with this (:mod:`.titan.job`), or forks them warm and has it
watch them (:meth:`ProcessGroup.adopt`, :mod:`.forked`). Each child's
stderr is a pipe that a thread copies, line by line, to the job's own stderr
(where it always went: the job's log) and to a file of its own, and keeps its
last lines, so that the traceback of a child that died of an uncaught
exception can be read back (:func:`workbench.events.tracebacks.last_traceback`)
into the job's ``exit``. A thread per child waits for it and records when it
ended, so :attr:`ProcessGroup.ended` is in the order they ended. The first to
end unclean has the group killed (SIGKILL, by PID): a rank whose peer died
would only wait in a collective.
"""

from __future__ import annotations

import collections
import os
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any, Optional

from workbench.events.tracebacks import last_traceback
from workbench.trainers.exits import first_failed, process_end

TAIL_LINES = 2000  # a torch traceback with its chained causes fits, a chatty log does not push it out
JOIN_S = 5.0  # how long a child's stderr may stay open after it ended (a grandchild holding it)


class _StderrCopy(threading.Thread):
    """Copies one child's stderr to the job's stderr and to ``path``, keeping the last :data:`TAIL_LINES`."""

    def __init__(self, stream, path: Optional[Path]) -> None:
        super().__init__(daemon=True, name="workbench-stderr-copy")
        self.stream, self.path = stream, path
        self.tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        log = None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                log = open(self.path, "ab")
            except OSError:
                log = None
        try:
            for line in iter(self.stream.readline, b""):
                self.tail.append(line)
                _write_all(2, line)
                if log is not None:
                    log.write(line)
                    log.flush()
        finally:
            if log is not None:
                log.close()

    def traceback(self) -> Optional[dict]:
        self.join(JOIN_S)
        return last_traceback(b"".join(list(self.tail)).decode("utf-8", "replace"))


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


class ProcessGroup:
    """Child processes, each with a ``rank``; :meth:`wait` for them all. ``popens`` is a live list of them."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen] = []
        self.ranks: dict[int, int] = {}  # pid -> rank
        self.ended: list[dict] = []
        self._copies: dict[int, _StderrCopy] = {}
        self._ends: queue.Queue = queue.Queue()

    def start(self, rank: int, argv: list[str], stderr_path: Optional[Path] = None, **popen: Any) -> subprocess.Popen:
        return self.adopt(rank, subprocess.Popen(argv, stderr=subprocess.PIPE, **popen), stderr_path)

    def adopt(self, rank: int, p: Any, stderr_path: Optional[Path] = None) -> Any:
        """Watch a child started otherwise (a :class:`~.forked.ForkedProcess`: ``pid``, ``stderr``, ``wait``,
        ``poll``, ``kill``, ``returncode``) as :meth:`start` watches its own."""
        copy = _StderrCopy(p.stderr, stderr_path)
        copy.start()
        self._copies[rank] = copy
        self.ranks[p.pid] = rank
        self.popens.append(p)
        threading.Thread(target=self._wait_one, args=(rank, p), daemon=True, name="workbench-wait").start()
        return p

    def _wait_one(self, rank: int, p: subprocess.Popen) -> None:
        code = p.wait()
        self._ends.put(process_end(rank, code))

    def wait(self) -> Optional[int]:
        """Wait until every child ended; on the first unclean end, kill the others. The first failed rank, or None."""
        while len(self.ended) < len(self.popens):
            try:
                end = self._ends.get(timeout=0.5)  # a timeout: the job's signal handlers run in between
            except queue.Empty:
                continue
            self.ended.append(end)
            if end.get("exit_code") != 0 and first_failed(self.ended) == end["rank"]:
                for p in self.popens:
                    if p.poll() is None:
                        p.kill()
        return first_failed(self.ended)

    def exit_fields(self) -> dict:
        """``processes``, ``first_failed`` and, read back from its stderr, the first failed one's ``exception``."""
        fields: dict[str, Any] = {"processes": list(self.ended)}
        failed = first_failed(self.ended)
        if failed is not None:
            fields["first_failed"] = failed
            record = self._copies[failed].traceback()
            if record is not None:
                fields["exception"] = {**record, "rank": failed}
        return fields

    def close(self) -> None:
        """Kill what still runs (by PID) and wait for it."""
        for p in self.popens:
            if p.poll() is None:
                p.kill()
        for p in self.popens:
            p.wait()
