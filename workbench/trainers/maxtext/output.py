"""Readers of what MaxText leaves behind: its checkpoint directory, console and metrics file.

The wrapper (:mod:`.maxtext`) polls them and turns what they find into
events. See its docstring for what each one means.
"""

from __future__ import annotations

import collections
import json
import re
import threading
from pathlib import Path
from typing import Optional

from workbench.run.rundir import dir_bytes
from workbench.trainers.kit import CheckpointLayout

CHECKPOINTS = CheckpointLayout(committed=re.compile(r"^(\d+)$"), in_progress=re.compile(r"^\d+\.orbax-checkpoint-tmp"))
"""Orbax writes ``<N>.orbax-checkpoint-tmp`` and renames it to ``<N>`` once the save is finalized."""
durable_checkpoints = CHECKPOINTS.durable
leftover_tmp_checkpoints = CHECKPOINTS.leftovers

_RESTORED = re.compile(r"restoring from this run's directory step (\d+)")
_DEVICES = re.compile(r"Num_devices: (\d+)")
_STOPPED = re.compile(r"Training stopped: (.*)")
_MARKER = "WORKBENCH "  # how maxtext/launcher.py prefixes the lines it prints itself


def marker_fact(line: str) -> Optional[dict]:
    """The fact a launcher's ``WORKBENCH {...}`` line carries (a phase, a compile-cache count), else None."""
    if not line.startswith(_MARKER):
        return None
    try:
        fact = json.loads(line[len(_MARKER) :])
    except ValueError:
        return None
    return fact if isinstance(fact, dict) else None


def checkpoint_facts(path: Path) -> tuple[Optional[float], int]:
    """(seconds from Orbax's init to commit, bytes on disk) of a finalized checkpoint."""
    seconds = None
    try:
        meta = json.loads((path / "_CHECKPOINT_METADATA").read_text())
        if meta.get("commit_timestamp_nsecs") and meta.get("init_timestamp_nsecs"):
            seconds = (meta["commit_timestamp_nsecs"] - meta["init_timestamp_nsecs"]) / 1e9
    except (OSError, ValueError):
        pass
    return seconds, dir_bytes(path)


class Console:
    """Reads MaxText's console in a thread: keeps it on disk and picks out the facts."""

    def __init__(self, stream, log_path: Path, on_restored, on_phase=lambda fact: None) -> None:
        self.stream = stream
        self.log_path = log_path
        self.on_restored = on_restored
        self.on_phase = on_phase
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.cache_hits = 0
        self.cache_misses = 0
        self.devices = 1
        self.stopped_because: Optional[str] = None
        self.thread = threading.Thread(target=self._read, name="maxtext-console", daemon=True)

    def start(self) -> "Console":
        self.thread.start()
        return self

    def _read(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            for line in self.stream:
                log.write(line)
                log.flush()
                self._parse(line.rstrip("\n"))

    def _parse(self, line: str) -> None:
        self.tail.append(line)
        if line.startswith(_MARKER):
            fact = marker_fact(line) or {}
            if isinstance(fact.get("phase"), str):
                self.on_phase(fact)
            elif fact.get("compile_cache") == "hits":
                self.cache_hits += 1
            elif fact.get("compile_cache") == "misses":
                self.cache_misses += 1
            return
        if m := _RESTORED.search(line):
            self.on_restored(int(m.group(1)))
        elif m := _DEVICES.search(line):
            self.devices = int(m.group(1))
        elif m := _STOPPED.search(line):
            self.stopped_because = m.group(1)

    def error_line(self) -> Optional[str]:
        for line in reversed(self.tail):
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b", line):
                return line
        return self.tail[-1] if self.tail else None


class Metrics:
    """Incremental reader of MaxText's metrics file (whole lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        rows = []
        for line in data[: end + 1].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
        return rows
