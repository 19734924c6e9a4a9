"""The event pipeline without training: reader throughput, writer cost, dashboard update.

Event logs are written by a real ``EventWriter`` with the fields torchft-lite
puts in a ``step`` event, spread over 3 replica files like a demo run's.

- reader: a fresh ``EventReader.poll()`` over the whole log, events/s.
- writer: one ``emit`` of a step event, and the weights checksum a step event
  carries every ``checksum_every`` steps, as a share of a torchft-lite step
  (the median ``step_time_s`` the sessions measured).
- dashboard (if ``workbench.widgets`` imports): with N loss points loaded, one
  ``update()`` that folds in a poll's worth of new events plus a forced loss
  redraw (``render(force_plot=True)``).

``profile(fn)`` runs pyinstrument over one call, when it is installed.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import orjson

from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec

REPLICAS = 3


def step_fields(step: int, replica: int) -> dict:
    return dict(
        step=step,
        loss=2.5 - step * 1e-4,
        committed=True,
        participating=True,
        participants=REPLICAS,
        quorum_id=7,
        step_time_s=0.0123456,
        tokens_per_s=20734.2,
        batch_seed=[0, step - 1, replica],
    )


def make_run(root: Path, points: int) -> Path:
    """A run directory holding ``points`` step events (loss points) over 3 replicas."""
    spec = load_spec("demo", {"faults": [], "steps": points // REPLICAS + 1, "run_root": str(root)})
    run_dir = rundir.create(root, rundir.new_run_id("bench"), spec.to_dict())
    writers = [
        EventWriter(run_dir, f"replica-{r}.attempt-0", run="bench", replica=r, attempt=0) for r in range(REPLICAS)
    ]
    for w in writers:
        w.emit("start", trainer="torchft-lite", role="replica", world_size=1)
    for i in range(points):
        r = i % REPLICAS
        writers[r].emit("step", **step_fields(i // REPLICAS + 1, r))
    for w in writers:
        w.close()
    return run_dir


def reader_rate(run_dir: Path, reps: int) -> dict:
    times, n = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        n = len(EventReader(run_dir).poll())
        times.append(time.perf_counter() - t0)
    return {
        "events": n,
        "reps": reps,
        "median_s": statistics.median(times),
        "events_per_s": n / statistics.median(times),
    }


def metrics_paths(run_dir: Path, reps: int) -> dict:
    """``Run.metrics()``'s read path, cold (a fresh reader over the whole log), old vs new, interleaved.

    old: ``EventReader.poll()`` (one dict per line) then ``metrics_frame``; new: ``StepColumns`` (each
    file's bytes into columns), without an index; indexed: ``StepColumns`` starting from the step index
    the controller writes for every run (``analysis.step_index``, written here once as the controller
    writes it), what a new kernel's ``metrics()`` does on a run the workbench ran. Also: a warm ``frame()`` after 15 new step events (a notebook cell on a
    live run) and the dashboard's incremental ``EventReader.poll()`` of the same new bytes, and the
    candidates measured when the path was chosen, where installed: their parse alone is the floor
    under the cold figure.
    """
    import io
    import os

    from workbench.analysis import StepColumns, metrics_frame, step_index

    files = sorted((run_dir / "events").glob("*.jsonl"))
    t0 = time.perf_counter()
    step_index.write(StepColumns(run_dir, index=False), run_dir)
    index_write_s = time.perf_counter() - t0
    old, new, indexed, loads, old_cpu, new_cpu, parse = [], [], [], [], [], [], []
    for _ in range(reps):
        loads.append(os.getloadavg()[0])
        # Each read starts with no other frame alive (a kernel attaching to a run holds none): the previous
        # read's frame and its 50,000 lists are freed before the clock starts, and held frames would make
        # the next read's allocations trigger collections of their objects (measured: a 22 ms gen-1 pass).
        t0, c0 = time.perf_counter(), time.process_time()
        metrics_frame(EventReader(run_dir).poll())
        old.append(time.perf_counter() - t0)
        old_cpu.append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        StepColumns(run_dir, index=False).frame()
        new.append(time.perf_counter() - t0)
        new_cpu.append(
            time.process_time() - c0
        )  # both of pyarrow's threads: what the other users' load cannot inflate as much
        t0 = time.perf_counter()
        StepColumns(run_dir).frame()
        indexed.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _read_and_parse(files)  # the floor under the columnar path, in the same loop
        parse.append(time.perf_counter() - t0)
    a = metrics_frame(EventReader(run_dir).poll())  # the frames compared, read once more outside the clocks
    b = StepColumns(run_dir, index=False).frame()
    from_index = StepColumns(run_dir)
    c = from_index.frame()
    n = len(b)
    same = a.equals(b)
    same_indexed = a.equals(c) and from_index.indexed_rows == n
    a = b = c = None
    events = sum(p.read_bytes().count(b"\n") for p in files)
    cols = StepColumns(run_dir, index=False)
    cols.frame()
    reader = EventReader(run_dir)
    reader.poll()
    w = EventWriter(run_dir, "replica-0.attempt-0", run="bench", replica=0, attempt=0)
    warm, poll = [], []
    for k in range(reps):
        for i in range(15):
            w.emit("step", **step_fields(10_000_000 + 15 * k + i, 0))
        t0 = time.perf_counter()
        cols.frame()
        warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        reader.poll()  # what the dashboard's fold reads on each poll
        poll.append(time.perf_counter() - t0)
    w.close()
    cands: dict = {}
    data = [p.read_bytes() for p in files]
    try:
        import pyarrow.json as pj

        cands["pyarrow read_json (parse only)"] = _median_s(lambda: [pj.read_json(io.BytesIO(d)) for d in data], reps)
    except ImportError:
        pass
    try:
        import polars as pl

        cands["polars read_ndjson (parse only)"] = _median_s(
            lambda: [pl.read_ndjson(io.BytesIO(d)) for d in data], reps
        )
    except ImportError:
        cands["polars read_ndjson (parse only)"] = None
    cands["orjson per line (dicts, no frame)"] = _median_s(
        lambda: [orjson.loads(line) for d in data for line in d.splitlines()], reps
    )
    med = statistics.median
    return {
        "events": events,
        "step_rows": n,
        "reps": reps,
        "same_frame": same,
        "old_s": med(old),
        "new_s": med(new),
        "old_per_s": n / med(old),
        "new_per_s": n / med(new),
        "indexed_s": med(indexed),
        "indexed_per_s": n / med(indexed),
        "same_frame_indexed": same_indexed,
        "index_write_s": index_write_s,
        "parse_s": med(parse),
        "old_cpu_s": med(old_cpu),
        "new_cpu_s": med(new_cpu),
        "warm_s": med(warm),
        "poll_warm_s": med(poll),
        "loadavg_1m": med(loads),
        "candidates_s": cands,
    }


def _read_and_parse(files: list[Path]) -> None:
    """Each file's bytes through pyarrow's JSON reader, nothing more: what no columnar path can go below."""
    import io

    import pyarrow.json as pj

    for p in files:
        pj.read_json(io.BytesIO(p.read_bytes()))


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def writer_cost(tmp: Path, n: int = 20000) -> dict:
    import torch

    from workbench.trainers.kit import weights_checksum
    from workbench.trainers.lite.model import build_model

    w = EventWriter(tmp, "writer-bench", run="bench", replica=0, attempt=0)
    samples = []
    for _chunk in range(5):
        t0 = time.perf_counter()
        for i in range(n // 5):
            w.emit("step", **step_fields(i, 0))
        samples.append((time.perf_counter() - t0) / (n // 5))
    w.close()
    spec = load_spec("demo")
    torch.manual_seed(0)
    model = build_model(spec.model.model_dump())
    cs = []
    for _ in range(20):
        t0 = time.perf_counter()
        weights_checksum(model.state_dict())
        cs.append(time.perf_counter() - t0)
    return {
        "emit_s": statistics.median(samples),
        "checksum_s": statistics.median(cs),
        "checksum_every": spec.checksum_every,
    }


def dashboard_update(root: Path, points: int, reps: int) -> Optional[dict]:
    try:
        from workbench.widgets import Dashboard
    except Exception as e:  # another engineer's module; absent or broken means skipped, said so
        return {"skipped": f"{type(e).__name__}: {e}"}
    run_dir = make_run(root, points)
    t0 = time.perf_counter()
    dash = Dashboard(run_dir, start=False)
    cold = time.perf_counter() - t0
    writers = [
        EventWriter(run_dir, f"replica-{r}.attempt-0", run="bench", replica=r, attempt=0) for r in range(REPLICAS)
    ]
    step = points // REPLICAS + 1
    times = []
    for _ in range(reps):
        for r, w in enumerate(writers):
            for k in range(5):
                w.emit("step", **step_fields(step + k, r))
        step += 5
        t0 = time.perf_counter()
        dash.update()
        dash.render(force_plot=True)
        times.append(time.perf_counter() - t0)
    return {
        "points": points,
        "cold_s": cold,
        "update_s": statistics.median(times),
        "update_max_s": max(times),
        "_dash": dash,
    }


def profile(fn: Callable[[], object], path: Path) -> Optional[str]:
    """pyinstrument's text tree of one call of ``fn``, also written to ``path``; None without it."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        return None
    p = Profiler(interval=0.0005)
    p.start()
    fn()
    p.stop()
    text = p.output_text(unicode=False, color=False, show_all=False)
    path.write_text(text)
    return text


def run_all(quick: bool, img_dir: Path, step_time_s: Optional[float], log=print) -> dict:
    out: dict = {}
    reps = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="wb-bench-") as tmp:
        root = Path(tmp)
        n = 50_000 if quick else 200_000
        log(f"reader: writing {n} events")
        run_dir = make_run(root, n)
        out["reader"] = reader_rate(run_dir, reps)
        log(f"  reader: {out['reader']['events_per_s']:,.0f} events/s")
        out["reader"]["profile"] = profile(lambda: EventReader(run_dir).poll(), img_dir / "profile-reader.txt")
        out["reader"]["alternatives"] = reader_alternatives(run_dir)
        log("metrics(): writing the 50,003-event log")
        m_dir = make_run(root / "metrics", 50_000)
        out["metrics"] = metrics_paths(m_dir, 7)
        mp = out["metrics"]
        log(
            f"  metrics(): old {mp['old_per_s']:,.0f}/s, columnar {mp['new_per_s']:,.0f}/s, "
            f"from the step index {mp['indexed_per_s']:,.0f}/s (load {mp['loadavg_1m']:.2f})"
        )
        out["writer"] = writer_cost(root)
        if step_time_s:
            w = out["writer"]
            w["step_time_s"] = step_time_s
            w["emit_share"] = w["emit_s"] / step_time_s
            w["checksum_share"] = w["checksum_s"] / w["checksum_every"] / step_time_s
            w["overhead"] = w["emit_share"] + w["checksum_share"]
        log(
            f"  writer: emit {out['writer']['emit_s'] * 1e6:.1f} µs, checksum {out['writer']['checksum_s'] * 1e3:.2f} ms"
        )
        out["dashboard"] = []
        for points in (1_000, 10_000, 100_000):
            d = dashboard_update(root / f"dash-{points}", points, reps)
            if d is None or "skipped" in d:
                out["dashboard"].append(d)
                break
            dash = d.pop("_dash")
            if points == 100_000:
                d["profile"] = profile(
                    lambda: (dash.update(), dash.render(force_plot=True)), img_dir / "profile-dashboard-100k.txt"
                )
            out["dashboard"].append(d)
            log(f"  dashboard {points}: update {d['update_s'] * 1e3:.1f} ms (cold {d['cold_s']:.2f} s)")
    return out


def reader_alternatives(run_dir: Path) -> dict:
    """What would move the reader: the same bytes parsed per line vs as one JSON array, and the sort."""
    import json

    data = [p.read_bytes() for p in sorted((run_dir / "events").glob("*.jsonl"))]
    out = {}
    t0 = time.perf_counter()
    events = [json.loads(line) for d in data for line in d.splitlines() if line.strip()]
    out["per_line_json_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for d in data:
        json.loads(b"[" + d.rstrip(b"\n").replace(b"\n", b",") + b"]")
    out["one_array_json_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    events.sort(key=lambda e: e.get("t", 0.0))
    out["sort_s"] = time.perf_counter() - t0
    out["events"] = len(events)
    return out
