"""torchft's structured logs as an event source.

torchft logs what its Manager decides on three loggers, each record's facts in
its ``extra`` (``torchft/manager.py``, ``torchft/process_group.py``); each
becomes one event:

- ``torchft_quorums`` → ``quorum``: a new quorum id, logged before the process
  group is reconfigured (``job_id``, ``replica_id``, ``rank``, ``quorum_id``,
  ``step``: the quorum's max step);
- ``torchft_commits`` → ``commit``: every ``should_commit`` vote's outcome
  (``job_id``, ``replica_id``, ``rank``, ``quorum_id``, ``step``: the step
  voted on, before it advances, ``commit_result``);
- ``torchft_errors`` → ``torchft_error``: a torchft process group aborted on
  an error (``job_id``, ``replica_id``, ``rank``, ``uuid``, ``error``).

:class:`TorchftLogHandler` writes each record as one event through the
process's own :class:`~workbench.events.writer.EventWriter` (one writer per file:
the handler holds no file), stamped with the record's own time. torchft's
``job_id`` (its ``JOB_ID`` environment variable) is kept as ``torchft_job_id``:
``job_id`` in the event log is the backend's job. The quorum record is logged
on torchft's quorum thread, the commit record on the thread that steps; the
writer's lock orders them.

The trainers read the facts of a step off the commit record instead of
computing them: :meth:`TorchftLogHandler.take_commit` after a step is that
step's vote (``should_commit`` logs it before it returns). Its ``step`` is the
step voted on, so a committed ``step`` event ``s`` has the commit record
``s - 1``, also for a step that healed (the record carries the healed step).
"""

from __future__ import annotations

import logging
from typing import Optional

from workbench.events.writer import EventWriter

LOGGERS = {"torchft_quorums": "quorum", "torchft_commits": "commit", "torchft_errors": "torchft_error"}
FIELDS = ("replica_id", "rank", "quorum_id", "step", "commit_result", "uuid", "error")


class TorchftLogHandler(logging.Handler):
    """torchft's structured loggers → events; see the module docstring."""

    def __init__(self, writer: EventWriter) -> None:
        super().__init__(logging.INFO)
        self.writer = writer
        self.last_commit: Optional[dict] = None
        self.records = dict.fromkeys(LOGGERS.values(), 0)

    def emit(self, record: logging.LogRecord) -> None:
        kind = LOGGERS.get(record.name)
        if kind is None:
            return
        fields = {k: getattr(record, k) for k in FIELDS if hasattr(record, k)}
        if hasattr(record, "job_id"):
            fields["torchft_job_id"] = record.job_id
        if kind == "commit":
            self.last_commit = fields
        self.records[kind] += 1
        self.writer.emit(kind, t=record.created, **fields)

    def take_commit(self) -> Optional[dict]:
        """The commit record logged since the last call (None if there was none), and forget it.
        Only the stepping thread votes, so one iteration's call gets that iteration's vote."""
        c, self.last_commit = self.last_commit, None
        return c

    def install(self) -> "TorchftLogHandler":
        for name in LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)
            logger.addHandler(self)
            logger.propagate = False
        return self

    def uninstall(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self)
