"""Each replica group's recent step times, kept as the fold applies ``step`` events: the straggler score's input.

Per group: the *own* times of its current attempt's last :data:`WINDOW` steps, or of its last
:data:`MIN_WINDOW_S` seconds of steps where those are more, and the best (lowest) window time it ever
had, over all its attempts. :mod:`workbench.analysis.straggler` turns these into scores.

A step's own time is the time the group itself spent on it, not waiting for its peers: in
synchronous data parallelism every group's ``step_time_s`` is the slowest group's (the fast ones
wait in the gradient all-reduce), so that time cannot tell which group is slow. So:

* ``step_time_s`` less ``comm_s`` (torchft-lite: the step's seconds in its gradient all-reduce,
  waiting included; ``t_allreduce_s`` in its timing mode), where the step reports both;
* ``step_time_s`` alone where it reports no all-reduce time (TorchTitan, MaxText, ddp-restart);
* the time since the attempt's previous step where it reports no step time at all.

Counted: the group's own steps that took part (``participating`` not false), from the
:data:`WARMUP` + 1-th step of each attempt on (the first steps of an attempt include its heal and
its first quorum). A window's time is the mean of its samples (why the mean and not NVRx's
median, and why 20 steps: :mod:`workbench.analysis.straggler`).
"""

from __future__ import annotations

import collections
import math
from typing import Optional

WINDOW = 20  # steps, at least
MIN_WINDOW_S = 3.0  # seconds of steps, at least: a window of short steps spans a scheduler's hiccup otherwise
WARMUP = 3  # each attempt's first steps, not counted


def own_time(e: dict, previous_t: Optional[float], t: float) -> Optional[float]:
    """The seconds the group itself spent on step event ``e`` (module docstring); None if unknown."""
    dt = _number(e.get("step_time_s"))
    if dt is None:
        return t - previous_t if previous_t is not None and t > previous_t else None
    comm = _number(e.get("comm_s", e.get("t_allreduce_s")))
    return max(0.0, dt - comm) if comm is not None else dt


class GroupTimes:
    """One group's window, its attempt, and its best window time."""

    __slots__ = ("attempt", "seen", "last_t", "samples", "total", "best")

    def __init__(self) -> None:
        self.attempt = -1
        self.seen = 0  # this attempt's counted step events, warm-up included
        self.last_t: Optional[float] = None
        self.samples: collections.deque = collections.deque()  # (t, own time)
        self.total = 0.0  # the samples' sum, kept as they come and go
        self.best: Optional[float] = None  # lowest window time, over every attempt

    def current(self) -> Optional[float]:
        """The window's time, the mean of its samples (from their running sum); None until it is full."""
        n = len(self.samples)
        return self.total / n if n >= WINDOW and self.samples[-1][0] - self.samples[0][0] >= MIN_WINDOW_S else None


class StepTimes:
    """Per replica group: :class:`GroupTimes`. ``add`` takes each step event the fold accepts as the group's own."""

    def __init__(self) -> None:
        self.groups: dict[int, GroupTimes] = {}

    def add(self, replica: int, attempt: int, e: dict, t: float) -> None:
        g = self.groups.get(replica)
        if g is None:
            g = self.groups[replica] = GroupTimes()
        if attempt != g.attempt:
            g.attempt, g.seen, g.last_t, g.total = attempt, 0, None, 0.0
            g.samples.clear()
        previous, g.last_t = g.last_t, t
        if e.get("participating") is False:
            return
        g.seen += 1
        x = own_time(e, previous, t)
        if g.seen <= WARMUP or x is None:
            return
        q = g.samples
        q.append((t, x))
        g.total += x
        while len(q) > WINDOW and t - q[1][0] >= MIN_WINDOW_S:
            g.total -= q.popleft()[1]
        now = g.current()
        if now is not None and now > 0 and (g.best is None or now < g.best):
            g.best = now


def _number(x: object) -> Optional[float]:
    if type(x) is float:  # the common case, first
        return x if math.isfinite(x) else None
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)
