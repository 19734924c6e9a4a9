"""Which replica group is slow: a straggler score per group, named before a slow group turns into a hang.

The two scores of NVIDIA Resiliency Extension's straggler detection (``nvidia_resiliency_ext.straggler``),
each from 0 (worst) to 1 (best), the ratio of a reference time to the group's current one:

* **relative**: the fastest group's window time / this group's (0.5: twice as slow as the fastest group);
* **individual**: this group's best window time so far / its current one (0.5: twice as slow as it
  has been).

A group's window time is the mean of its own step times (the time it spent on each step, not
waiting for its peers) over its last :data:`~workbench.state.steptimes.WINDOW` steps, or its last
:data:`~workbench.state.steptimes.MIN_WINDOW_S` seconds of steps where those are more, kept by the run-state fold
(:mod:`workbench.state.steptimes`, which says how a step's own time is read from each trainer's
events). A group is **flagged** when its relative score is below :data:`RELATIVE_THRESHOLD`.

Why these numbers: torchft-lite ``demo``, three groups (three busy processes on this 2-core machine,
so the load is 3 or more by itself), straggler on group 1 (``bench/straggler.py``; runs of 30 s (with
``torchft.step_timing``), 100 s and 300 s fault-free; the 300 s one at load 2.1 rising to 5.3):

* Own time, not ``step_time_s``: in synchronous DDP the fast groups wait for the slow one in the
  all-reduce, so all three report the same step time. On ``step_time_s`` the throttled group's
  relative score stayed mostly at 0.8-1.0 during the fault while its peers' fell as low as 0.41.
* The mean, not NVRx's median. A ``straggler`` fault is a CFS quota (25 % of a CPU per 100 ms);
  a demo step's work is ~12 ms, so the throttled group runs some steps at full speed and stalls
  ~60-70 ms on the others (and some of its stalls fall inside its all-reduce, so they count as
  waiting). Its own times are bimodal, and a window's median mostly sits on the fast mode: with
  the median (20 steps) the group was named in 7 % of the samples after its first window, with
  the mean in 57-90 %.
* 20 steps *and* at least 3 s (:data:`~workbench.state.steptimes.MIN_WINDOW_S`): a demo step is
  ~20 ms, and on an oversubscribed machine a group the scheduler passes over for a second is
  slow for 50 steps. With 10 steps the lowest fault-free relative score over 300 s was 0.34;
  with 20, 0.49, and a 60 s run of the test flagged a group whose own times had tripled for
  about 20 steps. With 20 steps and 3 s the lowest fault-free scores were 0.76 and 0.87 (two
  300 s runs, the second at load 1.6-3.5), 0.91 (100 s) and 0.90 (30 s). The cost is time to name: the throttled group was first named after
  53-59 of its steps (2.4-3.2 s) from the fault event, then in 89-97 % of the samples after its
  40th step. (With real steps of seconds, 20 steps are more than 3 s and the step count rules.)
* The issue's criterion (the throttled group has the worst score within 10 of its steps; nothing
  flagged fault-free) is met on steps longer than the quota's 0.1 s period, as a real trainer's
  are: the demo's decoder at dim 256, sequence 64, batch 16 (~0.25 s a step on this machine, so
  20 steps span ~5 s and the step count rules, not the 3 s floor; ``tests/test_straggler.py``,
  ``bench/straggler.py``), each of the three groups throttled in turn (12 faults, 4 runs, load
  2-4.6): worst from its 1st-2nd step after the fault event (median 1) and at every step after
  it through its 10th, its relative score there 0.48-0.72; flagged at its 10th-12th step at load
  2 (at load 4, steps of ~0.39 s, not within 12). Fault-free lowest relative score 0.84-0.88 over
  60 s, 0.857 over 300 s (load 1.7 rising to 4.6; lowest individual 0.42), nothing flagged. No
  change to the window was needed: these steps fill 20 in 5-8 s. On the demo's 20 ms steps the
  throttle shows only on some steps, and the window's 3 s is 150 of them.
* Threshold 0.5: the lowest fault-free score is 0.76; the throttled group's score is 0.1-0.45
  once its window is full.
* The individual score is shown, not flagged on: a machine-wide slowdown lowers every group's at
  once (fault-free lowest 0.32 over 100 s, 0.17 over 300 s, with 20-step windows, every group
  together), which the relative score cancels.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Optional

from workbench.state.fold import RunState
from workbench.state.steptimes import WINDOW

RELATIVE_THRESHOLD = 0.5
SCORED_STATES = ("participating", "healing", "starting")


@dataclasses.dataclass(frozen=True)
class Score:
    """One group's scores now. ``relative`` is None while fewer than two groups have a full window."""

    replica: int
    relative: Optional[float]
    individual: Optional[float]
    window_s: float  # its current window time
    best_s: float  # its best window time so far
    flagged: bool

    def as_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in dataclasses.asdict(self).items()}


def scores(state: RunState) -> dict[int, Score]:
    """Each running group with a full window of the current attempt: its scores (module docstring)."""
    current = {}
    for r, g in state.step_times.groups.items():
        v = state.replicas.get(r)
        now = g.current()
        if v is None or v.state not in SCORED_STATES or g.attempt != v.attempt or not now:
            continue
        current[r] = (now, g.best or now)
    fastest = min((now for now, _ in current.values()), default=None)
    out = {}
    for r, (now, best) in sorted(current.items()):
        relative = fastest / now if fastest is not None and len(current) > 1 else None
        individual = min(1.0, best / now)
        flagged = relative is not None and relative < RELATIVE_THRESHOLD
        out[r] = Score(r, relative, individual, now, best, flagged)
    return out


def scores_of(events: Iterable[dict], replicas: int) -> dict[int, Score]:
    """The scores after a list of events (a finished run's, or hand-written ones)."""
    state = RunState(replicas)
    state.apply(events)
    return scores(state)


def straggler(by_group: dict[int, Score]) -> Optional[int]:
    """The flagged group with the lowest relative score, or None."""
    flagged = [s for s in by_group.values() if s.flagged]
    return min(flagged, key=lambda s: s.relative or 0.0).replica if flagged else None


def summary(state: RunState) -> dict:
    """For ``Run.status()``: ``straggler`` (the group named, or None), ``window`` and each group's scores."""
    by_group = scores(state)
    return {
        "straggler": straggler(by_group),
        "window": WINDOW,
        "threshold": RELATIVE_THRESHOLD,
        "groups": {str(r): s.as_dict() for r, s in by_group.items()},
    }


def line(summary_: dict) -> Optional[str]:
    """``workbench status``'s line: each scored group's relative/individual score, the straggler named."""
    groups = summary_.get("groups") or {}
    if not groups:
        return None
    parts = [
        f"{r} {_fmt(s['relative'])}/{_fmt(s['individual'])}" + (" SLOW" if s["flagged"] else "")
        for r, s in groups.items()
    ]
    named = summary_.get("straggler")
    head = f"straggler: replica {named}" if named is not None else "straggler: none"
    return f"  {head}  (score relative/individual: {', '.join(parts)})"


def _fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def trace(events: Iterable[dict], replicas: int) -> Iterator[tuple[dict, dict[int, Score]]]:
    """Each ``step`` event of ``events`` (in time order) with the scores just after it, as a live fold
    would have shown them: for a finished run's figures (``bench/straggler.py``, the tests)."""
    state = RunState(replicas)
    for e in sorted(events, key=lambda e: e.get("t") or 0.0):
        state.apply([e])
        if e.get("kind") == "step":
            yield e, scores(state)
