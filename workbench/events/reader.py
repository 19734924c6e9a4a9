"""The reading side of the event log: new whole lines only, and no line that can stop a reader.

A reader keeps a byte offset per file and, on each poll, reads only what was
appended since. A line without its trailing newline is a write in progress: the
reader leaves it for the next poll. A line that is complete but not valid JSON
(a disk that filled up mid-write, say) is skipped and counted, never fatal.
A line whose ``t`` is not a number, or that is not an object with a ``kind``,
is skipped and counted (``skipped_lines``) like a torn one: no line of any
file stops a reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from workbench.events.layout import EVENTS_DIR


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


def to_frame(events: Iterable[dict]) -> Any:
    """The events as a pandas DataFrame sorted by ``t`` (pandas is imported here, not by the jobs that write)."""
    import pandas as pd

    df = pd.DataFrame(list(events))
    if df.empty:
        return pd.DataFrame(columns=["t", "kind", "run", "replica", "attempt", "host", "pid"])
    return df.sort_values("t", kind="stable").reset_index(drop=True)
