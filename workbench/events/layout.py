"""Where the event log lives and who writes it: ``<run_dir>/events/<writer>.jsonl``, one file per writer.

One process owns each file and only appends to it (``workbench.events.writer``), so no
file is ever written by two processes and a reader needs no lock (``workbench.events.reader``).
A sweep's directory has the same layout, with the sweep controller as its writer.
"""

from __future__ import annotations

from enum import StrEnum

EVENTS_DIR = "events"  # <run_dir>/events/<writer>.jsonl (and <sweep_dir>/events/ for a sweep)


class Writer(StrEnum):
    """A process that owns one file of ``<run_dir>/events`` (``file``: its name), and what it is (``who``)."""

    file: str
    who: str

    def __new__(cls, value: str, file: str, who: str) -> Writer:
        member = str.__new__(cls, value)
        member._value_ = value
        member.file, member.who = file, who
        return member

    CONTROLLER = "controller", "controller.jsonl", "the run controller: submits, relaunches, lighthouse, run end"
    REPLICA = (
        "replica",
        "replica-<r>.attempt-<a>.jsonl",
        (
            "one per replica group and attempt; for TorchTitan the job process, whose rank 0 writes the rest of the "
            "replica's events to `replica-<r>.attempt-<a>.rank-0.jsonl` and whose tasks on other nodes write "
            "`replica-<r>.attempt-<a>.task-<k>.jsonl`; each rank of the checkpoint-restart baselines (ddp-restart, "
            "titan-restart) writes its own, its rank as `<r>`"
        ),
    )
    CONTROL = (
        "control",
        "control-<pid>.jsonl",
        (
            "a notebook, CLI or dashboard that injected a fault (or a fault's timed undo), took stacks, or that ended "
            "a run or a sweep whose controller was gone"
        ),
    )
    SPARE = "spare", "spare-<i>.jsonl", "a hot spare until it is assigned a replica group"
    LAUNCHER = "launcher", "launcher.attempt-<a>.jsonl", "the ddp-restart and titan-restart baselines' job process"
    SWEEP = (
        "sweep",
        "controller.jsonl",
        (
            "a sweep's controller, in `<run_root>/sweeps/<sweep-id>/events/`: start, submit (point -> run dir), "
            "point_error, sweep_end"
        ),
    )


ANY_WRITER: tuple[Writer, ...] = tuple(Writer)
