"""The ``run_end`` a controller could not write, left as a symlink whose target says it in a few words.

When the run root takes no write (a full disk, a quota), the controller's ``run_end`` stays in its
writer's memory (``workbench.events.writer``), and so does its stderr: ``controller.log`` is in the
same directory. What a full file system still takes is a name: a directory entry costs an inode, not
a data block, and a short symlink keeps its target in the inode (ext4 up to :data:`MAX_TARGET` bytes,
tmpfs up to 127). So a controller whose ``run_end`` is not written when it exits leaves
``run_end.unwritten -> "failed run_root_unwritable 1796518104 ENOSPC"`` (state, reason or ``-``,
the ``t`` of its first event not written, the errno), and removes it if the ``run_end`` goes in after
all. :meth:`Run.controller_gone <workbench.run.handle.Run.controller_gone>` reads it: a run whose
controller is gone without a ``run_end`` says why, also once the disk has room again. A file system
that takes not even a name (read-only) leaves the controller's exit status and stderr.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Optional

from workbench.events.states import RunEndReason
from workbench.state.run_status import no_write_since

NAME = "run_end.unwritten"
MAX_TARGET = 59  # the longest symlink target ext4 keeps in the inode ("fast symlink"); a longer one needs a block


def leave(run_dir: Path, state: str, reason: str, since: Optional[float], error: str) -> bool:
    """Leave the trace (replacing an older one); True if it is there."""
    match = re.search(r"\[Errno (\d+)\]", error)
    code = errno.errorcode.get(int(match.group(1)), "-") if match else "-"
    token = reason if reason in set(RunEndReason) else "-"
    target = f"{state} {token} {int(since) if since is not None else '-'} {code}"[:MAX_TARGET]
    path = Path(run_dir) / NAME
    try:
        clear(run_dir)
        os.symlink(target, path)
        return True
    except OSError:
        return False


def clear(run_dir: Path) -> None:
    """Remove the trace, if there is one and the directory lets it (its ``run_end`` is written)."""
    try:
        os.unlink(Path(run_dir) / NAME)
    except OSError:
        pass


def read(run_dir: Path) -> Optional[str]:
    """What the trace says, in words; None without one."""
    try:
        state, reason, since, code = os.readlink(Path(run_dir) / NAME).split(" ")
    except (OSError, ValueError):
        return None
    error = f"{code}: {os.strerror(getattr(errno, code))}" if hasattr(errno, code) else code
    ended = f"it ended the run {state}" + (f" ({reason})" if reason != "-" else "")
    when = float(since) if since.isdigit() else None
    return f"{ended} but could not write run_end: {no_write_since(when, error)}"
