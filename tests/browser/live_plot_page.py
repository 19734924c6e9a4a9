"""The live loss plot in a page: a run directory fed by real ``EventWriter``s, a notebook that shows
its dashboard, and what the page's plotly says (used by the browser test and ``bench/live_plot.py``).

No training process: the events a trainer would write are written here, at a known time, so the
time from an event's write to its point in plotly's ``gd.data`` can be measured in the page
(``Date.now()`` there and ``time.time()`` here read the same clock).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

PLOT = "document.querySelector('.wb-loss-plot .js-plotly-plot')"

# Points of a trace in plotly's gd.data (-1: no plot yet).
JS_POINTS = f"""(name) => {{
    const gd = {PLOT};
    if (!gd || !gd.data) return -1;
    const t = gd.data.find(d => d.name === name);
    return t && t.x ? t.x.length : 0;
}}"""

# Whether each live plot is as wide as its box (plotly draws 700 px wide in a div not yet laid out).
JS_PLOTS_FILL = """() => [...document.querySelectorAll('.wb-loss-plot, .wb-clock-plot')].map(box => {
    const gd = box.querySelector('.js-plotly-plot');
    return !!gd && gd._fullLayout && Math.abs(gd._fullLayout.width - gd.clientWidth) <= 2
        && gd.clientWidth >= 0.9 * box.clientWidth;
}).every(Boolean)"""

JS_CLOCK_POINTS = JS_POINTS.replace(".wb-loss-plot", ".wb-clock-plot")

# Records, for each draw of the plot, when it happened and the newest x of `name`: the time a
# step first shows is the first draw whose last x reaches it. Installed again after each reload.
JS_WATCH = f"""(name) => {{
    const gd = {PLOT};
    window.__wbDraws = [];
    const record = () => {{
        const t = gd.data.find(d => d.name === name);
        window.__wbDraws.push([Date.now(), t && t.x.length ? t.x[t.x.length - 1] : null, t ? t.x.length : 0]);
    }};
    gd.on('plotly_afterplot', record);
    record();
    return true;
}}"""


def notebook(path: Path, run_dir: Path) -> None:
    """A one-cell notebook showing the dashboard of ``run_dir`` (watch-only)."""
    cell = f"import workbench as wb\nd = wb.dashboard({str(run_dir)!r}, faults=False)\nd"
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": "dash", "metadata": {}, "outputs": [], "source": cell}
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def make_run(root: Path, replicas: int = 2) -> Path:
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    spec = load_spec("demo", {"replicas": replicas, "steps": 10**6, "faults": [], "run_root": str(root)})
    return rundir.create(root, "live-plot", spec.to_dict())


class Feeder:
    """Writes a run's step events as its replica groups would; ``written[step]`` is when each was written."""

    def __init__(self, run_dir: Path, replicas: int = 2) -> None:
        from workbench.events.writer import EventWriter

        self.controller = EventWriter(run_dir, "controller", run=run_dir.name)
        self.writers = []
        for r in range(replicas):
            self.controller.emit("submit", replica=r, attempt=0, job_id=f"j{r}")
            w = EventWriter(run_dir, f"replica-{r}.attempt-0", run=run_dir.name, replica=r, attempt=0)
            w.emit("start", trainer="torchft-lite", role="replica", world_size=1)
            self.writers.append(w)
        self.step = 0
        self.written: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = None

    def write(self, n: int = 1) -> int:
        for _ in range(n):
            self.step += 1
            for r, w in enumerate(self.writers):
                w.emit(
                    "step",
                    step=self.step,
                    loss=5.0 / (1 + self.step) + 0.01 * r,
                    committed=True,
                    participating=True,
                    participants=len(self.writers),
                    quorum_id=1,
                )
            self.written[self.step] = time.time()
        return self.step

    def start(self, per_s: float) -> "Feeder":
        def loop():
            while not self._stop.wait(1.0 / per_s):
                self.write()

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="live-plot-feeder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.step

    def end(self) -> None:
        self.stop()
        self.controller.emit("run_end", state="completed", reason="the feeder ended it")


def latencies(draws: list, written: dict[int, float]) -> list[float]:
    """Seconds from each step's write to the first draw showing it (steps drawn by a later draw than
    their own write's next one count at that draw)."""
    out = []
    for step, t_w in written.items():
        seen = next(
            (t / 1000.0 for t, last_x, _ in draws if last_x is not None and last_x >= step and t / 1000.0 >= t_w), None
        )
        if seen is not None:
            out.append(seen - t_w)
    return out
