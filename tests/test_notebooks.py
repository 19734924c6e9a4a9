"""The shipped notebooks run headless, top to bottom, against real runs."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbench import attach

from .conftest import kill_pids

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name: str, run_root: Path, timeout: int = 600):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    finally:
        for run_json in run_root.glob("*/run.json") if run_root.exists() else []:
            run = attach(run_json.parent)
            if run.state() not in ("completed", "failed", "stopped"):
                run.stop(timeout=20)
            kill_pids(run.pids())
    return nb


def output_text(nb) -> str:
    return "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )


@pytest.mark.slow
def test_quickstart_runs_headless(run_root):
    nb = execute("01_quickstart.ipynb", run_root)
    outputs = output_text(nb)
    assert "'survivor_steps_lost': 0" in outputs
    (run_dir,) = list(run_root.iterdir())
    assert attach(run_dir).summary()["heals"] >= 1


@pytest.mark.slow
def test_teaching_notebook_runs_headless(run_root):
    nb = execute("02_kill_and_recover.ipynb", run_root)
    outputs = output_text(nb)
    assert "replica 1 is back" in outputs and "'survivor_steps_lost': 0" in outputs
    assert "'stopped'" in outputs


@pytest.mark.slow
@pytest.mark.maxtext
@pytest.mark.skipif(not (NOTEBOOKS.parent / ".venv-maxtext" / "bin" / "python").exists(),
                    reason=".venv-maxtext missing: run scripts/setup-maxtext.sh (make test does)")
def test_maxtext_restart_notebook_runs_headless(run_root, monkeypatch):
    monkeypatch.setenv("WORKBENCH_JAX_CACHE", str(run_root.parent / "jax-cache"))
    nb = execute("03_maxtext_restart.ipynb", run_root, timeout=1200)
    outputs = output_text(nb)
    assert "checkpoint-restart" in outputs and "elastic" in outputs
    runs = [attach(d) for d in run_root.iterdir() if d.is_dir() and (d / "run.json").exists()]
    mx = next(r for r in runs if r.spec.trainer == "maxtext")
    assert mx.state() == "completed" and mx.summary()["restarts"] == 1
