"""Undoing a timed fault (a hang's SIGCONT, a node's RESUME) from a detached helper.

The helper outlives the notebook or CLI that injected the fault, so a hang
ends even if the kernel dies. It is started with ``python -c`` and imports
nothing heavy before acting: importing the package takes seconds on a busy
host, which would lengthen a short hang. It sleeps until ``until``, then
does the primitive part: signals (each to a process whose start time still
matches the one recorded, see ``workbench.procs``) and/or one command (for
example ``scancel --signal=CONT``). Only then does it import the backend for
anything left (``Cluster.undo``: restart a slurmd) and record the undo as a
``fault`` event with ``action="resume"`` and ``resumed=<kind>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

_HELPER = """
import json, os, subprocess, sys, time
p = json.loads(sys.argv[1])
time.sleep(max(0.0, p["until"] - time.time()))
acted = False
def start_time(pid):  # workbench.procs.start_time, without importing the package
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
done = time.time()  # the undo's time, not the package import's after it (~1 s on a busy host)
if acted or p.get("always"):
    from workbench.undo import record
    record(p, done)
"""

_REPO_ROOT = str(Path(__file__).resolve().parents[1])


def later(run_dir, kind: str, seconds: float, signals: Optional[list] = None, argv: Optional[list[str]] = None,
          fields: Optional[dict] = None, env: Optional[dict] = None, always: bool = False) -> list:
    """Undo fault ``kind`` ``seconds`` from now; ``signals``: ``[pid, host, started, sig]`` each.
    Returns the helper's identity ``[pid, host, started]`` (a stop mid-fault ends it)."""
    payload = {"until": time.time() + float(seconds), "run_dir": str(run_dir), "kind": kind,
               "signals": signals or [], "argv": argv, "fields": fields or {}, "always": always}
    helper = subprocess.Popen(
        [sys.executable, "-c", _HELPER, json.dumps(payload)], env=env or dict(os.environ), cwd=_REPO_ROOT,
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    from .procs import HOST, start_time

    return [helper.pid, HOST, start_time(helper.pid)]


def record(payload: dict, t: float) -> None:
    """In the helper: the backend's remaining undo, then the ``resume`` event."""
    from .cluster import make_cluster
    from .faults import control_writer
    from .rundir import read_record
    from .spec import Spec

    run_dir = Path(payload["run_dir"])
    record = read_record(run_dir)
    spec = Spec.model_validate(record["spec"])
    extra = make_cluster(spec, run_dir).undo(payload) or {}
    fields = {"t": t, "action": "resume", "resumed": payload["kind"], "origin": "schedule",
              **payload["fields"], **extra}
    control_writer(run_dir, spec_run_id=record["run_id"]).emit("fault", **fields)
