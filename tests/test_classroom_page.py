"""The classroom page's logic without a browser (tests/browser/test_classroom.py serves it for real)."""

from __future__ import annotations

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
