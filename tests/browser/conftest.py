"""JupyterLab and a headless Chromium for the browser tests, each stopped by PID.

``scripts/setup-browser.sh`` installs what they need: Debian's ``chromium``
(Playwright's own browser download cannot work here, so Playwright drives
``/usr/bin/chromium``) and the pinned ``requirements-browser.txt``.

JupyterLab runs on 127.0.0.1 with a random token, as root if need be, with
HOME, the Jupyter config/runtime/settings/workspaces directories all under the
test's temp dir so nothing leaks in or out, and with the news pop-up switched
off in the user settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts"


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in a headless Chromium (scripts/setup-browser.sh)")


def _missing() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} missing: run scripts/setup-browser.sh"
    for module in ("playwright", "jupyterlab"):
        try:
            __import__(module)
        except ImportError:
            return f"python package {module} missing: run scripts/setup-browser.sh"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM the process (JupyterLab shuts its kernels down on it), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Lab:
    def __init__(self, url: str, token: str, root: Path, proc: subprocess.Popen, log: Path) -> None:
        self.url, self.token, self.root, self.proc, self.log = url, token, root, proc, log

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"


@contextlib.contextmanager
def running_lab(tmp_path: Path):
    """A JupyterLab as the fixture ``lab`` describes, stopped by PID on exit (the benchmark uses it too)."""
    root = tmp_path / "lab"
    root.mkdir()
    home = tmp_path / "home"
    settings = tmp_path / "lab-settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    env = {
        **os.environ,
        "HOME": str(home),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "lab-workspaces"),
        "PYTHONPATH": str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    home.mkdir()
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "jupyter-lab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--LabApp.news_url=",
        "--ServerApp.port_retries=0",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab not up after 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield Lab(url, token, root, proc, log)
    finally:
        _stop(proc)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(log, ARTIFACTS / "jupyter-lab.log")


@pytest.fixture
def lab(tmp_path):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    with running_lab(tmp_path) as running:
        yield running


@pytest.fixture
def page(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    home = tmp_path / "chromium-home"
    home.mkdir()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, env={**os.environ, "HOME": str(home)}
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1300})
            pg = context.new_page()
            console = []
            pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            pg.console_lines = console
            yield pg
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            try:
                pg.screenshot(path=str(ARTIFACTS / "last-page.png"))
            except Exception:
                pass
            try:
                (ARTIFACTS / "browser-console.log").write_text("\n".join(console))
            except NameError:
                pass
            browser.close()
