"""How a trainer tells, in its own ``exit``, the exception that ended it, and how each process of a group ended.

An ``exit`` with ``reason="error"`` carries ``exception``
(:func:`workbench.events.tracebacks.exception_record`: type, message, the
innermost frames) and ``error``, the same in one line. A trainer writes it
where it catches the exception, then re-raises it so that the job still ends
unclean; what escapes a trainer's ``run`` uncaught is written once by the job's
entry (:func:`workbench.trainers.base.job_entrypoint`). An exception whose
``exit`` is written is marked (:func:`told`), so no attempt gets two: a trainer
that writes its own ``exit`` and then raises another exception to fail the job
marks that one with :func:`mark_told`.

A group of several processes (TorchTitan's ranks, MaxText's training process)
adds ``processes``, each process's end in the order they ended
(:func:`process_end`), and ``first_failed``, the rank of the first that ended
unclean.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from workbench.events.end_fields import signal_name
from workbench.events.tracebacks import exception_record, one_line

_TOLD = "_workbench_exit_told"


def told(exc: BaseException) -> bool:
    """Whether an ``exit`` that tells ``exc`` is written already."""
    return bool(getattr(exc, _TOLD, False))


def mark_told(exc: BaseException) -> BaseException:
    try:
        setattr(exc, _TOLD, True)
    except AttributeError:  # an exception type with __slots__: the worst case is a second exit
        pass
    return exc


def error_exit(writer, exc: BaseException, step: Optional[int], **fields: Any) -> None:
    """``exit`` with ``reason="error"``, ``exception`` and ``error`` for ``exc``, unless one was written for it."""
    if told(exc):
        return
    record = exception_record(exc)
    writer.emit("exit", reason="error", step=step, error=one_line(record), exception=record, **fields)
    mark_told(exc)


def process_end(rank: int, returncode: int, t: Optional[float] = None) -> dict:
    """One entry of ``processes``: ``rank``, ``exit_code`` (or ``signal``, by name, for a negative returncode), ``t``."""
    end: dict[str, Any] = {"rank": rank}
    if returncode < 0:
        end["signal"] = signal_name(-returncode)
    else:
        end["exit_code"] = returncode
    end["t"] = time.time() if t is None else t
    return end


def first_failed(processes: list[dict]) -> Optional[int]:
    """The rank of the first process in ``processes`` (in the order they ended) that ended unclean."""
    return next((p["rank"] for p in processes if p.get("exit_code", 1) != 0), None)
