"""Undoing a timed fault (a hang's SIGCONT, a node's RESUME) from a detached helper.

The helper outlives the notebook or CLI that injected the fault, so a hang
ends even if the kernel dies. It is started with ``python -c``. Before it
sleeps until ``until`` it loads what recording needs (this module, the event
writer, the run record) under a bare ``workbench`` package, without the
package's ``__init__``, which imports pandas and pydantic: about a second on a
quiet host and several on a busy one. It then does the primitive part: signals
(each to a process whose start time still matches the one recorded, see
``workbench.procs``) and/or one command (``ip link set up``, ``scancel
--signal=CONT``), and records the undo at once as a ``fault`` event with
``action="resume"`` and ``resumed=<kind>``.

The record must land before the victim's first step after the undo: a live
check that reads the log (the network-faults notebook's "the cut-off side
commits nothing") cannot tell a commit after a partition ends from one made
while it held until the ``resume`` is there. With the import between undo and
record, a group whose link came back healed and committed 24 steps before its
``resume`` was written (CI, 2 cores under load).

A backend with more to do after the primitive (``backend_undo``: restart a
killed slurmd) imports the full package for ``Cluster.undo`` and records after
it, with the fields it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

_HELPER = """
import json, os, subprocess, sys, time, types
p = json.loads(sys.argv[1])
package = types.ModuleType("workbench")
package.__path__ = [p["package"]]
sys.modules["workbench"] = package
try:
    from workbench.undo import recorder
    record = recorder(p)
except Exception:
    record = None  # the undo still happens; recording is tried again after it
time.sleep(max(0.0, p["until"] - time.time()))
acted = False
def start_time(pid):  # workbench.procs.start_time, without importing psutil
    with open(f"/proc/{pid}/stat", "rb") as f:
        return round(int(f.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK"), 3)
for pid, host, started, sig in p.get("signals") or []:
    try:
        if started is not None and abs(start_time(pid) - started) <= 0.05:
            os.kill(pid, sig)
            acted = True
    except Exception:
        pass
if p.get("argv"):
    subprocess.run(p["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    acted = True
if acted or p.get("always"):
    done = time.time()
    if record is None:
        from workbench.undo import recorder
        record = recorder(p)
    record(done)
"""

_REPO_ROOT = str(Path(__file__).resolve().parents[1])


def later(run_dir, kind: str, seconds: float, signals: Optional[list] = None, argv: Optional[list[str]] = None,
          fields: Optional[dict] = None, env: Optional[dict] = None, always: bool = False,
          backend_undo: bool = False) -> list:
    """Undo fault ``kind`` ``seconds`` from now; ``signals``: ``[pid, host, started, sig]`` each;
    ``backend_undo``: then call the backend's ``Cluster.undo``. Returns the helper's identity
    ``[pid, host, started]`` (a stop mid-fault ends it)."""
    payload = {"until": time.time() + float(seconds), "run_dir": str(run_dir), "kind": kind,
               "signals": signals or [], "argv": argv, "fields": fields or {}, "always": always,
               "backend_undo": backend_undo, "package": str(Path(__file__).resolve().parent)}
    helper = subprocess.Popen(
        [sys.executable, "-c", _HELPER, json.dumps(payload)], env=env or dict(os.environ), cwd=_REPO_ROOT,
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    from .procs import HOST, start_time

    return [helper.pid, HOST, start_time(helper.pid)]


def recorder(payload: dict) -> Callable[[float], None]:
    """In the helper, before it sleeps: a function that records the ``resume`` event at time ``t``.

    Everything it needs is imported and the run record read here, so that recording after the
    undo is one write; unless ``backend_undo``, whose ``Cluster.undo`` needs the full package.
    """
    from .events import EventWriter
    from .rundir import read_record

    run_dir = Path(payload["run_dir"])
    run_record = read_record(run_dir)
    writer = EventWriter(run_dir, f"control-{os.getpid()}", run=run_record["run_id"])

    def record(t: float) -> None:
        extra = {}
        if payload.get("backend_undo"):
            from .cluster import make_cluster
            from .spec import Spec

            extra = make_cluster(Spec.model_validate(run_record["spec"]), run_dir).undo(payload) or {}
        writer.emit("fault", **{"t": t, "action": "resume", "resumed": payload["kind"], "origin": "schedule",
                                **payload["fields"], **extra})

    return record
