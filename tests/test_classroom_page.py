"""The classroom page's logic without a browser (tests/browser/test_classroom.py serves it for real)."""

from __future__ import annotations

import contextlib
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from workbench.apps import classroom
from workbench.apps.cli import main
from workbench.run import rundir
from workbench.spec.load import load_spec
from workbench.widgets import Dashboard


def _run(root, name):
    spec = load_spec("demo", ["replicas=2", f"run_root={root}"])
    return rundir.create(root, rundir.new_run_id(name), spec.to_dict())


def test_the_page_without_a_run_shows_the_newest_one_at_load(tmp_path):
    root = tmp_path / "runs"
    assert classroom.newest_run(root) is None
    assert "no run under" in classroom.view(root=str(root)).value
    _run(root, "a")
    second = _run(root, "b")
    (root / "not-a-run").mkdir()
    assert classroom.newest_run(root) == second
    page = classroom.view(root=str(root), faults=False)
    try:
        assert page.run_dir == second and "wb-classroom" in page._dom_classes
    finally:
        page.stop()


def test_fault_buttons_are_off_unless_asked_for(tmp_path):
    run_dir = _run(tmp_path / "runs", "x")
    off, on = Dashboard(run_dir, faults=False, start=False), Dashboard(run_dir, start=False)
    assert off.controls not in off.children and on.controls in on.children
    with pytest.raises(RuntimeError, match="faults=False"):
        off.inject()
    cell = classroom.page_notebook(None, tmp_path / "runs", faults=False)["cells"][0]["source"]
    assert "faults=False" in cell and "root=" in cell


def test_classroom_refuses_what_it_cannot_serve_in_one_line(tmp_path, capsys):
    assert main(["classroom", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"workbench classroom: RUN: {str(tmp_path)!r} is not a run directory (no run.json); "
        "give one, or none for the newest under the run root"
    ]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["classroom", "--run-root", str(tmp_path), "--port", str(port)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"workbench classroom: --port: {port} on 127.0.0.1 is in use; pick another (--port P)"
    )


def test_classroom_config_is_checked_before_anything_is_submitted(tmp_path, capsys):
    run_dir = _run(tmp_path / "runs", "x")
    assert main(["classroom", str(run_dir), "--config", "demo"]) == 2
    assert capsys.readouterr().err.strip() == (
        "workbench classroom: RUN and --config: give one (--config submits a new run and serves it)"
    )
    root = tmp_path / "fresh"
    assert main(["classroom", "--config", "demo", "--set", "replicas=0", "--set", f"run_root={root}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "replicas" in err[0] and not root.exists()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 302 is the answer looked at, not followed


def _get(url: str) -> tuple[int, str, str]:
    """(status, Location, body) of one GET, redirects not followed."""
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=120) as r:
            return r.status, r.headers.get("Location") or "", r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location") or "", ""


def test_the_page_token_is_on_no_command_line_and_the_page_still_needs_it(tmp_path):
    """``workbench classroom`` as a user starts it: every local user reads ``/proc/PID/cmdline``, so the
    token must not be on Voilà's (or any process's of the page), and Voilà must still refuse a request
    without it (to its login page) and serve the page with it."""
    pytest.importorskip("voila", reason="the classroom page needs Voilà: make browser-env")
    import psutil

    from workbench.controller.lighthouse import free_port

    from .conftest import REPO

    port, log = free_port(), tmp_path / "classroom.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.apps.cli", "classroom", "--run-root", str(tmp_path), "--port", str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    seen: dict[int, psutil.Process] = {}  # every descendant seen (Voilà, its kernels): killed at the end if left
    try:
        found = None
        while found is None:
            line = proc.stdout.readline()
            assert line, f"workbench classroom exited ({proc.wait()}):\n{log.read_text()[-3000:]}"
            found = re.search(rf"http://127\.0\.0\.1:{port}/\?token=(\w+)", line)
        token = found.group(1)
        deadline = time.monotonic() + 120
        while True:  # a TCP connect: Voilà is up
            assert proc.poll() is None, f"workbench classroom exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            seen.update((c.pid, c) for c in psutil.Process(proc.pid).children(recursive=True))
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, f"Voilà not listening after 120 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        voila = [c for c in psutil.Process(proc.pid).children(recursive=True) if "voila" in c.cmdline()]
        assert len(voila) == 1, [c.cmdline() for c in psutil.Process(proc.pid).children(recursive=True)]

        assert _get(f"http://127.0.0.1:{port}/")[:2] == (302, "/login?next=%2F")
        status, location, _ = _get(f"http://127.0.0.1:{port}/?token=not{token}")
        assert status == 302 and location.startswith("/login?"), (status, location)
        status, _, body = _get(f"http://127.0.0.1:{port}/?token={token}")
        assert status == 200 and "no run under" in body, (status, body[-2000:])

        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]  # kernels too
        seen.update((p.pid, p) for p in procs)
        for p in procs:
            with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                cmdline = f.read()
            assert token.encode() not in cmdline, f"the token is on the command line of {p.pid}: {p.cmdline()}"
        # Where Voilà took it from: a file only its owner reads, in a directory only its owner enters.
        token_file = Path(voila[0].environ()["JUPYTER_TOKEN_FILE"])
        assert token_file.read_text() == token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    finally:
        if proc.poll() is None:
            proc.terminate()  # the page stops Voilà, and Voilà its kernels
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for p in seen.values():  # psutil checks the PID is still that process (its start time) before killing
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
