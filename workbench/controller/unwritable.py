"""When the run root takes no write: how long the run goes on, and how the controller says it ended.

The event writer (``workbench.events.writer``) rides out a file that fails for a while: it keeps what
it could not append and writes it, with a ``write_gap``, once appends work again. A run root that
stays unwritable is another matter: nothing of the run is recorded any more (steps, faults,
checkpoints), and nobody would learn how it ended. So the controller watches its own writer
(:class:`UnwritableWatch`):

- Once its event log has taken no write for the spec's ``unwritable_timeout_s``, it tries once more
  (``EventWriter.close`` writes what is pending if the file takes it, and the next emit reopens
  it); if that fails too, the loop ends the run through its usual shutdown (faults undone, every
  group and spare stopped, the lighthouse too), and ``run_end`` says ``state=failed``,
  ``reason=run_root_unwritable``, ``since`` (the ``t`` of the first event not written) and ``error``.
- A ``run_end`` that is not written (this end or any other) is tried again, with backoff, for as long
  again, until the last moment: a SIGTERM cuts the wait to one more try. First the controller leaves
  its trace (``workbench.run.unwritten_end``: a name, which a full disk still takes; there already if
  the controller is SIGKILLed while it waits), which it removes if the ``run_end`` goes in after all;
  if it never does, the controller says the end on stderr and exits non-zero. ``Run.controller_gone``
  reads the trace.

Why 60 s by default: it outlasts what clears itself (a log rotation or a cleanup freeing space, a
failed save's temporary files removed), and an episode shorter than it loses no event: each writer keeps 1 MiB
(``writer.BACKLOG_BYTES``), 17 kB/s for 60 s, while a replica of the demo at full speed on this
machine writes 14 kB/s (measured: 22 steps a second, a ``step`` line of 370 bytes and its ``quorum``
and ``commit`` records each) and the controller 0.1 kB/s (``node_health`` every 2 s). Longer, and
the run spends accelerator time that nothing records, steps whose checkpoints fail to save included.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable, Optional

from workbench.events.states import RunEndReason
from workbench.events.writer import EventWriter
from workbench.run import unwritten_end

REASON = RunEndReason.RUN_ROOT_UNWRITABLE
FIRST_RETRY_S = 1.0  # then doubling: about six stderr lines (the writer says each failed close) over 60 s
TICK_S = 0.1  # how soon a stop signal cuts the wait short


class UnwritableWatch:
    """The controller's own writer against ``timeout_s``; the ``run_end``'s retries and trace."""

    def __init__(self, writer: EventWriter, run_dir: Path, timeout_s: float) -> None:
        self.writer, self.run_dir, self.timeout_s = writer, Path(run_dir), timeout_s
        self.since: Optional[float] = None  # the episode that ended the run

    def expired(self, now: float) -> bool:
        """True when the event log has taken no write for ``timeout_s`` and one more try fails now."""
        since = self.writer.failing_since
        if since is None or now - since < self.timeout_s:
            return False
        self.writer.close()  # writes the backlog if it can now (and a write_gap); the next emit reopens
        if self.writer.failing_since is None:
            return False
        self.since = since
        return True

    def end_fields(self, reason: str) -> dict:
        """``run_end``'s fields beyond state and reason: from when and why, for ``run_root_unwritable``."""
        return {"since": self.since, "error": self.writer.error} if reason == REASON else {}

    def finish(self, state: str, reason: str, stopping: Callable[[], bool]) -> bool:
        """After ``run_end`` was emitted: True once it is in the file. If it is not, leave the trace, retry
        with backoff for ``timeout_s`` (one more try after a stop signal), and say it on stderr if it never goes in."""
        since = self.writer.failing_since
        if since is None:
            return True
        left_trace = unwritten_end.leave(self.run_dir, state, reason, since, self.writer.error)
        deadline, wait = time.monotonic() + self.timeout_s, FIRST_RETRY_S
        next_try = time.monotonic() + wait
        while time.monotonic() < deadline and not stopping():
            time.sleep(TICK_S)
            if time.monotonic() >= next_try:
                if self._written():
                    return True
                wait *= 2
                next_try = time.monotonic() + wait
        if self._written():  # the last moment
            return True
        _say(
            f"the run ended {state} ({reason or 'no reason'}), but its run_end is not written: the event log "
            f"{self.writer.path} has taken no write since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
            f" ({self.writer.error}); "
            + (f"left {self.run_dir / unwritten_end.NAME}" if left_trace else "no trace could be left either")
        )
        return False

    def _written(self) -> bool:
        self.writer.close()
        if self.writer.failing_since is not None:
            return False
        unwritten_end.clear(self.run_dir)
        return True


def _say(message: str) -> None:
    try:
        print(f"workbench controller: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
