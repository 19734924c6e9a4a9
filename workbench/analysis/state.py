"""Where a run and its replica groups stand, and its processes, from events only.

Kept as they were until the run-state fold of the event log replaces them.
"""

from __future__ import annotations

from typing import Optional


def run_state(events: list[dict]) -> str:
    ends = [e for e in events if e.get("kind") == "run_end"]
    if ends:
        return ends[-1].get("state", "failed")
    if any(e.get("kind") == "step" for e in events):
        return "running"
    if any(e.get("kind") == "start" for e in events):
        return "starting"
    return "pending"


def controller_pid(events: list[dict]) -> Optional[int]:
    for e in events:
        if e.get("kind") == "start" and e.get("role") == "controller":
            return e.get("pid")
    return None


def all_pids(events: list[dict]) -> list[int]:
    """PIDs of this host's processes of the run (controller, lighthouse, local jobs)."""
    import socket

    here = socket.gethostname()
    pids = []
    for e in events:
        if e.get("kind") == "start" or (e.get("kind") == "lighthouse" and e.get("state") == "up"):
            if e.get("pid") and e["pid"] not in pids and e.get("host", here) == here:
                pids.append(e["pid"])
    return pids


def replica_states(events: list[dict], replicas: int) -> dict[int, dict]:
    """Per replica group: state, attempt, step, pid, from events only."""
    out = {r: {"state": "pending", "attempt": 0, "step": 0, "pid": None, "t": None} for r in range(replicas)}
    for e in events:
        kind = e["kind"]
        r = e.get("target") if kind in ("fault", "hang") else e.get("replica")
        if r not in out or e.get("role") == "controller":
            continue
        s = out[r]
        if e.get("attempt", 0) < s["attempt"] and kind not in ("fault", "hang"):
            continue
        if kind == "submit":
            s.update(attempt=e.get("attempt", 0), state="pending")
        elif kind == "start":
            s.update(attempt=e.get("attempt", 0), state="starting", pid=e.get("pid"))
        elif kind == "heal":
            s.update(state="healing", step=e.get("step", s["step"]))
        elif kind == "step":
            s["step"] = e.get("step", s["step"])
            s["state"] = "participating" if e.get("participating", True) else "healing"
        elif kind == "exit" and e.get("attempt", 0) == s["attempt"]:
            s["state"] = "finished" if e.get("reason") == "completed" else "dead"
        elif kind == "job" and e.get("attempt", 0) == s["attempt"] and not e.get("clean"):
            s["state"] = "dead"
        elif kind == "fault":
            if e.get("action") == "kill":
                s["state"] = "dead"
            elif e.get("action") == "hang":
                s["state"] = "hung"
            elif e.get("action") == "resume":
                s["state"] = "participating"
        elif kind == "hang":
            s["state"] = "hung"
        s["t"] = e.get("t")
    return out
