"""The dashboard of a TorchTitan + TorchFT run in a real JupyterLab: a group killed from its button heals.

A notebook of two cells (submit ``titan-cpu-light`` with two groups of two ranks, show
``wb.dashboard(run)``) runs in JupyterLab in headless Chromium at a laptop's width (1440 px).
Once both groups have committed steps, group 1 is killed from the dashboard's fault controls;
the test waits, from the page's DOM, for group 1's tile to show ``healing`` in its next attempt,
takes the screenshot right then (``test-artifacts/titan-dashboard-mid-heal-1440.png``; kept only if
the tile did not change while it was taken), and for the tile to go on to ``participating``. A tile
heals for one step, shorter than the dashboard's poll, so it kills again until a poll showed it
(at most ``MAX_KILLS``). ``scripts/refresh-titan-dashboard-image.sh``
copies the screenshot over ``docs/img/titan-dashboard-mid-heal-1440.png``; the test writes no
tracked file. ~1 min (JupyterLab's start, the run's, the heal).
"""

from __future__ import annotations

import os

import nbformat
import pytest

from .conftest import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from .test_dashboard_browser import JS_TRACE_LEN, run_all_cells, wait_js

pytestmark = pytest.mark.browser

SHOT = "titan-dashboard-mid-heal-1440.png"
CELLS = [
    "import workbench as wb\n"
    'run = wb.submit("titan-cpu-light", {"steps": 3000, "replicas": 2, "nproc_per_replica": 2, "faults": []})',
    "dash = wb.dashboard(run)\ndash",
]
# Every state group 1's tile shows, with its attempt, in order, from a MutationObserver (a healing that
# lasts a single dashboard poll is not missed).
JS_WATCH = """() => {
    window.__wbStates = [];
    const record = () => {
        const el = document.querySelector(".wb-tile[data-replica='1']");
        if (!el) return;
        const s = el.dataset.state + "@" + el.dataset.attempt;
        if (window.__wbStates[window.__wbStates.length - 1] !== s) window.__wbStates.push(s);
    };
    record();
    new MutationObserver(record).observe(document.body, {subtree: true, childList: true, attributes: true});
}"""
MAX_KILLS = 8
TILE = "document.querySelector(\".wb-tile[data-replica='1']\")"
JS_ATTEMPT = f"() => Number({TILE}.dataset.attempt)"
JS_HEALING_NOW = (
    f"(a) => {{ const t = {TILE}; return Number(t.dataset.attempt) > a && t.dataset.state === 'healing'; }}"
)
JS_BACK = f"(a) => {{ const t = {TILE}; return Number(t.dataset.attempt) > a && t.dataset.state === 'participating'; }}"
JS_HEALING_OR_BACK = f"(a) => ({JS_HEALING_NOW})(a) || ({JS_BACK})(a)"


@pytest.fixture
def wide_page(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    home = tmp_path / "chromium-home"
    home.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env={**os.environ, "HOME": str(home)})
        try:
            yield browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
        finally:
            browser.close()


@pytest.fixture
def titan_notebook(lab):
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in CELLS],
        metadata={"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
    )
    nbformat.write(nb, lab.root / "titan.ipynb")
    yield "titan.ipynb"
    from workbench import attach

    from ..conftest import kill_pids

    for run_json in lab.root.glob("**/run.json"):
        run = attach(run_json.parent)
        try:
            run.stop(timeout=20)
        finally:
            kill_pids(run.pids())


def test_titan_group_killed_from_its_button_heals_on_the_dashboard(lab, wide_page, titan_notebook):
    page = wide_page
    page.goto(lab.notebook_url(titan_notebook))
    run_all_cells(page)
    page.locator(".wb-dashboard").wait_for(timeout=120_000)
    wait_js(page, f"() => ({JS_TRACE_LEN})('replica 1') >= 20", timeout_s=240, what="titan steps")
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
    page.evaluate(JS_WATCH)
    page.locator(".wb-replica-picker select").select_option(label="replica 1")
    page.locator(".wb-action-picker select").select_option("kill")
    ARTIFACTS.mkdir(exist_ok=True)
    # The shot is JupyterLab's window as a user sees it, with the tiles scrolled to its middle (an element
    # shot of the tall dashboard stitches JupyterLab's fixed panels into it).
    page.locator(".wb-tiles-panel").evaluate("el => el.scrollIntoView({block: 'center'})")
    # A tile heals for one step (0.1-0.2 s here) and the dashboard polls every 0.25 s, so a poll may not
    # see it: kill again until the tile showed healing and the screenshot was taken while it still did.
    shown = []
    kills = 0
    while kills < MAX_KILLS:
        kills += 1
        attempt = page.evaluate(JS_ATTEMPT)
        page.locator("button.wb-inject").click()
        page.wait_for_function(JS_HEALING_OR_BACK, arg=attempt, timeout=120_000, polling="raf")
        if page.evaluate(JS_HEALING_NOW, attempt):
            page.screenshot(path=str(ARTIFACTS / SHOT))
            shown = page.evaluate("() => window.__wbStates.slice()")
        wait_js(page, JS_BACK, arg=attempt, timeout_s=120, what="titan tile participating again")
        # No change of the tile was seen while the screenshot was taken: it shows the healing tile.
        if shown and shown[-1].startswith("healing@"):
            break
        shown = []
    states = page.evaluate("() => window.__wbStates")
    print(f"\ngroup 1's tile over {kills} kill(s): {' → '.join(states)}")
    assert shown, f"no healing tile seen in {MAX_KILLS} kills: {states}"
