"""The dashboard's loss plot: kernel-side cost of one update at 100k points, and event → drawn in the browser.

``python -m bench.live_plot [--reps 200] [--browser-s 30] [--per-s 10] [--no-browser] [--out FILE.json]``

1. Kernel side (no browser): a run directory holding ``--points`` loss points
   (3 groups, written by a real ``EventWriter``'s file format), a ``Dashboard``
   without its thread; each repetition writes one step per group, refreshes
   the run (not timed) and times the loss plot's update: the appending path
   (``PlotFeed`` + ``LivePlot.push``, plus ``json.dumps`` of what it sends, as
   the kernel's session does) against today's path measured in the same run
   (decimate every curve, refill a ``go.Figure``, ``plot_bundle`` into an
   ``Output`` and serialise its state), interleaved. Median and p95. Also the
   rare whole re-send, timed as an x-axis change (which renders the dashboard).
2. Browser: a real JupyterLab and Debian's chromium (``tests/browser``'s
   harness), a notebook showing the dashboard of a run directory that this
   process feeds with ``--per-s`` steps per second for ``--browser-s`` seconds;
   per step, the time from its write to the first plotly draw showing it
   (``plotly_afterplot`` in the page, ``Date.now()`` there and ``time.time()``
   here read the same clock), and the draws per second. Done on a fresh run
   and on one that already holds ``--points`` points.

The 1-minute load average is printed beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _summary(xs: list[float], scale: float = 1000.0) -> dict:
    return {
        "n": len(xs),
        "median_ms": statistics.median(xs) * scale,
        "p95_ms": _pct(xs, 0.95) * scale,
        "max_ms": max(xs) * scale,
    }


def prefill(run_dir: Path, points: int, replicas: int = 3, t0: float = None) -> int:
    """Append ``points`` step events (spread over ``replicas`` groups) in the event files' own format."""
    from workbench.events.writer import EventWriter

    per = points // replicas + 1
    t0 = t0 if t0 is not None else time.time() - per * 0.01
    for r in range(replicas):
        w = EventWriter(run_dir, f"replica-{r}.attempt-0", run=run_dir.name, replica=r, attempt=0)
        w.emit("start", trainer="torchft-lite", role="replica", world_size=1)
        lines = "".join(
            f'{{"t": {t0 + s * 0.01}, "kind": "step", "run": "{run_dir.name}", "replica": {r}, "attempt": 0, '
            f'"step": {s}, "loss": {5.0 / (1 + s) + 0.01 * r}, "committed": true, "participating": true, '
            f'"participants": {replicas}, "quorum_id": 1}}\n'
            for s in range(1, per + 1)
        )
        with open(w.path, "a") as f:
            f.write(lines)
    return per


def kernel_side(points: int = 100_000, reps: int = 200) -> dict:
    """Per-update cost of the loss plot at ``points`` points: appending vs whole-figure, interleaved."""
    import ipywidgets as w

    from tests.browser.live_plot_page import make_run
    from workbench.events.writer import EventWriter
    from workbench.widgets import Dashboard
    from workbench.widgets.plot import plot_bundle

    with tempfile.TemporaryDirectory(prefix="wb-bench-liveplot-") as tmp:
        run_dir = make_run(Path(tmp), replicas=3)
        per = prefill(run_dir, points)
        d = Dashboard(run_dir, start=False)
        sent_json = []
        original = d.loss_plot.send
        d.loss_plot.send = lambda content, buffers=None: (
            sent_json.append(len(json.dumps(content))),
            original(content, buffers),
        )
        writers = [
            EventWriter(run_dir, f"replica-{r}.attempt-0", run=run_dir.name, replica=r, attempt=0) for r in range(3)
        ]
        fig = d.figure
        output = w.Output()

        def whole_figure() -> None:  # today's path, as dashboard._render_loss drew before the LivePlot
            s = d.state
            with fig.batch_update():
                for r in s.loss:
                    view = s.loss_view(r, "step", d.max_points)
                    trace = fig.data[r]
                    trace.x, trace.y, trace.customdata = view["x"], view["y"], view["step"]
                for kind, i in d._marker_trace.items():
                    m = s.marker_arrays(kind)
                    trace = fig.data[i]
                    trace.x, trace.y, trace.customdata, trace.text = m["step"], m["loss"], m["step"], m["label"]
            output.outputs = plot_bundle(fig)
            json.dumps(output.get_state()["outputs"])  # the state sync the kernel's session serialises

        def appending() -> None:
            d._render_loss(False)

        step = per
        times = {"appending": [], "whole_figure": []}
        loads = []
        for k in range(reps):
            step += 1
            for r, wr in enumerate(writers):
                wr.emit(
                    "step",
                    step=step,
                    loss=5.0 / (1 + step) + 0.01 * r,
                    committed=True,
                    participating=True,
                    participants=3,
                    quorum_id=1,
                )
            d.run.refresh()
            order = [("appending", appending), ("whole_figure", whole_figure)]
            for name, fn in order if k % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            if k % 50 == 0:
                loads.append(os.getloadavg()[0])
        full = []  # the rare whole re-send (a curve doubled, or the x axis changed), timed by changing x
        for k in range(20):
            t0 = time.perf_counter()
            d.x_toggle.value = "time" if k % 2 == 0 else "step"
            full.append(time.perf_counter() - t0)
        total = d.state.total_points()
        d.stop()
    return {
        "points": total,
        "reps": reps,
        **{k: _summary(v) for k, v in times.items()},
        "full_resend": _summary(full),
        "ratio_median": statistics.median(times["whole_figure"]) / statistics.median(times["appending"]),
        "sent_bytes_median": statistics.median(sent_json),
        "load_1min": statistics.mean(loads),
    }


def browser_side(seconds: float = 30.0, per_s: float = 10.0, points: int = 0) -> dict:
    """Event written → drawn in chromium, and draws per second, for ``seconds`` of a live run."""
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, _missing, running_lab
    from tests.browser.live_plot_page import JS_POINTS, JS_WATCH, Feeder, latencies, make_run, notebook

    reason = _missing()
    if reason:
        return {"skipped": reason}
    with tempfile.TemporaryDirectory(prefix="wb-bench-liveplot-browser-") as tmp, running_lab(Path(tmp)) as lab:
        run_dir = make_run(lab.root / "runs", replicas=2)
        if points:
            prefill(run_dir, points, replicas=2, t0=time.time() - points * 0.01)
        feeder = Feeder(run_dir, replicas=2)
        feeder.step = (points // 2 + 1) if points else 0
        feeder.write(1)
        notebook(lab.root / "bench.ipynb", run_dir)
        home = Path(tmp) / "chromium-home"
        home.mkdir()
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, env={**os.environ, "HOME": str(home)}
            )
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 1300}).new_page()
                page.goto(lab.notebook_url("bench.ipynb"))
                page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                page.wait_for_function(f"() => ({JS_POINTS})('replica 0') > 0", timeout=180_000, polling=100)
                page.evaluate(JS_WATCH, "replica 0")
                feeder.written.clear()
                first = feeder.step
                load0 = os.getloadavg()[0]
                feeder.start(per_s=per_s)
                time.sleep(seconds)
                feeder.stop()
                last = feeder.step
                page.wait_for_function(f"() => window.__wbDraws.some(d => d[1] >= {last})", timeout=30_000, polling=50)
                draws = page.evaluate("() => window.__wbDraws")
                drawn_points = page.evaluate(JS_POINTS, "replica 0")
            finally:
                browser.close()
        feeder.end()
    lat = latencies(draws, {s: t for s, t in feeder.written.items() if first < s <= last})
    t_start, t_end = feeder.written[first + 1] * 1000, feeder.written[last] * 1000
    window = [d for d in draws if t_start <= d[0] <= t_end + 1]
    return {
        "prefilled_points": points,
        "steps_written": last - first,
        "per_s": per_s,
        "seconds": seconds,
        "event_to_drawn": _summary(lat),
        "draws_per_s": len(window) / max((t_end - t_start) / 1000, 1e-9),
        "points_drawn_replica0": drawn_points,
        "load_1min_start": load0,
        "load_1min_end": os.getloadavg()[0],
    }


def run(
    points: int = 100_000, reps: int = 200, browser_s: float = 30.0, per_s: float = 10.0, browser: bool = True
) -> dict:
    out = {"kernel_side": kernel_side(points, reps)}
    if browser:
        out["browser_fresh"] = browser_side(browser_s, per_s, 0)
        out["browser_long"] = browser_side(browser_s, per_s, points)
    return out


def report_lines(result: dict) -> list[str]:
    """The figures as lines of text (for a report)."""
    lines = []
    k = result["kernel_side"]
    lines.append(
        f"loss plot update at {k['points']:,} points (n={k['reps']}, load {k['load_1min']:.2f}): "
        f"appending median {k['appending']['median_ms']:.2f} ms, p95 {k['appending']['p95_ms']:.2f} ms; "
        f"whole figure median {k['whole_figure']['median_ms']:.1f} ms, p95 {k['whole_figure']['p95_ms']:.1f} ms "
        f"({k['ratio_median']:.0f}x); sent {k['sent_bytes_median']:.0f} B per update; a whole re-send "
        f"(x axis changed, a curve doubled; whole dashboard render) median {k['full_resend']['median_ms']:.1f} ms"
    )
    for key in ("browser_fresh", "browser_long"):
        b = result.get(key)
        if not b:
            continue
        if "skipped" in b:
            lines.append(f"{key}: skipped ({b['skipped']})")
            continue
        e = b["event_to_drawn"]
        lines.append(
            f"{key} ({b['prefilled_points']:,} points before, {b['steps_written']} steps at {b['per_s']}/s, "
            f"load {b['load_1min_start']:.2f}→{b['load_1min_end']:.2f}): event → drawn median "
            f"{e['median_ms']:.0f} ms, p95 {e['p95_ms']:.0f} ms, max {e['max_ms']:.0f} ms (n={e['n']}); "
            f"{b['draws_per_s']:.2f} draws/s"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_plot", description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--browser-s", type=float, default=30.0)
    ap.add_argument("--per-s", type=float, default=10.0)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    result = run(args.points, args.reps, args.browser_s, args.per_s, browser=not args.no_browser)
    print("\n".join(report_lines(result)))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
