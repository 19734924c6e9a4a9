"""The appending loss plot (``LivePlot``) in a real JupyterLab and Chromium.

A run directory fed by real ``EventWriter``s (no training process: the test
writes the steps, so it knows each one); a notebook shows its dashboard. From
plotly's ``gd.data`` in the page: the plot comes up with the points written
before it was displayed, gains every point written while the run is live, and
after a page reload (kernel alive) it comes up again with all the points —
once while the run is live (and goes on gaining points), once after it ended
(and then the wall-clock plots come back too).
The event → drawn latency is measured by ``bench/live_plot.py``, not here.
"""

from __future__ import annotations

import time

import pytest

from .live_plot_page import JS_CLOCK_POINTS, JS_PLOTS_FILL, JS_POINTS, JS_WATCH, Feeder, make_run, notebook
from .test_dashboard_browser import run_all_cells, shot, wait_js

pytestmark = pytest.mark.browser


def points(page, name: str = "replica 0") -> int:
    return page.evaluate(JS_POINTS, name)


def wait_points(page, n: int, what: str, name: str = "replica 0", timeout_s: float = 30.0) -> None:
    wait_js(page, f"() => ({JS_POINTS})({name!r}) >= {n}", timeout_s=timeout_s, what=what)


def save_and_reload(page, lab, name: str) -> None:
    """Save (so the output refers to the widget), reload; JupyterLab restores the widget from the kernel."""
    page.keyboard.press("Control+s")
    saved = lab.root / name
    deadline = time.monotonic() + 30
    while "application/vnd.jupyter.widget-view+json" not in saved.read_text():
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.1)
    page.reload()
    page.locator(
        ".wb-loss-plot .js-plotly-plot, .jp-OutputArea-output:has-text('Error displaying widget')"
    ).first.wait_for(timeout=60_000)
    errors = page.locator(".jp-OutputArea-output:has-text('Error displaying widget')")
    assert errors.count() == 0, errors.first.inner_text()


def test_live_plot_appends_and_comes_back_after_reloads(lab, page):
    run_dir = make_run(lab.root / "runs")
    feeder = Feeder(run_dir)
    feeder.write(40)  # before the dashboard exists: the plot must come up with them
    notebook(lab.root / "live.ipynb", run_dir)
    page.goto(lab.notebook_url("live.ipynb"))
    run_all_cells(page)
    try:
        wait_points(page, 40, "first render", timeout_s=120)
        assert points(page, "replica 1") == 40
        wait_js(page, JS_PLOTS_FILL, timeout_s=10, what="plots as wide as their box")

        # live: every step written shows, point by point (one per step: no decimation below 1500)
        page.evaluate(JS_WATCH, "replica 0")
        feeder.start(per_s=10)
        wait_points(page, 70, "live points")
        draws = page.evaluate("() => window.__wbDraws")
        counts = [n for _, _, n in draws]
        assert counts == sorted(counts) and len(set(counts)) >= 5, counts  # drawn again and again, growing
        shot(page, "live-plot-running.png")

        # reload while live: the whole curve again, then new points keep coming
        save_and_reload(page, lab, "live.ipynb")
        at_reload = feeder.step
        wait_points(page, at_reload, "points after a live reload")
        wait_points(page, at_reload + 20, "live points after a reload")
        assert points(page, "replica 1") >= at_reload + 19

        # the run ends; a reload shows exactly what was written
        feeder.end()
        final = feeder.step
        wait_js(
            page,
            "() => { const el = document.querySelector('.wb-live'); return el && el.textContent === 'not polling'; }",
            timeout_s=30,
            what="updater stopped",
        )
        wait_points(page, final, "final points")
        save_and_reload(page, lab, "live.ipynb")
        wait_points(page, final, "points after the run ended and a reload")
        assert points(page) == final and points(page, "replica 1") == final
        # the wall-clock plots too (as an Output, this one came up blank here after such a reload)
        wait_js(
            page, f"() => ({JS_CLOCK_POINTS})('quorum size') > 0", timeout_s=30, what="wall-clock plot after reload"
        )
        wait_js(page, JS_PLOTS_FILL, timeout_s=10, what="plots as wide as their box after a reload")
        shot(page, "live-plot-after-reload.png")
    finally:
        feeder.stop()
