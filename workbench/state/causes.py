"""Why each attempt ended: one :class:`EndCause` per ended attempt, joined from the three events that tell it.

An attempt's end is told by up to three writers (``workbench.events.end_fields``), and they arrive
in no fixed order across polls: the trainer's ``exit`` (its reason, the exception it caught, how each
process of a group ended), the controller's ``job`` once the scheduler's job is gone (the exit code or
the signal, the OOM killer, Slurm's final state and node, the step, the last lines), and a ``fault``
whose kind ends the process (``ends_process`` in ``workbench.faults.kinds``), aimed at this attempt or
at a node the group runs on. :class:`CauseLedger` (part of :class:`~workbench.state.fold.RunState`,
``RunState.ends``) merges each into the attempt's record as it comes, so folding a log in pieces gives
what folding it at once gives.

Attribution. An injected end keeps its own: once a process-ending fault names the attempt (its
``attempt``, else the group's attempt when the fault was folded), the record is ``injected`` whatever
the ``job`` says after (the SIGKILL of a dashboard kill is that kill, not a death to explain). A one-job
trainer's ranks (ddp-restart, MaxText: ``CauseLedger.one_job``) end together, so a fault that ends one of
its processes explains every rank's end of that attempt and the job's. Otherwise the end is *planned*
(the trainer completed, was stopped, or the scheduler preempted it: no failure) or a failure, whose
cause is read in this order: the kernel's OOM killer, the rank that failed first (what it raised, else its
signal or exit code), an exception, Slurm's state, the signal, the exit code, the ``exit``'s ``error`` line.
"""

from __future__ import annotations

import dataclasses
import re
import signal as _signal
from typing import Any, Iterator, Optional

from workbench.events.tracebacks import one_line

PLANNED_REASONS = ("completed", "stopped", "preempted")
ORIGINS = {
    "button": "the dashboard",
    "cli": "the CLI",
    "api": "the API",
    "schedule": "the schedule",
    "watchdog": "the hang watchdog",
}
SLURM_SAYS_NOTHING_MORE = ("COMPLETED", "FAILED", "OUT_OF_MEMORY")  # the exit code, the signal or ``oom`` say it
ROW = tuple(
    "replica attempt t step planned cause summary injected origin reason signal exit_code oom exception where "
    "slurm_state node first_failed noticed_s log".split()
)
_SIGNAL = re.compile(r"^SIG[A-Z0-9]{1,12}$")  # a name, or ``SIG<n>`` for a real-time signal (``cluster.exits``)
_SLURM_STATE = re.compile(r"^[A-Z_]{1,32}$")


def _int(x: Any) -> Optional[int]:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _str(x: Any) -> Optional[str]:
    return x if isinstance(x, str) and x else None


def signal_name(x: Any) -> Optional[str]:
    """A signal by name (``SIGKILL``) from a name or a number; None for anything else."""
    if _int(x) is not None:
        try:
            return _signal.Signals(x).name
        except ValueError:
            return None
    name = _str(x)
    if name is None:
        return None
    name = name if name.startswith("SIG") else "SIG" + name
    return name if _SIGNAL.match(name) else None


def _exception(x: Any) -> Optional[dict]:
    if not isinstance(x, dict) or not _str(x.get("type")):
        return None
    given = x.get("frames")
    frames = [
        {"file": str(f.get("file")), "line": _int(f.get("line")), "function": str(f.get("function"))}
        for f in (given if isinstance(given, list) else [])
        if isinstance(f, dict)
    ]
    out = {"type": x["type"], "message": str(x.get("message") or ""), "frames": frames}
    return {**out, "rank": x["rank"]} if _int(x.get("rank")) is not None else out


def _processes(x: Any) -> Optional[list]:
    if not isinstance(x, list):
        return None
    return [
        {"rank": _int(p.get("rank")), "exit_code": _int(p.get("exit_code")), "signal": signal_name(p.get("signal"))}
        for p in x
        if isinstance(p, dict)
    ]


def _lines(x: Any) -> Optional[list]:
    if isinstance(x, str):
        return x.splitlines()
    return [str(s) for s in x] if isinstance(x, list) else None


def _files(x: Any) -> list[str]:
    """The ``log`` field as a list of paths (a path, a list of them, or ``{"stdout": .., "stderr": ..}``)."""
    values = x.values() if isinstance(x, dict) else x if isinstance(x, list) else [x]
    return [v for v in values if _str(v)]


def where(exception: dict) -> Optional[str]:
    """``file:line in function`` of the innermost frame in the workbench's code (else the innermost one)."""
    frames = exception.get("frames") or []
    if not frames:
        return None
    f = next((f for f in reversed(frames) if "/workbench/" in f["file"]), frames[-1])
    path = f["file"]
    for root in ("/workbench/", "/site-packages/", "/dist-packages/"):  # the path a reader knows the file by
        if root in path:
            path = path.rsplit(root, 1)[-1]
            break
    else:
        path = "/".join(path.split("/")[-2:])
    return f"{path}:{f['line']} in {f['function']}"


@dataclasses.dataclass
class EndCause:
    """One ended attempt: what each writer said of its end, merged; see the module docstring."""

    replica: int
    attempt: int
    said_step: Optional[int] = None  # the step the exit (else the job) said it reached
    fault: Optional[dict] = None  # the first process-ending fault aimed at it: kind, origin, t, target, node
    reason: Optional[str] = None  # the exit's reason, else the job's (``died``: no exit)
    clean: Optional[bool] = None
    signal: Optional[str] = None
    exit_code: Optional[int] = None
    oom: Optional[str] = None
    exception: Optional[dict] = None
    exception_source: Optional[str] = None
    error: Optional[str] = None
    slurm_state: Optional[str] = None
    slurm_exit_code: Optional[str] = None
    node: Optional[str] = None
    first_failed: Optional[int] = None
    processes: Optional[list] = None
    last_lines: Optional[list] = None
    log: list = dataclasses.field(default_factory=list)
    exit_t: Optional[float] = None
    job_t: Optional[float] = None  # when the controller saw the job gone
    step_seen: Optional[int] = None  # the fold's step of the attempt when it learnt of the end (a fallback)

    # -- merging, by the ledger ------------------------------------------------
    def add_exit(self, e: dict, t: float) -> None:
        if self.exit_t is not None and self.exit_t <= t:  # several exits of one attempt: the first counts
            return
        self.exit_t = t
        self.reason = _str(e.get("reason")) or self.reason
        self.said_step = _int(e.get("step")) if _int(e.get("step")) is not None else self.said_step
        self.error = _str(e.get("error")) or self.error
        exc = _exception(e.get("exception"))
        if exc is not None:  # the trainer's own record wins over one read back from stderr
            self.exception, self.exception_source = exc, "exit"
        self.processes = _processes(e.get("processes")) or self.processes
        self.first_failed = _int(e.get("first_failed")) if e.get("first_failed") is not None else self.first_failed

    def add_job(self, e: dict, t: float) -> None:
        self.job_t = t if self.job_t is None else min(self.job_t, t)
        self.clean = bool(e.get("clean"))
        if self.exit_t is None:
            self.reason = _str(e.get("reason")) or self.reason
        if self.said_step is None:
            self.said_step = _int(e.get("step"))
        if self.exception is None:
            self.exception = _exception(e.get("exception"))
            self.exception_source = _str(e.get("exception_source")) if self.exception else None
        for name, value in (
            ("signal", signal_name(e.get("signal"))),
            ("exit_code", _int(e.get("exit_code"))),
            ("oom", _str(e.get("oom")) or ("yes" if e.get("oom") is True else None)),
            ("slurm_state", _str(e.get("slurm_state"))),
            ("slurm_exit_code", _str(e.get("slurm_exit_code"))),
            ("node", _str(e.get("node"))),
            ("first_failed", _int(e.get("first_failed"))),
            ("last_lines", _lines(e.get("last_lines"))),
        ):
            if getattr(self, name) is None and value is not None:
                setattr(self, name, value)
        self.log = self.log or _files(e.get("log"))

    def add_fault(self, e: dict, t: float) -> None:
        if self.fault is not None and self.fault["t"] <= t:  # two faults on one attempt: the first ended it
            return
        self.fault = {
            "kind": e["action"],
            "origin": _str(e.get("origin")),
            "t": t,
            "target": e.get("target"),
            "node": _str(e.get("node")),
        }

    # -- answers -----------------------------------------------------------------
    @property
    def injected(self) -> Optional[dict]:
        """The fault that ended it; None if it outlived it and completed (seen: a 5 s ``slurmd_kill``, which leaves steps be)."""
        return None if self.reason == "completed" else self.fault

    @property
    def t(self) -> Optional[float]:
        """When it ended: the fault's time, else the exit's, else the job's (when the controller saw it gone)."""
        if self.injected is not None:
            return self.injected["t"]
        return self.exit_t if self.exit_t is not None else self.job_t

    @property
    def planned(self) -> bool:
        """Not a failure: it completed, was stopped, or the scheduler preempted it (an injected end is no plan)."""
        if self.injected is not None:
            return False
        state = (self.slurm_state or "").split(" ")[0]
        return self.reason in PLANNED_REASONS or state == "PREEMPTED"

    @property
    def unexplained(self) -> bool:
        """A failure no fault explains: what the soak exists to find."""
        return not self.planned and self.injected is None

    @property
    def step(self) -> Optional[int]:
        """The step it reached: the exit's, else the job's, else the fold's when it learnt of the end."""
        return self.said_step if self.said_step is not None else self.step_seen

    def _rank_how(self) -> Optional[str]:
        """How the first failed rank ended: its signal or exit code (``processes``)."""
        for p in self.processes or []:
            if p["rank"] == self.first_failed:
                if p["signal"]:
                    return p["signal"]
                if p["exit_code"] is not None:
                    return f"exit code {p['exit_code']}"
        return None

    def _first_failed_exception(self) -> Optional[dict]:
        """The exception of the rank that failed first, if that rank exited (one a signal killed raised nothing,
        whatever its stderr holds); one that names another rank is a peer's, no cause."""
        exc, how = self.exception, self._rank_how()
        if exc is None or self.first_failed is None or (how or "").startswith("SIG"):
            return None
        return exc if exc.get("rank", self.first_failed) == self.first_failed else None

    def cause(self) -> str:
        """The cause in a small fixed vocabulary (a Prometheus label): ``injected:<kind>``, ``completed``,
        ``stopped``, ``preempted``, ``oom``, ``exception``, ``slurm:<STATE>``, a signal's name, ``exit_code``,
        ``unknown``."""
        if self.injected is not None:
            return f"injected:{self.injected['kind']}"
        if self.planned:
            return self.reason if self.reason in PLANNED_REASONS else "preempted"
        if self.oom:
            return "oom"
        if self._first_failed_exception() is not None:
            return "exception"
        how = self._rank_how() if self.first_failed is not None else None
        if how is not None:
            return how if how.startswith("SIG") else "exit_code"
        if self.exception is not None:
            return "exception"
        state = self._slurm_tells()
        if state:
            return f"slurm:{state}"
        if self.signal:
            return self.signal
        if self.exit_code is not None:
            return "exit_code"
        return "exception" if self.error else "unknown"

    def _slurm_tells(self) -> Optional[str]:
        state = (self.slurm_state or "").split(" ")[0]
        return state if _SLURM_STATE.match(state) and state not in SLURM_SAYS_NOTHING_MORE else None

    def summary(self) -> str:
        """The cause in one line a user reads: ``SIGSEGV at step 41 (not injected)``."""
        step = self.step
        at = f" at step {step}" if step is not None else ""
        if self.injected is not None:
            f = self.injected
            of = f" of node {f['node']}" if f["node"] and f["target"] != self.replica else ""
            of = of or (f" of replica {f['target']}" if f["target"] != self.replica else "")
            return f"{f['kind']}{of} from {ORIGINS.get(f['origin'] or '', f['origin'] or 'unknown')}{at}"
        if self.planned:
            return {"completed": "completed", "stopped": "stopped"}.get(self.reason or "", "preempted") + at
        if self.oom:
            rank = f" (rank {self.first_failed})" if self.first_failed is not None else ""
            return f"killed by the kernel's OOM killer{at}{rank}"
        if self.first_failed is not None:
            exc = self._first_failed_exception()
            if exc is not None:  # what it raised, and where, says more than its exit code 1
                w = where(exc)
                return f"rank {self.first_failed} failed first: {one_line(exc)}{at}" + (f" ({w})" if w else "")
            how = self._rank_how() or (one_line(self.exception) if self.exception else None)
            line = f"rank {self.first_failed} failed first" + (f": {how}" if how else "") + at
            return line + (" (not injected)" if how and how.startswith("SIG") else "")
        if self.exception is not None:
            w = where(self.exception)
            return one_line(self.exception) + at + (f" ({w})" if w else "")
        state = self._slurm_tells()
        if state:
            return f"Slurm {self.slurm_state}" + (f" on {self.node}" if self.node else "") + at
        if self.signal:
            return f"{self.signal}{at} (not injected)"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}{at}"
        if self.error:
            return f"{self.error}{at}"
        return f"{self.reason or 'died'}{at} (no exit, no exit status recorded)"

    def row(self) -> dict:
        """One flat row (``Run.ends()``): :data:`ROW` columns."""
        f, exc = self.injected or {}, self.exception
        return {
            "replica": self.replica,
            "attempt": self.attempt,
            "t": self.t,
            "step": self.step,
            "planned": self.planned,
            "cause": self.cause(),
            "summary": self.summary(),
            "injected": f.get("kind"),
            "origin": f.get("origin"),
            "reason": self.reason,
            "signal": self.signal,
            "exit_code": self.exit_code,
            "oom": self.oom,
            "exception": one_line(exc) if exc else self.error,
            "where": where(exc) if exc else None,
            "slurm_state": self.slurm_state,
            "node": self.node,
            "first_failed": self.first_failed,
            "noticed_s": None if self.job_t is None or self.t is None else self.job_t - self.t,
            "log": ", ".join(self.log) or None,
        }

    def as_dict(self) -> dict:
        """The full record (JSON), with ``cause``, ``summary``, ``planned`` and the step it ended at."""
        d = dataclasses.asdict(self)
        d.update(t=self.t, step=self.step, cause=self.cause(), summary=self.summary(), planned=self.planned)
        d.update(injected=self.injected)  # the field is ``fault``: see ``injected``
        del d["step_seen"], d["said_step"], d["fault"]
        return d


class CauseLedger:
    """Every ended attempt's :class:`EndCause`, by (replica, attempt); the fold calls it with each end event
    and the group's :class:`~workbench.state.replica.ReplicaView`, whose ``last_end`` it keeps."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], EndCause] = {}
        self.one_job = False  # the run's ranks are one job (a checkpoint-restart trainer): they end together
        self._job_faults: dict[int, tuple[dict, float]] = {}  # one_job: attempt -> the first fault that ended it

    def __iter__(self) -> Iterator[EndCause]:
        return iter(sorted(self.records.values(), key=lambda c: (c.t or 0.0, c.replica, c.attempt)))

    def __len__(self) -> int:
        return len(self.records)

    def get(self, replica: int, attempt: int) -> Optional[EndCause]:
        return self.records.get((replica, attempt))

    def last(self, replica: int, unplanned: bool = False) -> Optional[EndCause]:
        """The group's newest attempt's end (``unplanned``: its newest that was not planned)."""
        ends = [c for (r, _), c in self.records.items() if r == replica and not (unplanned and c.planned)]
        return max(ends, key=lambda c: c.attempt, default=None)

    def _record(self, view: Any, attempt: int) -> EndCause:
        key = (view.replica, attempt)
        end = self.records.get(key)
        if end is None:
            end = self.records[key] = EndCause(view.replica, attempt)
            if attempt in self._job_faults:
                end.add_fault(*self._job_faults[attempt])
            if view.last_end is None or attempt >= view.last_end.attempt:
                view.last_end = end
        if end.step_seen is None and attempt == view.attempt:
            end.step_seen = view.step
        return end

    def exit(self, e: dict, t: float, view: Any) -> None:
        self._record(view, _int(e.get("attempt")) or 0).add_exit(e, t)

    def job(self, e: dict, t: float, view: Any) -> None:
        self._record(view, _int(e.get("attempt")) or 0).add_job(e, t)

    def fault(self, e: dict, t: float, view: Any) -> None:
        """A fault of a kind that ends the process hit ``view``'s group (its target, or a group on its node)."""
        attempt = _int(e.get("attempt")) if e.get("target") == view.replica else None
        attempt = view.attempt if attempt is None else attempt
        self._record(view, attempt).add_fault(e, t)
        if self.one_job:
            first = self._job_faults.get(attempt)
            if first is None or t < first[1]:
                self._job_faults[attempt] = (e, t)
            for (_, a), end in self.records.items():
                if a == attempt:
                    end.add_fault(e, t)
