"""The loss curves' storage: growing float64 columns, and the decimation that keeps their shape.

:class:`LossSeries` is one replica group's loss points (wall time, step,
loss, attempt) in :class:`Series` columns (amortised O(1) appends, zero-copy
views), kept by :class:`~workbench.widgets.state.DashboardState`;
:func:`decimate` picks the points a plot draws (the report uses it too).
"""

from __future__ import annotations

from typing import Optional

import numpy as np


class Series:
    """A growing float64 column with amortised O(1) append and a zero-copy view."""

    def __init__(self, capacity: int = 1024) -> None:
        self._buf = np.empty(capacity, dtype=np.float64)
        self.n = 0

    def append(self, value: float) -> None:
        if self.n == len(self._buf):
            self._buf = np.concatenate([self._buf, np.empty(len(self._buf), dtype=np.float64)])
        self._buf[self.n] = value
        self.n += 1

    @property
    def values(self) -> np.ndarray:
        return self._buf[: self.n]


class LossSeries:
    """One replica group's loss points: wall time, step, loss, attempt."""

    def __init__(self) -> None:
        self.t, self.step, self.loss, self.attempt = Series(), Series(), Series(), Series()
        self.version = 0

    def append(self, t: float, step: float, loss: float, attempt: int) -> None:
        self.t.append(t)
        self.step.append(step)
        self.loss.append(loss)
        self.attempt.append(attempt)
        self.version += 1

    def __len__(self) -> int:
        return self.t.n

    def at_time(self, t: float) -> Optional[tuple[float, float]]:
        """(step, loss) of the last point at or before ``t`` (the first point if none)."""
        if not len(self):
            return None
        i = int(np.searchsorted(self.t.values, t, side="right")) - 1
        i = min(max(i, 0), len(self) - 1)
        return float(self.step.values[i]), float(self.loss.values[i])


def decimate(x: np.ndarray, max_points: int) -> np.ndarray:
    """Indices that keep the shape of ``x`` in at most ~``max_points`` points.

    The series is cut into ``max_points // 2`` equal index buckets and each
    bucket keeps its minimum and its maximum (in index order), plus the first
    and last point overall, so spikes (a loss jump after a fault) survive.
    """
    n = len(x)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, max_points // 2)
    width = n // buckets
    body = x[: width * buckets].reshape(buckets, width)
    clean = np.where(np.isnan(body), np.inf, body)
    lo = clean.argmin(axis=1)
    hi = np.where(np.isnan(body), -np.inf, body).argmax(axis=1)
    base = np.arange(buckets) * width
    idx = np.concatenate([base + lo, base + hi, [0, n - 1]])
    if width * buckets < n:
        tail = np.arange(width * buckets, n)
        idx = np.concatenate([idx, tail[[x[tail].argmin(), x[tail].argmax()]] if len(tail) > 1 else tail])
    return np.unique(idx)
