"""The classroom page: a run's live dashboard as a web page with no code, for a projector.

``workbench classroom [RUN] [--port P] [--faults]`` (or ``make classroom``)
serves ``wb.dashboard(run)`` through **Voilà** on 127.0.0.1 with a token, and
prints the URL to open. The token is never on a command line: Voilà reads it
from a file of mode 0600 in the page's private temporary directory
(:func:`voila_env`), since any local user reads ``/proc/PID/cmdline``. Without ``RUN`` the page shows the newest run under
the run root, chosen when the page is loaded, so a teacher who submits the next
run reloads the page instead of restarting the server.

Why Voilà and not JupyterLab's own server: JupyterLab always shows a
notebook's code cells and its menus, and a reload of a JupyterLab notebook
shows the widgets only while the kernel that made them lives. Voilà runs the
notebook in a kernel of its own for each page load, sends only the outputs
(sources stripped, no menus, no cells to run), and renders them with
JupyterLab's own widget manager and mime renderers (plotly's extension draws
the loss plot as in the lab). A reload is a new kernel that attaches to the
run directory and folds its event log from the start, so the reloaded page is
current, whatever happened while it was closed; Voilà shuts the old page's
kernel down when the page goes. The cost is one kernel per open page (a few
seconds to start and ~100 MB each): fine for a projector and a few viewers.

The page is generated: one cell calling :func:`view` with the run (or the run
root) and whether the fault buttons are shown; the teacher turns them on with
``--faults``, they are off otherwise. What a viewer can do is bounded by the
token, as for JupyterLab (whoever has it can reach the page's kernel); the
buttons being off keeps a projected page from a stray click, it is no access
control. Only loopback is listened on: a projector on another machine reaches
it through ``ssh -L``.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

from workbench.run import rundir

PAGE_NAME = "classroom.ipynb"
DEFAULT_PORT = 8866  # Voilà's own default


class ClassroomError(ValueError):
    """What stops the page from being served, in one line."""


def default_root() -> Path:
    return Path(os.environ.get("WORKBENCH_RUN_ROOT", "runs")).expanduser()


def newest_run(root: str | os.PathLike) -> Optional[Path]:
    """The run directory under ``root`` created last (``run.json``'s ``created``), or None."""
    best: tuple[str, Path] | None = None
    root = Path(root).expanduser()
    for d in root.iterdir() if root.is_dir() else []:
        if not rundir.is_run_dir(d):
            continue
        try:
            created = json.loads((d / rundir.RUN_JSON).read_text()).get("created") or ""
        except (OSError, ValueError):
            continue
        if best is None or (created, d.name) > (best[0], best[1].name):
            best = (created, d)
    return best[1] if best else None


def view(run: Optional[str] = None, root: Optional[str] = None, faults: bool = False) -> Any:
    """What the page shows: the dashboard of ``run``, or of the newest run under ``root``.

    With no run there yet, a line saying so (the page is reloaded once one is submitted).
    """
    # Only the page's kernel draws: every CLI command imports this module (``DEFAULT_PORT``, and Voilà's
    # start), and the widgets would add 0.36 s and 236 modules to each (measured).
    import ipywidgets as w

    from workbench.widgets import Dashboard

    target = Path(run) if run else newest_run(root or default_root())
    if target is None:
        return w.HTML(f"<p class='wb-classroom-empty'>no run under {root} yet: submit one, then reload this page</p>")
    return Dashboard(target, faults=faults).add_class("wb-classroom")


def page_notebook(run: Optional[Path], root: Path, faults: bool) -> dict:
    """The generated page: one code cell calling :func:`view` (Voilà strips its source)."""
    args = f"run={str(run)!r}" if run else f"root={str(root)!r}"
    source = f"from workbench.apps.classroom import view\nview({args}, faults={bool(faults)})"
    return {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "classroom",
                "metadata": {},
                "outputs": [],
                "source": source,
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def resolve(run: Optional[str], root: Optional[str]) -> tuple[Optional[Path], Path]:
    """``(run_dir or None, root)``, checked: a given run must be a run directory."""
    root_path = Path(root).expanduser() if root else default_root()
    if run is None:
        return None, root_path.resolve()
    path = Path(run).expanduser()
    if not rundir.is_run_dir(path):
        raise ClassroomError(
            f"RUN: {str(path)!r} is not a run directory (no {rundir.RUN_JSON}); "
            f"give one, or none for the newest under the run root"
        )
    return path.resolve(), root_path.resolve()


def require_port(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ClassroomError(f"--port: {port} on 127.0.0.1 is in use; pick another (--port P)") from None


def voila_command(page: Path, port: int) -> list[str]:
    """Voilà's command line: no token on it (``/proc/PID/cmdline`` is readable by every local user);
    ``auto_token`` makes Voilà take the token jupyter_server's way, from :func:`voila_env`'s file."""
    return [
        sys.executable,
        "-m",
        "voila",
        str(page),
        "--no-browser",
        "--Voila.ip=127.0.0.1",
        f"--port={port}",
        "--Voila.port_retries=0",
        "--Voila.auto_token=True",
        "--strip_sources=True",
        "--show_tracebacks=False",
    ]


def voila_env(private_dir: Path, token: str) -> dict[str, str]:
    """Voilà's environment: ``JUPYTER_TOKEN_FILE`` names a file of mode 0600 holding the token, in
    ``private_dir`` (0700). Not the token itself in ``JUPYTER_TOKEN``: the environment goes on to
    every kernel the page starts, a path to a file only its owner reads is harmless there. A
    ``JUPYTER_TOKEN`` of the caller's is dropped (jupyter_server would take it over the file)."""
    path = private_dir / "token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)  # read back as is: no newline
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    env["JUPYTER_TOKEN_FILE"] = str(path)
    return env


def serve(
    run: Optional[str] = None,
    root: Optional[str] = None,
    port: int = DEFAULT_PORT,
    faults: bool = False,
    token: Optional[str] = None,
    out=sys.stdout,
) -> int:
    """Serve the page until interrupted; prints its URL first. Returns Voilà's exit status."""
    try:
        import voila  # noqa: F401  (optional: requirements-browser.txt; here only to say so in one line)
    except ImportError:
        raise ClassroomError(
            "the classroom page needs Voilà: make browser-env (or pip install -r requirements-browser.txt)"
        ) from None
    run_dir, root_path = resolve(run, root)
    require_port(port)
    token = token or secrets.token_hex(24)
    with tempfile.TemporaryDirectory(prefix="wb-classroom-") as tmp:
        page = Path(tmp) / PAGE_NAME
        page.write_text(json.dumps(page_notebook(run_dir, root_path, faults)))
        what = str(run_dir) if run_dir else f"the newest run under {root_path}"
        print(f"classroom: {what}, fault buttons {'on' if faults else 'off'}", file=out)
        print(f"classroom: http://127.0.0.1:{port}/?token={token}", file=out, flush=True)
        proc = subprocess.Popen(
            voila_command(page, port), cwd=tmp, env=voila_env(Path(tmp), token), stdin=subprocess.DEVNULL
        )
        previous = signal.signal(signal.SIGTERM, _interrupt)  # stopped by PID: Voilà (and its kernels) too
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                return proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)


def run_for(run, seconds: Optional[float] = None):
    """A timer that stops ``run`` after ``seconds`` (default: its chaos schedule's last fault
    + 30 s; none without a schedule); the page keeps serving the ended run (and its replay)."""
    if seconds is None:
        faults = [f.at_s for f in run.spec.faults if f.at_s is not None]
        if not faults:
            return None
        seconds = max(faults) + 30.0 + 60.0  # at_s counts from the first committed step: startup on top
    timer = threading.Timer(float(seconds), lambda: run.stop(timeout=60))
    timer.daemon = True
    timer.start()
    return timer


def _interrupt(signum, frame):
    raise KeyboardInterrupt
