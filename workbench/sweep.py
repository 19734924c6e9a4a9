"""Sweeps: one ordinary run per point of a parameter grid, submitted with bounded concurrency.

``workbench.sweep(spec, grid={"lighthouse.heartbeat_timeout_ms": [500, 1000, 5000]})``
(or ``points=[{...}, ...]``, or ``random={key: [choices]}, n=, seed=``) resolves
and checks every point with ``load_spec`` and ``preflight`` before anything is
created, then writes the sweep directory and starts the sweep controller:

```
<run_root>/sweeps/<sweep-id>/
  sweep.json                  base spec (resolved), how the points were made, the point list (written once)
  events/controller.jsonl     the sweep controller: start, submit (point -> run dir), point_error, sweep_end
  events/control-<pid>.jsonl  a kernel or CLI that ended a sweep whose controller was gone
  controller.log
```

Protocol. ``python -m workbench.sweep SWEEP_DIR`` runs in its own session, so
the sweep outlives the kernel that started it. It submits point after point
through ``workbench.submit`` (each point is a normal run directory under the
run root, named ``<name>-p<i>``) whenever fewer than ``max_parallel`` of its
runs have not ended, and writes ``sweep_end`` once every run has. Its
``submit`` events are the index of point -> run dir, so the same command
started again resumes a sweep without submitting a point twice. SIGTERM
(``Sweep.stop()``) means: submit nothing more, stop the runs still going,
write ``sweep_end state=stopped``. The files use the event-log protocol of
``workbench/events.py``; a :class:`Sweep` reads them like a Run reads its run
directory.

``max_parallel`` defaults to 1 locally (one run at a time keeps a small
machine's timings honest) and to every point on Slurm, whose queue does the
bounding. Not a Slurm job array: each point is itself a controller-driven run
(lighthouse, relaunches, fault schedule), so the points are submitted one run
at a time like any other.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from . import analysis, rundir
from .cluster import validate as cluster_validate
from .events import EventReader, EventWriter
from .procs import alive as _alive
from .run import TERMINAL, Run, attach, submit
from .spec import Spec, SpecError
from .spec_load import load_spec
from .preflight import preflight

SWEEP_JSON = "sweep.json"
SWEEPS_DIR = "sweeps"
POLL_S = 0.5
SWEEP_TERMINAL = ("completed", "stopped", "failed")


# -- points ------------------------------------------------------------------

def _check_values(kind: str, key: Any, values: Any) -> list:
    if not isinstance(key, str) or not key:
        raise SpecError(f"{kind} key {key!r}: expected a dotted spec key such as lighthouse.heartbeat_timeout_ms")
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise SpecError(f"{kind} {key}: expected a list of values, got {type(values).__name__} {values!r}")
    if not values:
        raise SpecError(f"{kind} {key}: empty list; give at least one value")
    return list(values)


def expand_points(
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    points: Optional[Sequence[Mapping[str, Any]]] = None,
    random: Optional[Mapping[str, Sequence[Any]]] = None,
    n: Optional[int] = None,
    seed: int = 0,
) -> list[dict]:
    """The sweep's points as ``{dotted key: value}`` dicts, in submission order.

    ``grid``: the cartesian product, the first key varying slowest.
    ``points``: the given list. ``random``: ``n`` points, each key drawn
    uniformly from its choices with ``numpy.random.default_rng(seed)``.
    Exactly one of the three. Values are not checked against the spec here.
    """
    given = [name for name, v in (("grid", grid), ("points", points), ("random", random)) if v is not None]
    if len(given) != 1:
        raise SpecError(f"sweep: give exactly one of grid, points, random (got {', '.join(given) or 'none'})")
    if n is not None and random is None:
        raise SpecError("n: only random sweeps take n")
    if grid is not None:
        if not isinstance(grid, Mapping) or not grid:
            raise SpecError(f"grid: expected a non-empty mapping of spec key -> list of values, got {grid!r}")
        axes = {k: _check_values("grid", k, v) for k, v in grid.items()}
        return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    if points is not None:
        if isinstance(points, (str, bytes, Mapping)) or not isinstance(points, Sequence) or not points:
            raise SpecError(f"points: expected a non-empty list of {{spec key: value}} mappings, got {points!r}")
        out = []
        for i, p in enumerate(points):
            if not isinstance(p, Mapping):
                raise SpecError(f"points[{i}]: expected a mapping of spec key -> value, got {type(p).__name__} {p!r}")
            for k in p:
                if not isinstance(k, str) or not k:
                    raise SpecError(f"points[{i}]: key {k!r} is not a dotted spec key")
            out.append(dict(p))
        return out
    if not isinstance(random, Mapping) or not random:
        raise SpecError(f"random: expected a non-empty mapping of spec key -> list of choices, got {random!r}")
    choices = {k: _check_values("random", k, v) for k, v in random.items()}
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecError(f"n: a random sweep needs n, an integer >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    return [{k: v[int(rng.integers(len(v)))] for k, v in choices.items()} for _ in range(n)]


def point_name(base_name: str, index: int) -> str:
    suffix = f"-p{index}"
    return base_name[: 64 - len(suffix)] + suffix


def point_spec(base: Mapping[str, Any], params: Mapping[str, Any], index: int) -> Spec:
    """The resolved spec of point ``index``: the base with the point's values, named ``<name>-p<i>``."""
    return load_spec(dict(base), {"name": point_name(base.get("name", "run"), index), **params})


def _label(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def validate_points(base: Spec, points: list[dict], grid: Optional[Mapping] = None) -> list[Spec]:
    """Every point's spec, or one SpecError naming the point (and the grid key) at fault."""
    base_dict = base.to_dict()
    if grid is not None:
        for key, values in grid.items():
            for v in values:
                try:
                    load_spec(base_dict, {key: v})
                except SpecError as e:
                    raise SpecError(f"grid {key}={v!r}: {e}") from None
    specs = []
    for i, params in enumerate(points):
        try:
            spec = point_spec(base_dict, params, i)
            preflight(spec)
        except SpecError as e:
            raise SpecError(f"sweep point {i} ({_label(params)}): {e}") from None
        specs.append(spec)
    return specs


# -- starting ------------------------------------------------------------------

def sweep(
    spec: Union[str, os.PathLike, Mapping[str, Any], Spec, None] = "demo",
    overrides: Union[Sequence[str], Mapping[str, Any], None] = None,
    *,
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    points: Optional[Sequence[Mapping[str, Any]]] = None,
    random: Optional[Mapping[str, Sequence[Any]]] = None,
    n: Optional[int] = None,
    seed: int = 0,
    max_parallel: Optional[int] = None,
) -> "Sweep":
    """Validate every point, write the sweep directory, start the sweep controller; returns at once.

    ``spec``/``overrides`` are the base, as for ``workbench.submit``. Keys of
    ``grid``/``points``/``random`` are dotted spec keys. Nothing is created or
    submitted unless every point is a valid spec.
    """
    base = load_spec(spec, overrides)
    preflight(base)
    plist = expand_points(grid=grid, points=points, random=random, n=n, seed=seed)
    specs = validate_points(base, plist, grid)
    if max_parallel is None:
        max_parallel = len(plist) if base.cluster == "slurm" else 1
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise SpecError(f"max_parallel: expected an integer >= 1, got {max_parallel!r}")
    for s in specs:
        cluster_validate(s)
    for message in dict.fromkeys(m for s in specs for m in preflight(s)):
        warnings.warn(message, stacklevel=2)

    sweep_id = rundir.new_run_id(base.name)
    root = Path(base.run_root).expanduser().resolve() / SWEEPS_DIR
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_dir = root / sweep_id
    sweep_dir.mkdir(mode=0o700)
    (sweep_dir / "events").mkdir(mode=0o700)
    method = "grid" if grid is not None else "points" if points is not None else "random"
    _write_json(sweep_dir / SWEEP_JSON, {
        "sweep_id": sweep_id,
        "base": base.to_dict(),
        "method": method,
        "grid": {k: list(v) for k, v in grid.items()} if grid is not None else None,
        "random": {k: list(v) for k, v in random.items()} if random is not None else None,
        "n": n,
        "seed": seed if random is not None else None,
        "points": plist,
        "max_parallel": max_parallel,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "code": rundir.code_revision(),
    })
    return Sweep(sweep_dir, _controller=start_controller(sweep_dir))


def _write_json(path: Path, data: dict) -> None:
    """Atomically (tmp + rename), keys in the order given: the order of swept keys is the user's."""
    import json

    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def start_controller(sweep_dir: Path) -> subprocess.Popen:
    """Start the sweep controller (what ``python -m workbench.sweep SWEEP_DIR`` runs) detached, in its own
    session. Started through ``-c`` because ``workbench/__init__`` imports this module, which ``-m`` warns about."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(sweep_dir / "controller.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-c", "import sys; from workbench.sweep import main; sys.exit(main())", str(sweep_dir)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
        )


# -- the handle ------------------------------------------------------------------

class Sweep:
    """A notebook's handle on one sweep, built from its directory alone (``attach_sweep``)."""

    def __init__(self, sweep_dir: Union[str, os.PathLike], _controller: Optional[subprocess.Popen] = None) -> None:
        self.sweep_dir = Path(sweep_dir).resolve()
        self.record = read_record(self.sweep_dir)
        self.id: str = self.record["sweep_id"]
        self.base = Spec.model_validate(self.record["base"])
        self.points: list[dict] = self.record["points"]
        self.max_parallel: int = self.record["max_parallel"]
        self._reader = EventReader(self.sweep_dir)
        self._events: list[dict] = []
        self._runs: dict[int, Run] = {}
        self._controller = _controller

    def __repr__(self) -> str:
        return f"Sweep({self.id!r}, {len(self.points)} points, state={self.state()!r})"

    def __len__(self) -> int:
        return len(self.points)

    @property
    def params(self) -> list[str]:
        """The swept keys, in first-seen order."""
        keys: list[str] = []
        for p in self.points:
            keys.extend(k for k in p if k not in keys)
        return keys

    def refresh(self) -> list[dict]:
        new = self._reader.poll()
        self._events.extend(new)
        for e in new:
            if e.get("kind") == "submit" and e.get("point") not in self._runs and rundir.is_run_dir(e["run_dir"]):
                self._runs[e["point"]] = Run(e["run_dir"])
        if self._controller is not None:
            self._controller.poll()
        return new

    def events(self) -> pd.DataFrame:
        from .events import to_frame

        self.refresh()
        return to_frame(self._events)

    def runs(self) -> dict[int, Run]:
        """The submitted points' runs, by point index."""
        self.refresh()
        return dict(sorted(self._runs.items()))

    def index(self) -> pd.DataFrame:
        """Point -> run directory, from the controller's ``submit`` events."""
        self.refresh()
        rows = [{"point": e["point"], "run_id": e.get("run_id"), "run_dir": e["run_dir"], "submitted": e["t"]}
                for e in self._events if e.get("kind") == "submit"]
        return pd.DataFrame(rows, columns=["point", "run_id", "run_dir", "submitted"])

    def controller_pid(self) -> Optional[int]:
        """PID of the newest sweep controller (a resumed sweep has had more than one)."""
        self.refresh()
        starts = [e for e in self._events if e.get("kind") == "start" and e.get("role") == "sweep-controller"]
        return starts[-1].get("pid") if starts else None

    def _end(self) -> Optional[dict]:
        """The ``sweep_end`` that ended the newest controller's work, if any."""
        self.refresh()
        last_start = max((e["t"] for e in self._events if e.get("kind") == "start"), default=0.0)
        ends = [e for e in self._events if e.get("kind") == "sweep_end" and e["t"] >= last_start]
        return ends[-1] if ends else None

    def state(self) -> str:
        """``pending`` (controller not up yet), ``running``, then ``completed``, ``stopped`` or ``failed``
        (``failed`` too when the controller died without a word: :meth:`resume` carries on)."""
        end = self._end()
        if end is not None:
            return end.get("state", "failed")
        pid = self.controller_pid()
        if pid is None:
            if self._controller is not None and self._controller.poll() is not None:
                return "failed"
            return "pending"
        return "running" if _alive(pid) else "failed"

    def resume(self) -> "Sweep":
        """Start a new sweep controller for the points not submitted yet (after a crash or a reboot)."""
        pid = self.controller_pid()
        if pid and _alive(pid):
            raise RuntimeError(f"sweep {self.id}: its controller (pid {pid}) is still running")
        self._controller = start_controller(self.sweep_dir)
        return self

    def point_states(self) -> list[str]:
        self.refresh()
        errors = {e.get("point") for e in self._events if e.get("kind") == "point_error"}
        ended = self.state() in SWEEP_TERMINAL
        out = []
        for i in range(len(self.points)):
            if i in self._runs:
                out.append(self._runs[i].state())
            elif i in errors:
                out.append("error")
            else:
                out.append("skipped" if ended else "queued")
        return out

    def status(self) -> pd.DataFrame:
        """One row per point: its parameters, state, step, run directory."""
        states = self.point_states()
        rows = []
        for i, params in enumerate(self.points):
            run = self._runs.get(i)
            rows.append({
                "point": i, **params, "state": states[i],
                "step": analysis.max_committed_step(run._events) if run is not None else None,
                "steps_target": point_spec(self.record["base"], params, i).steps,
                "run_id": run.id if run is not None else None,
                "run_dir": str(run.run_dir) if run is not None else None,
            })
        return pd.DataFrame(rows)

    def table(self) -> pd.DataFrame:
        """The comparison table: one row per point, its parameters and the figures of its run."""
        from . import compare

        self.refresh()
        runs = [self._runs.get(i) for i in range(len(self.points))]
        df = compare.table(runs, params=self.points)
        df.insert(0, "point", range(len(self.points)))
        df["state"] = self.point_states()
        return df

    def wait(self, timeout: Optional[float] = None, poll: float = 0.5) -> pd.DataFrame:
        """Block until the sweep has ended (every point's run ended); returns ``status()``."""
        self.wait_for(lambda s: s.state() in SWEEP_TERMINAL, float("inf") if timeout is None else timeout, poll)
        return self.status()

    def wait_for(self, predicate, timeout: float = 300.0, poll: float = 0.2) -> "Sweep":
        """Poll the sweep's files until ``predicate(sweep)`` holds; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.id}: condition not met within {timeout}s (state {self.state()})")
            time.sleep(poll)
        return self

    def wait_for_point(self, point: int, timeout: float = 300.0) -> Run:
        """The run of ``point`` once the controller has submitted it."""
        if not 0 <= point < len(self.points):
            raise SpecError(f"point: {point} out of range; allowed: 0..{len(self.points) - 1}")
        self.wait_for(lambda s: point in s.runs() or s.state() in SWEEP_TERMINAL, timeout)
        if point not in self._runs:
            raise RuntimeError(f"sweep {self.id} ended ({self.state()}) without submitting point {point}")
        return self._runs[point]

    def stop(self, timeout: float = 60.0) -> pd.DataFrame:
        """Stop the sweep: submit nothing more and stop its unfinished runs.

        Through the sweep controller (SIGTERM) when it is alive; otherwise this
        process stops the runs itself and records the end.
        """
        if self._end() is not None:
            return self.status()
        pid = self.controller_pid()
        if pid is None and self._controller is not None and self._controller.poll() is None:
            pid = self._controller.pid
        if pid and _alive(pid):
            os.kill(pid, signal.SIGTERM)
            try:
                self.wait_for(lambda s: not _alive(pid), timeout)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
        if self._end() is None:
            for run in self.runs().values():
                if run.state() not in TERMINAL:
                    run.stop()
            EventWriter(self.sweep_dir, f"control-{os.getpid()}", sweep=self.id).emit(
                "sweep_end", state="stopped", reason="sweep controller unreachable; runs stopped")
        return self.status()

    def pids(self) -> list[int]:
        """The sweep controller and every process its runs recorded, that are still alive."""
        out = []
        pid = self.controller_pid()
        if pid and _alive(pid):
            out.append(pid)
        for run in self.runs().values():
            out.extend(run.pids())
        return out

    def figures(self, color_by: Optional[str] = None) -> list:
        from . import compare

        return compare.sweep_report_figures(self, color_by=color_by)

    def widget(self, **kwargs: Any):
        """A live comparison widget that refreshes while the sweep runs."""
        from .widgets.comparison import ComparisonWidget

        return ComparisonWidget(self, **kwargs)


def read_record(sweep_dir: Union[str, os.PathLike]) -> dict:
    import json

    path = Path(sweep_dir) / SWEEP_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"sweep_dir: {str(sweep_dir)!r} is not a sweep directory (no {SWEEP_JSON})") from None


def is_sweep_dir(path: Union[str, os.PathLike]) -> bool:
    return (Path(path) / SWEEP_JSON).is_file()


def attach_sweep(sweep_dir: Union[str, os.PathLike]) -> Sweep:
    """A Sweep for an existing sweep directory (from a new kernel, say)."""
    if not is_sweep_dir(sweep_dir):
        raise SpecError(f"sweep_dir: {str(sweep_dir)!r} is not a sweep directory (no {SWEEP_JSON})")
    return Sweep(sweep_dir)


def list_sweeps(run_root: Union[str, os.PathLike]) -> list[Path]:
    root = Path(run_root).expanduser() / SWEEPS_DIR
    return sorted(p for p in root.iterdir() if is_sweep_dir(p)) if root.is_dir() else []


# -- the detached controller ---------------------------------------------------

class SweepController:
    """Submits the points, at most ``max_parallel`` unfinished runs at a time; see the module docstring."""

    def __init__(self, sweep_dir: Path) -> None:
        self.sweep_dir = Path(sweep_dir).resolve()
        self.record = read_record(self.sweep_dir)
        self.points = self.record["points"]
        self.max_parallel = int(self.record["max_parallel"])
        previous = EventReader(self.sweep_dir).poll()
        self.runs: dict[int, Run] = {
            e["point"]: attach(e["run_dir"]) for e in previous if e.get("kind") == "submit"
        }
        self.errors = {e["point"] for e in previous if e.get("kind") == "point_error"}
        self.writer = EventWriter(self.sweep_dir, "controller", sweep=self.record["sweep_id"])
        self.stopping = False

    def _on_stop_signal(self, *_: Any) -> None:
        self.stopping = True

    def run(self) -> str:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        self.writer.emit("start", role="sweep-controller", points=len(self.points), max_parallel=self.max_parallel,
                         resumed=len(self.runs))
        state, reason = "failed", ""
        try:
            state, reason = self._loop()
        except Exception as e:
            reason = f"sweep controller error: {type(e).__name__}: {e}"
            import traceback

            traceback.print_exc()
            self._stop_runs()
        finally:
            self.writer.emit("sweep_end", state=state, reason=reason,
                             points={i: r.state() for i, r in sorted(self.runs.items())})
            self.writer.close()
        return state

    def _loop(self) -> tuple[str, str]:
        pending = [i for i in range(len(self.points)) if i not in self.runs and i not in self.errors]
        while True:
            if self.stopping:
                self._stop_runs()
                return "stopped", "stop requested"
            live = [r for r in self.runs.values() if r.state() not in TERMINAL]
            while pending and len(live) < self.max_parallel and not self.stopping:
                i = pending.pop(0)
                try:
                    spec = point_spec(self.record["base"], self.points[i], i)
                    run = submit(spec)
                except Exception as e:
                    self.errors.add(i)
                    self.writer.emit("point_error", point=i, message=f"{type(e).__name__}: {e}")
                    continue
                self.runs[i] = run
                live.append(run)
                self.writer.emit("submit", point=i, run_id=run.id, run_dir=str(run.run_dir), params=self.points[i])
            if not pending and not live:
                return "completed", ""
            time.sleep(POLL_S)

    def _stop_runs(self) -> None:
        for run in self.runs.values():
            if run.state() not in TERMINAL:
                try:
                    run.stop()
                except Exception as e:  # keep stopping the others
                    self.writer.emit("warning", message=f"stopping {run.id}: {type(e).__name__}: {e}")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m workbench.sweep SWEEP_DIR", file=sys.stderr)
        return 2
    state = SweepController(Path(argv[0])).run()
    return 0 if state in ("completed", "stopped") else 1


if __name__ == "__main__":
    sys.exit(main())
