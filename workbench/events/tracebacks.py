"""An exception as the event log keeps it: type, message and the innermost frames.

Two sources give the same record. A trainer that catches the exception that ends it calls
:func:`exception_record` and writes it in its ``exit`` (``exception``). A process that died of an
uncaught exception wrote only its traceback to stderr; the controller reads it back with
:func:`last_traceback`, the way a person would scroll up the job's log. Python prints a traceback
outermost frame first and the exception last, and a chained one (``During handling of …``, ``The above
exception was the direct cause …``) before the one that ended the process, so the last block is the one
that counts.
"""

from __future__ import annotations

import re
import traceback
from typing import Optional

FRAMES = 5  # the innermost frames kept: enough to see the trainer's frame under a library's
MESSAGE_CHARS = 500

_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
_EXC = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure|[A-Z]\w*))(?::\s?(?P<message>.*))?$"
)


def exception_record(exc: BaseException, frames: int = FRAMES) -> dict:
    """``{"type", "message", "frames": [{"file", "line", "function"}, ...]}``, innermost frame last."""
    summary = traceback.extract_tb(exc.__traceback__)[-frames:]
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MESSAGE_CHARS],
        "frames": [{"file": f.filename, "line": f.lineno, "function": f.name} for f in summary],
    }


def one_line(record: dict) -> str:
    """``Type: message`` (the ``error`` field's form)."""
    message = record.get("message")
    return f"{record.get('type')}: {message}" if message else str(record.get("type"))


def last_traceback(text: str, frames: int = FRAMES) -> Optional[dict]:
    """The last traceback printed in ``text`` as :func:`exception_record` gives it, or None."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return None
    found: list[dict] = []
    record: Optional[dict] = None
    for line in lines[starts[-1] + 1 :]:
        m = _FRAME.match(line)
        if m:
            found.append({"file": m["file"], "line": int(m["line"]), "function": m["function"].strip()})
            continue
        if line.startswith(" ") or not line.strip() or not found:
            continue
        m = _EXC.match(line.strip())
        if m:
            record = {"type": m["type"].rsplit(".", 1)[-1], "message": (m["message"] or "")[:MESSAGE_CHARS]}
        break
    if record is None:
        return None
    record["frames"] = found[-frames:]
    return record
