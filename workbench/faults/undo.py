"""Undoing a timed fault (a hang's SIGCONT, a node's RESUME) from a detached helper.

The helper outlives the notebook or CLI that injected the fault, so a hang
ends even if the kernel dies. It is this module, started as ``python -m
workbench.faults.undo PAYLOAD``. Before it sleeps until ``until`` it loads what
recording needs (the event writer, the run record) and what proving a process
the run's needs (``workbench.cluster.procs``, the run's marker); ``import
workbench`` is lazy (PEP 562), so that is all it loads, not pandas and pydantic,
which took about a second on a quiet host and several on a busy one. It then
does the primitive part: signals (each to a process whose start time still
matches the one recorded and that proves it is the run's: its owner and the
run's marker in its environment, see ``workbench.cluster.procs``; the helper
carries the marker too, so a stop mid-fault can end it) and/or one command
(``ip link set up``, ``scancel --signal=CONT``), and records the undo at once
as a ``fault`` event with ``action="resume"`` and ``resumed=<kind>``.

The record must land before the victim's first step after the undo: a live
check that reads the log (the network-faults notebook's "the cut-off side
commits nothing") cannot tell a commit after a partition ends from one made
while it held until the ``resume`` is there. With the import between undo and
record, a group whose link came back healed and committed 24 steps before its
``resume`` was written (CI, 2 cores under load).

Whatever a backend's undo needs is that one command (a killed slurmd's
restart is the command its cluster records), so this module imports no
backend and no spec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from workbench.paths import CHECKOUT


def later(
    run_dir,
    kind: str,
    seconds: float,
    signals: Optional[list] = None,
    argv: Optional[list[str]] = None,
    fields: Optional[dict] = None,
    env: Optional[dict] = None,
) -> list:
    """Undo fault ``kind`` ``seconds`` from now; ``signals``: ``[pid, host, started, sig]`` each; ``argv``:
    one command. Returns the helper's identity ``[pid, host, started]`` (a stop mid-fault ends it)."""
    # not at the top: the helper runs this module, and loads the rest as it needs it (``recorder``, ``prover``)
    from workbench.cluster.procs import HOST, Marker, start_time

    marker = Marker.of(run_dir)
    payload = {
        "until": time.time() + float(seconds),
        "run_dir": str(run_dir),
        "kind": kind,
        "signals": signals or [],
        "argv": argv,
        "fields": fields or {},
    }
    helper = subprocess.Popen(
        [sys.executable, "-m", "workbench.faults.undo", json.dumps(payload)],
        env={**(env or os.environ), **(marker.env() if marker else {})},
        cwd=str(CHECKOUT),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return [helper.pid, HOST, start_time(helper.pid)]


def recorder(payload: dict) -> Callable[[float], None]:
    """In the helper, before it sleeps: a function that records the ``resume`` event at time ``t``.

    Everything it needs is imported and the run record read here, so that recording after the
    undo is one write. Imported here, not at the top: where the import or the read fails, ``main``
    still undoes, and tries to record after it.
    """
    from workbench.events.writer import EventWriter
    from workbench.run.rundir import read_record

    run_dir = Path(payload["run_dir"])
    run_record = read_record(run_dir)
    writer = EventWriter(run_dir, f"control-{os.getpid()}", run=run_record["run_id"])

    def record(t: float) -> None:
        writer.emit(
            "fault",
            **{"t": t, "action": "resume", "resumed": payload["kind"], "origin": "schedule", **payload["fields"]},
        )

    return record


def prover(payload: dict) -> Callable[[list], bool]:
    """In the helper, before it sleeps: a function that sends one ``[pid, host, started, sig]`` of the
    payload, if that process still is the recorded one and proves it is the run's (``workbench.cluster.procs``:
    a process that does not, an impostor's PID written into the payload say, is never signalled)."""
    from workbench.cluster.procs import Marker, Proc

    marker = Marker.of(payload["run_dir"])

    def send(entry: list) -> bool:
        pid, host, started, sig = entry
        return Proc(int(pid), host, started).signal(int(sig), marker)

    return send


def main(payload: dict) -> None:
    """The helper: load the recorder and the proof, sleep until ``until``, undo, record at once."""
    try:
        record: Optional[Callable[[float], None]] = recorder(payload)
    except Exception:
        record = None  # the undo still happens; recording is tried again after it
    try:
        send: Optional[Callable[[list], bool]] = prover(payload) if payload.get("signals") else None
    except Exception:
        send = None  # nothing proven, nothing signalled; the command (if any) still runs
    time.sleep(max(0.0, payload["until"] - time.time()))
    acted = False
    for entry in payload.get("signals") or []:
        try:
            acted = bool(send and send(entry)) or acted
        except Exception:
            pass
    if payload.get("argv"):
        subprocess.run(payload["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        acted = True
    if acted:
        done = time.time()
        if record is None:
            record = recorder(payload)
        record(done)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
