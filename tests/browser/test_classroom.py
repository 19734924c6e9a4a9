"""The classroom page (``workbench classroom``, Voilà) and every figure, in the real chromium.

One real torchft-lite run (2 replica groups) serves the whole module, in order:

1. the page for the newest run, buttons off: no code and no fault controls on
   it, the grid and the loss plot update (the plot measured as in 3), events reach the page within a few
   poll periods (event → visible latency measured, median and p95, written to
   test-artifacts/classroom-latency.json), and a reload shows the run again,
   current and still updating;
2. the teacher's page (``--faults``): the kill button kills replica 1, its tile
   goes dead and comes back with a new attempt;
3. the figures: the report (``workbench report``) opened in chromium, and the
   figures the notebooks and the dashboard show rendered in one JupyterLab
   notebook (file browser open beside it), each measured at a laptop's size
   (1440×900) and at a projector's (1024×768): a plot area of readable height, visible marks inside it,
   labelled axes, tick text of at least 13 px, a legend off the plot area, and
   the whole figure fitting the screen's height. The recovery timeline is
   drawn with one fault and with six, and its bars must stay tall;
4. ``make lab``'s own command line (read with ``make -n``) opens JupyterLab on the notebooks
   with no news question and no update toast.

Screenshots go to test-artifacts/ (git-ignored).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.events.writer import EventWriter

from .conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, REPO, _free_port, _missing, _stop
from .live_plot_page import JS_PLOTS_FILL
from .test_dashboard_browser import JS_TRACE_LEN, shot, wait_js

pytestmark = pytest.mark.browser

VIEWPORTS = {"laptop": (1440, 900), "projector": (1024, 768)}
# the cells of a table whose text takes more than one line (``sel``: the cells)
JS_WRAPPED = """(sel) => [...document.querySelectorAll(sel)].filter(c => {
    const r = document.createRange(); r.selectNodeContents(c);
    return new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top))).size > 1;
}).map(c => c.textContent)"""
JS_TILES = "() => [...document.querySelectorAll('.wb-tile[data-replica]')].map(t => [t.dataset.state, Number(t.dataset.step || -1), Number(t.dataset.attempt)])"

# One figure's plot area and marks, measured in the page (plotly's own layout gives the plot area).
JS_MEASURE = """(gd) => {
    const fl = gd._fullLayout, s = fl._size, r = gd.getBoundingClientRect();
    const area = {left: r.left + s.l, top: r.top + s.t, right: r.left + s.l + s.w, bottom: r.top + s.t + s.h};
    const inside = b => b.width > 0 && b.height > 0 && b.right > area.left && b.left < area.right
                        && b.bottom > area.top && b.top < area.bottom;
    const boxes = sel => [...gd.querySelectorAll(sel)].map(e => e.getBoundingClientRect()).filter(inside);
    const marks = boxes('.scatterlayer .js-line, .scatterlayer .points path, .barlayer .point path');
    const bars = boxes('.barlayer .point path');
    const texts = sel => [...gd.querySelectorAll(sel)].map(e => e.textContent.trim()).filter(Boolean);
    const axisTitles = axis => [...gd.querySelectorAll('.infolayer text')]
        .filter(e => new RegExp('^' + axis + '\\\\d*title$').test(e.getAttribute('class') || ''))
        .map(e => e.textContent.trim()).filter(Boolean);
    const XTICKS = '.xaxislayer-above text';  // every x axis's tick labels (x, x2, x3: subplots sharing one x)
    // the largest x tick text: a log axis writes its minor labels (2, 5) smaller on purpose
    const tickPx = Math.max(0, ...[...gd.querySelectorAll(XTICKS)].map(t => parseFloat(getComputedStyle(t).fontSize)));
    const lg = gd.querySelector('.legend');
    const lb = lg && lg.getBoundingClientRect();
    const mb = gd.querySelector('.modebar');  // plotly's toolbar: laid out always, shown on hover
    const mbb = mb && mb.getBoundingClientRect();
    return {
        fig_w: r.width, fig_h: r.height, plot_w: s.w, plot_h: s.h, marks: marks.length, bars: bars.length,
        min_bar_h: bars.length ? Math.min(...bars.map(b => b.height)) : null,
        title: texts('.gtitle')[0] || '', xtitle: axisTitles('x'), ytitle: axisTitles('y'),
        xticks: texts(XTICKS).length, yticks: texts('.ytick text'),
        tick_px: tickPx,
        legend_on_plot: !!lb && lb.width > 0 && lb.right > area.left && lb.left < area.right
                        && lb.bottom > area.top && lb.top < area.bottom,
        legend_under_toolbar: !!lb && !!mbb && lb.width > 0 && mbb.width > 0 && lb.right > mbb.left
                              && lb.left < mbb.right && lb.bottom > mbb.top && lb.top < mbb.bottom,
        viewport_h: window.innerHeight, viewport_w: window.innerWidth,
    };
}"""


def check_figure(name: str, m: dict, rows: int | None = None) -> list[str]:
    """What a person needs to read the figure; the list of what is wrong (empty: readable)."""
    bad = []
    if m["plot_h"] < 150:
        bad.append(f"plot area {m['plot_h']:.0f} px high (< 150)")
    if m["plot_w"] < 0.6 * m["fig_w"]:
        bad.append(f"plot area {m['plot_w']:.0f} px of {m['fig_w']:.0f} px wide (< 60 %)")
    if m["fig_h"] > m["viewport_h"]:
        bad.append(f"figure {m['fig_h']:.0f} px high, taller than the {m['viewport_h']} px screen")
    if m["fig_w"] > m["viewport_w"]:
        bad.append(f"figure {m['fig_w']:.0f} px wide, wider than the {m['viewport_w']} px screen")
    if m["marks"] < 1:
        bad.append("no visible mark inside the plot area")
    if not m["xtitle"]:
        bad.append("x axis without a title")
    if not m["ytitle"] and not m["yticks"]:
        bad.append("y axis without a title or category labels")
    if m["xticks"] < 2:
        bad.append(f"{m['xticks']} x tick labels")
    if m["tick_px"] < 13:
        bad.append(f"tick text {m['tick_px']} px (< 13)")
    if m["legend_on_plot"]:
        bad.append("the legend covers the plot area")
    if m["legend_under_toolbar"]:
        bad.append("the legend runs under plotly's toolbar")
    if rows is not None:
        if m["bars"] < rows:
            bad.append(f"{m['bars']} visible bars for {rows} rows")
        if m["min_bar_h"] is not None and m["min_bar_h"] < 12:
            bad.append(f"bars {m['min_bar_h']:.0f} px high (< 12)")
        if len(m["yticks"]) < rows:
            bad.append(f"{len(m['yticks'])} row labels for {rows} rows")
    return [f"{name}: {b}" for b in bad]


# -- the module's run and browser ------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    try:
        import voila  # noqa: F401
    except ImportError:
        pytest.skip("python package voila missing: run scripts/setup-browser.sh")
    from playwright.sync_api import sync_playwright

    home = tmp_path_factory.mktemp("chromium-home")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, env={**os.environ, "HOME": str(home)}
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def module_run(tmp_path_factory, browser):
    import workbench as wb
    from workbench.cluster.procs import alive

    root = tmp_path_factory.mktemp("classroom") / "runs"
    old = os.environ.get("WORKBENCH_RUN_ROOT")
    os.environ["WORKBENCH_RUN_ROOT"] = str(root)
    run = wb.submit("demo", {"replicas": 2, "steps": 100000, "faults": [], "model.step_delay_s": 0.02})
    try:
        yield run
    finally:
        try:
            run.stop(timeout=20)
        finally:
            for pid in run.pids():
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            if old is None:
                os.environ.pop("WORKBENCH_RUN_ROOT", None)
            else:
                os.environ["WORKBENCH_RUN_ROOT"] = old


@contextlib.contextmanager
def classroom(*args: str, log: Path):
    """``workbench classroom ARGS --port P`` as a user starts it; yields its printed URL; stopped by PID."""
    port = _free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.apps.cli", "classroom", *args, "--port", str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    try:
        url = None
        while url is None:
            line = proc.stdout.readline()
            assert line, f"workbench classroom exited ({proc.wait()}):\n{log.read_text()[-3000:]}"
            found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\w+)", line)
            url = found and found.group(0)
        assert int(found.group(1)) == port
        deadline = time.monotonic() + 60
        while True:  # a TCP connect, not a GET: every GET of the page starts a kernel
            assert proc.poll() is None, f"workbench classroom exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, f"classroom not listening after 60 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / log.name).write_text(log.read_text())


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    try:
        yield pg
    finally:
        with contextlib.suppress(Exception):
            shot(pg, "classroom-last-page.png")
        context.close()


def wait_page(page, timeout_s: float = 120.0) -> None:
    page.locator(".wb-loss-plot .js-plotly-plot").wait_for(timeout=timeout_s * 1000)
    wait_js(page, "() => document.querySelectorAll('.wb-tile[data-replica]').length === 2", timeout_s=30, what="tiles")


# -- 1 and 2: the classroom page ---------------------------------------------------------------------


def test_classroom_page_live_no_code_latency_and_reload(module_run, page, tmp_path):
    run = module_run
    run.wait_for_step(5, timeout=180)
    with classroom(log=tmp_path / "classroom.log") as url:
        page.goto(url)
        wait_page(page)

        # no code, no menus, no fault controls
        text = page.inner_text("body")
        assert "from workbench" not in text and "view(" not in text
        assert page.locator(".jp-InputArea, .jp-Cell-inputWrapper, .jp-MenuBar").count() == 0
        assert page.locator("button.wb-inject, .wb-controls").count() == 0
        assert run.id in text  # the newest run under the root is this one

        # the grid and the plot update
        first = page.evaluate(JS_TILES)
        assert [s for s, _, _ in first] == ["participating", "participating"], first
        wait_js(
            page,
            f"() => ({JS_TILES})().every((t, i) => t[1] > {json.dumps([st for _, st, _ in first])}[i])",
            timeout_s=30,
            what="tiles step on",
        )
        n = page.evaluate(JS_TRACE_LEN, "replica 0")
        wait_js(page, f"() => ({JS_TRACE_LEN})('replica 0') > {n}", timeout_s=30, what="plot grows")
        # each tile's memory: its group's resident memory, from the controller's samples (a CPU run)
        wait_js(
            page,
            r"() => [...document.querySelectorAll('.wb-tile[data-replica]')].every(t => /rss \d+(\.\d)? [kMG]?B/.test(t.textContent))",
            timeout_s=30,
            what="tiles show memory",
        )
        shot(page, "classroom.png")
        problems, _ = _measure_all(
            page, {"dashboard loss": "document.querySelector('.wb-loss-plot .js-plotly-plot')"}, {}, "classroom"
        )
        assert not problems, "\n".join(problems)
        page.set_viewport_size({"width": 1280, "height": 900})

        # event written → visible on the page
        probe = EventWriter(run.run_dir, "control-classroom-probe", run=run.run_dir.name)
        latencies = []
        for i in range(25):
            probe.emit("warning", message=f"classroom-probe-{i}")
            t_written = time.time()
            wait_js(
                page,
                "(m) => { const el = document.querySelector('.wb-tail-panel'); return el && el.textContent.includes(m); }",
                arg=f"classroom-probe-{i}",
                timeout_s=10,
                what="probe",
            )
            latencies.append(time.time() - t_written)
        latencies.sort()
        report = {
            "events": len(latencies),
            "median_s": statistics.median(latencies),
            "p95_s": latencies[int(round(0.95 * (len(latencies) - 1)))],
            "max_s": latencies[-1],
            "loadavg": os.getloadavg(),
        }
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "classroom-latency.json").write_text(json.dumps(report, indent=2))
        print(
            f"\nclassroom page, event → visible over {len(latencies)} events: median {report['median_s'] * 1000:.0f} ms, "
            f"p95 {report['p95_s'] * 1000:.0f} ms (load {report['loadavg'][0]:.1f})"
        )
        # Live: each probe shows up (the wait above, 10 s each), and typically within a few of the dashboard's
        # 0.25 s polls (the median, widened from 2 s, which a loaded machine broke). The figure itself, event →
        # drawn in chromium: ``make bench``'s live plot section (``python -m bench --only live_plot``).
        assert report["median_s"] < 5.0

        # a reload is a new kernel on the same run: current, and live again
        before = max(st for _, st, _ in page.evaluate(JS_TILES))
        page.reload()
        wait_page(page)
        assert run.id in page.inner_text("body")
        assert "classroom-probe-24" in page.inner_text(".wb-tail-panel")
        assert min(st for _, st, _ in page.evaluate(JS_TILES)) >= before
        n = page.evaluate(JS_TRACE_LEN, "replica 0")
        assert n > 0
        wait_js(page, f"() => ({JS_TRACE_LEN})('replica 0') > {n}", timeout_s=30, what="plot grows after reload")
        wait_js(page, JS_PLOTS_FILL, timeout_s=10, what="plots as wide as their box after a reload")
        shot(page, "classroom-after-reload.png")


def test_classroom_teacher_turns_the_fault_buttons_on(module_run, page, tmp_path):
    run = module_run
    with classroom(str(run.run_dir), "--faults", log=tmp_path / "classroom-faults.log") as url:
        page.goto(url)
        wait_page(page)
        page.locator(".wb-replica-picker select").select_option(label="replica 1")
        page.locator(".wb-action-picker select").select_option("kill")
        page.locator("button.wb-inject").click()
        # dead, or already the next attempt: the fork server's replacement can start within one poll
        wait_js(
            page,
            f"() => {{ const t = ({JS_TILES})()[1]; return t[0] === 'dead' || t[2] > 0; }}",
            timeout_s=30,
            what="tile dead or replaced",
        )
        wait_js(
            page,
            f"() => {{ const t = ({JS_TILES})()[1]; return t[0] === 'participating' && t[2] > 0; }}",
            timeout_s=180,
            what="tile rejoined",
        )
        shot(page, "classroom-teacher.png")
    faults = [e for e in run.event_records() if e.get("kind") == "fault"]
    assert [(e["action"], e["target"], e["origin"]) for e in faults] == [("kill", 1, "button")]


def test_a_tile_says_why_its_group_ended_and_the_tables_do_not_wrap(browser, tmp_path):
    """A hand-written run (no trainer: the page only reads the log): replica 1 killed from the dashboard at
    step 41 and dead since. Its tile says so; each tile shows its group's memory; the heal table's cells
    and the plots' legends are measured at both screen sizes."""
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(
        tmp_path / "runs", "20250101-000000-demo-cause1", load_spec("demo", {"replicas": 2, "faults": []}).to_dict()
    )
    controller = EventWriter(run_dir, "controller", run=run_dir.name)
    w = {r: EventWriter(run_dir, f"replica-{r}.attempt-0", run=run_dir.name, replica=r, attempt=0) for r in (0, 1)}
    for r in (0, 1):
        controller.emit("submit", replica=r, attempt=0, job_id=f"j{r}")
        w[r].emit("start", role="replica", trainer="torchft-lite", node="vm")
        w[r].emit("phase", phase="model_ready", checkpoint_address=f"pg://127.0.0.1/replica_{r}")
    w[1].emit(
        "heal",
        step=0,
        seconds=0.07,
        bytes=1_622_136,
        bytes_per_s=23_173_371.0,
        from_address="pg://127.0.0.1/replica_0",
        served_from="127.0.0.1",
        interface="lo",
    )
    for s in range(1, 42):
        for r in (0, 1):
            w[r].emit(
                "step",
                step=s,
                loss=2.0 / s + 0.01 * r,
                committed=True,
                participating=True,
                participants=2,
                quorum_id=1,
                step_time_s=0.02,
                tokens_per_s=12800.0,
            )
    groups = [
        {"replica": 0, "attempt": 0, "rss_bytes": 412_000_000},
        {"replica": 1, "attempt": 0, "rss_bytes": 409_000_000},
    ]
    controller.emit("node_health", node="vm", cpu_percent=180.0, rss_bytes=821_000_000, mem_share=0.1, groups=groups)
    EventWriter(run_dir, "control-1", run=run_dir.name).emit(
        "fault", action="kill", target=1, attempt=0, origin="button"
    )
    controller.emit(
        "job", replica=1, attempt=0, job_id="j1", state="ended", clean=False, signal="SIGKILL", reason="died"
    )
    for s in range(42, 60):
        w[0].emit(
            "step",
            step=s,
            loss=2.0 / s,
            committed=True,
            participating=True,
            participants=1,
            quorum_id=2,
            step_time_s=0.02,
            tokens_per_s=12800.0,
        )

    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        with classroom(str(run_dir), log=tmp_path / "classroom-cause.log") as url:
            page.goto(url)
            wait_page(page)
            cause = page.locator(".wb-tile[data-replica='1'] .wb-cause")
            cause.wait_for(timeout=30_000)
            assert cause.inner_text() == "attempt 0 ended: kill from the dashboard at step 41"
            tiles = page.locator(".wb-tile[data-replica]")
            assert [t.get_attribute("data-state") for t in tiles.all()] == ["participating", "dead"]
            assert "rss 412.0 MB" in tiles.nth(0).inner_text() and "wb-cause" not in tiles.nth(0).inner_html()
            shot(page, "tile-cause-1440x900.png", page.locator(".wb-tiles-panel"))  # (its HTML is redrawn each poll)
            problems, _ = _measure_all(
                page,
                {
                    f"dashboard {name}": f"document.querySelector('.{cls} .js-plotly-plot')"
                    for name, cls in DASHBOARD_PLOTS
                },
                {},
                "classroom",
            )
            problems += _check_tables(page, "document.querySelector('.wb-heals')", "classroom")
            assert not problems, "\n".join(problems)
    finally:
        context.close()


# -- 3: every figure, measured ----------------------------------------------------------------------

FIGURES_NOTEBOOK = """
import pandas as pd
import workbench as wb
from workbench import analysis; from workbench.analysis import compare, compare_figures
HB = "lighthouse.heartbeat_timeout_ms"
run = wb.attach({run_dir!r})
timeline = analysis.recovery_timeline(run.event_records())
runs, points = [run, run], [{{HB: 500}}, {{HB: 5000}}]   # one run as two sweep points: the check is of the drawing
table = compare.table(runs, params=points)
##
wb.dashboard(run, faults=False)                                    # notebooks 01-03 (its loss plot: measured live, test 1)
##
analysis.timeline_figure(timeline)                                 # notebook 02, one fault
##
analysis.timeline_figure(pd.concat([timeline] * 6, ignore_index=True))   # six faults
##
wb.comparison(runs, labels=["500 ms", "5000 ms"])                  # notebook 04
##
compare_figures.stall_figure(table, HB, unit_s=0.001, label="lighthouse heartbeat timeout (ms)")
##
compare_figures.loss_figure(runs, labels=["500 ms", "5000 ms"], color_values=[500, 5000], color_by=HB, x="time")
##
compare_figures.comparison_figures(runs, params=points, color_by=HB)[1]  # sweep_report_figures' figures by the key
"""
# (cell, rows): which cells draw the timeline, and with how many rows
FIGURE_CELLS = {
    2: "timeline, 1 fault",
    3: "timeline, 6 faults",
    4: "comparison loss",
    5: "survivor stall",
    6: "loss by heartbeat",
    7: "figures by heartbeat",
}
TIMELINE_ROWS = {2: 1, 3: 6}


DASHBOARD_CELL = "document.querySelectorAll('.jp-Notebook .jp-CodeCell')[1]"
DASHBOARD_PLOTS = (("loss", "wb-loss-plot"), ("wall clock", "wb-clock-plot"))
TABLE_CELLS = ".wb-heals td, .wb-heals th, .wb-checkpoints td, .wb-checkpoints th"


def _check_tables(page, heals_js: str, where: str) -> list[str]:
    """The dashboard's heal table has a heal, and no cell of it or of the checkpoint table takes two lines,
    at each viewport."""
    problems = []
    for vp, (w, h) in VIEWPORTS.items():
        page.set_viewport_size({"width": w, "height": h})
        page.wait_for_timeout(500)
        page.evaluate(f"() => {heals_js}.scrollIntoView({{block: 'center'}})")
        rows = page.evaluate(f"() => [...{heals_js}.querySelectorAll('tr')].map(r => r.textContent)")
        if len(rows) < 2 or "no peer heal yet" in rows[1]:
            problems.append(f"{where} heal table @ {vp}: no heal shown: {rows}")
        problems += [f"{where} table @ {vp} {w}x{h}: cell wraps: {c!r}" for c in page.evaluate(JS_WRAPPED, TABLE_CELLS)]
        shot(page, f"tables-{where}-{vp}.png", page.locator(".wb-heals").first)
    return problems


def _measure_all(page, figure_js: dict, rows: dict, where: str) -> tuple[list[str], dict]:
    """Measure each figure (``figure_js``: name → a JS expression for its plotly div) at each viewport.

    The div is looked up again for every step: a widget's Output redraws its figure as a new div.
    """
    problems, measured = [], {}
    for vp, (w, h) in VIEWPORTS.items():
        page.set_viewport_size({"width": w, "height": h})
        wait_js(
            page,
            f"() => [...document.querySelectorAll('.js-plotly-plot')].every(g => g.getBoundingClientRect().width <= {w})",
            timeout_s=20,
            what=f"resize {vp}",
        )
        page.wait_for_timeout(500)  # plotly's responsive relayout follows the resize event; let it land
        for key, expr in figure_js.items():
            gd = f"(() => {expr})()"
            wait_js(
                page,
                f"() => {{ const g = {gd}; return !!(g && g._fullLayout && g.getBoundingClientRect().height > 0); }}",
                timeout_s=30,
                what=f"{where} {key}",
            )
            page.evaluate(f"() => {gd}.scrollIntoView({{block: 'center'}})")
            page.wait_for_timeout(100)
            m = page.evaluate(f"() => ({JS_MEASURE})({gd})")
            measured[f"{key} @ {vp}"] = m
            problems += check_figure(f"{where} {key} @ {vp} {w}x{h}", m, rows.get(key))
            box = page.evaluate(
                f"() => {{ const r = {gd}.getBoundingClientRect(); return {{x: r.left, y: r.top, width: r.width, height: r.height}}; }}"
            )
            clip = {
                "x": max(0, box["x"]),
                "y": max(0, box["y"]),
                "width": min(box["width"], w - max(0, box["x"])),
                "height": min(box["height"], h - max(0, box["y"])),
            }
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(
                path=str(ARTIFACTS / f"figure-{where}-{key}-{vp}.png".replace(" ", "_").replace(",", "")), clip=clip
            )
    return problems, measured


def test_every_figure_is_readable_in_chromium(module_run, browser, lab, tmp_path):
    from workbench.apps.report import write_report

    run = module_run
    if not any(e.get("kind") == "fault" for e in run.event_records()):  # test 2 did not run or failed
        run.wait_for_step(20, timeout=180)
        run.kill(replica=1)
        run.wait_for(
            lambda r: any(
                e["kind"] == "step" and e["replica"] == 1 and e["attempt"] == 1 and e.get("participating")
                for e in r.event_records()
            ),
            timeout=180,
        )
    run.wait_for_step(run.status()["step"] + 50, timeout=180)  # steps after the heal: goodput has a rate to judge by
    run.stop(timeout=60)

    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        # the report, as `workbench report` writes it
        report = write_report(run)
        page.goto(report.as_uri())
        page.locator(".js-plotly-plot").nth(2).wait_for(timeout=30_000)
        titles = page.evaluate(
            "() => [...document.querySelectorAll('.js-plotly-plot')].map(g => g._fullLayout.title.text || '')"
        )
        assert len(titles) == 3, titles
        figures = {
            name: f"document.querySelectorAll('.js-plotly-plot')[{i}]"
            for i, name in enumerate(("loss", "timeline", "goodput"))
        }
        problems, measured = _measure_all(page, figures, {"timeline": 1}, "report")

        # the notebooks' and the dashboard's figures in JupyterLab
        cells = [c.strip() for c in FIGURES_NOTEBOOK.format(run_dir=str(run.run_dir)).split("##")]
        nb = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": f"c{i}",
                    "metadata": {},
                    "outputs": [],
                    "source": src,
                }
                for i, src in enumerate(cells)
            ],
            "metadata": {
                "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (lab.root / "figures.ipynb").write_text(json.dumps(nb))
        # every cell rendered, on screen or not (JupyterLab 4 skips drawing the cells out of view by default)
        tracker = tmp_path / "lab-settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
        tracker.parent.mkdir(parents=True, exist_ok=True)
        tracker.write_text(json.dumps({"windowingMode": "none"}))
        page.set_viewport_size({"width": 1440, "height": 900})
        page.goto(lab.notebook_url("figures.ipynb"))
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        cell = lambda i: f".jp-Notebook .jp-CodeCell >> nth={i}"
        for i in FIGURE_CELLS:
            page.locator(f"{cell(i)} >> .js-plotly-plot").wait_for(timeout=120_000)
        wait_js(
            page, "() => !!document.querySelector('svg.wb-participants polyline')", timeout_s=30, what="participants"
        )
        svg = page.locator("svg.wb-participants").evaluate(
            "s => ({h: s.getBoundingClientRect().height, points: s.querySelector('polyline').getAttribute('points').trim().split(/\\s+/).length,"
            " font: Math.min(...[...s.querySelectorAll('text')].map(t => parseFloat(getComputedStyle(t).fontSize)))})"
        )
        assert svg["h"] >= 80 and svg["points"] >= 2 and svg["font"] >= 12, svg
        p2, m2 = _measure_all(
            page,
            {
                FIGURE_CELLS[
                    i
                ]: f"document.querySelectorAll('.jp-Notebook .jp-CodeCell')[{i}].querySelector('.js-plotly-plot')"
                for i in FIGURE_CELLS
            }
            | {
                f"dashboard {name}": f"{DASHBOARD_CELL}.querySelector('.{cls} .js-plotly-plot')"
                for name, cls in DASHBOARD_PLOTS
            },
            {FIGURE_CELLS[i]: n for i, n in TIMELINE_ROWS.items()},
            "notebook",
        )
        problems += p2
        measured.update(m2)
        problems += _check_tables(page, f"{DASHBOARD_CELL}.querySelector('.wb-heals')", "notebook")
    except Exception:
        shot(page, "figures-failed.png")
        raise
    finally:
        context.close()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "figures-measured.json").write_text(json.dumps(measured, indent=1))
    assert not problems, "\n".join(problems)
    # the timeline grows with its rows instead of thinning them: each row keeps a band a bar can be seen in
    one, six = measured["timeline, 1 fault @ laptop"], measured["timeline, 6 faults @ laptop"]
    assert six["fig_h"] > one["fig_h"] and six["plot_h"] / 6 >= 24, (one, six)


# -- make lab: no pop-ups ---------------------------------------------------------------------------


def test_make_lab_opens_on_the_notebooks_with_no_popups(browser, tmp_path):
    """JupyterLab started by `make lab`'s own command line (read with `make -n`), as a new user with no
    settings of their own: the notebooks listed, no news question, no update toast."""
    dry = subprocess.run(["make", "-s", "-n", "lab"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    line = next(l for l in dry.replace("\\\n", " ").splitlines() if " lab " in l and "jupyter" in l)
    cmd = line.split()
    cmd[0] = str(Path(sys.executable).with_name("jupyter"))  # this interpreter's venv, as make's $(VENV)
    port, token = _free_port(), "t" + os.urandom(16).hex()
    cmd += [f"--port={port}", f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws"),
    }
    log = tmp_path / "make-lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        pg.goto(f"http://127.0.0.1:{port}/lab?token={token}")
        pg.get_by_text("01_quickstart.ipynb").first.wait_for(timeout=120_000)
        pg.locator(".jp-Notification-Status").wait_for(timeout=30_000)
        # nothing may appear: a bounded window after the shell is up, in which the news question
        # (asked at start-up when fetchNews is unset) would have been shown
        pg.wait_for_timeout(3000)
        shot(pg, "make-lab.png")
        assert pg.locator(".Toastify__toast").count() == 0, pg.locator(".Toastify__toast").first.inner_text()
        assert pg.locator(".jp-Notification-Status").inner_text().strip() == "0"
    finally:
        context.close()
        _stop(proc)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "make-lab.log").write_text(log.read_text())
