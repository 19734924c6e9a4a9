"""What the controller's ``job`` event says of an attempt whose job ended: the facts, gathered at once.

``Controller._job_ended`` calls :func:`gathered` when the backend says the job is done, before it
decides what comes next, and adds the fields to the ``job`` event (``workbench.events.end_fields.JOB``):

- how the process ended, from the backend (``Cluster.exit_status``, ``workbench.cluster.exits``): the exit
  code or the signal, the OOM killer's evidence, Slurm's final state, exit code and node;
- ``step``: the last step the attempt reached (the fold's view of the group, while it follows this attempt;
  else the controller's last committed step of it);
- ``exception``: the one the trainer's own ``exit`` carried (``exception_source: "exit"``); without one, the
  last traceback in the job's stderr (``workbench.events.tracebacks.last_traceback``, ``exception_source:
  "stderr"``), read only when the process exited with a non-zero code: an uncaught exception's end.
  A process a signal ended did not die of a traceback it printed earlier (torchft logs the ones it recovers
  from), and one that exited 0 did not die of one at all;
- ``first_failed``: copied from the ``exit``;
- ``last_lines``: the last lines of the job's stdout, then of its stderr, at most :data:`LAST_LINES` in all
  (stderr's get at least half where both have that many), each cut at :data:`LINE_CHARS`;
- ``log``: the job's ``stdout`` and ``stderr`` files (those that exist), relative to the run directory.

The event states facts and attributes nothing: a signal the workbench injected (a ``fault`` event) and
one from elsewhere read the same here; readers join them (``workbench.state.causes``).

Bounded in time, since the loop waits: local, the reaper's status file is normally there within one reap
period (20 ms; waited for up to ``forkexecutor.STATUS_WAIT_S``) and the kernel log is read only for a
SIGKILL (a few ms); on Slurm accounting's record is waited for up to ``slurm.backend.SACCT_WAIT_S`` (1 s),
then slurmctld's is taken. The log files are read from their last :data:`TAIL_BYTES` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from workbench.events.tracebacks import last_traceback

LAST_LINES = 20
LINE_CHARS = 300
TAIL_BYTES = 64 * 1024


def gathered(controller, slot, exit_event: Optional[dict]) -> dict[str, Any]:
    """:func:`job_end_fields` for ``slot``'s attempt, which ``controller`` (``controller.loop.Controller``)
    saw end; a ``warning`` event instead of the fields that could not be read (the run goes on)."""
    view = controller.run_state.replicas.get(slot.replica)
    step = view.step if view is not None and view.attempt == slot.attempt else None
    if step is None and slot.committed_steps:
        step = slot.last_step
    try:
        return job_end_fields(controller.cluster, slot.job, controller.run_dir, exit_event, step)
    except Exception as e:
        controller.writer.emit("warning", replica=slot.replica, message=f"job end not read: {type(e).__name__}: {e}")
        return {} if step is None else {"step": step}


def job_end_fields(cluster, job, run_dir: Path, exit_event: Optional[dict], step: Optional[int]) -> dict[str, Any]:
    """The ``job`` event's fields beyond ``replica``, ``attempt``, ``job_id``, ``state``, ``clean``, ``reason``."""
    exit_event = exit_event or {}
    fields: dict[str, Any] = dict(cluster.exit_status(job).fields())
    if step is not None:
        fields["step"] = step
    paths = getattr(job, "paths", None)
    files = {}
    if paths is not None:
        files = {name: Path(getattr(paths, name)) for name in ("stdout", "stderr")}
        files = {name: path for name, path in files.items() if path.is_file()}
    if files:
        fields["log"] = {name: _relative(path, run_dir) for name, path in files.items()}
    tails = {name: file_tail(path) or "" for name, path in files.items()}
    lines = last_lines(tails.get("stdout", ""), tails.get("stderr", ""))
    if lines:
        fields["last_lines"] = lines
    if exit_event.get("exception"):
        fields.update(exception=exit_event["exception"], exception_source="exit")
    elif fields.get("signal") is None and fields.get("exit_code") not in (None, 0) and tails.get("stderr"):
        record = last_traceback(tails["stderr"])
        if record is not None:
            fields.update(exception=record, exception_source="stderr")
    if exit_event.get("first_failed") is not None:
        fields["first_failed"] = exit_event["first_failed"]
    return fields


def last_lines(stdout: str, stderr: str, limit: int = LAST_LINES) -> list[str]:
    """stdout's last lines, then stderr's: ``limit`` in all, stderr's at least half of them where it has that
    many (a traceback is there); blank lines skipped, each line cut at :data:`LINE_CHARS`."""
    out, err = ([ln[:LINE_CHARS] for ln in text.splitlines() if ln.strip()] for text in (stdout, stderr))
    n_err = min(len(err), max(limit // 2, limit - len(out)))
    n_out = min(len(out), limit - n_err)
    return out[len(out) - n_out :] + err[len(err) - n_err :]


def file_tail(path: Path, limit: int = TAIL_BYTES) -> Optional[str]:
    """The file's last ``limit`` bytes, from its first whole line; None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return None
    if size > limit and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    return data.decode(errors="replace")


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        return str(path)
