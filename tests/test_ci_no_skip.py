"""Under ``CI=true`` a missing prerequisite fails the suite, wherever the skip comes from (tests/conftest.py)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("where", ["module", "test"])
def test_a_skip_for_a_missing_prerequisite_fails_under_ci(tmp_path, where):
    """A module-level ``pytest.importorskip`` skips its module while collecting, before any test exists: the
    per-test hook never saw it (torchtitan missing skipped all of tests/test_titan.py, green under CI=true)."""
    suite = tmp_path / "tests"
    suite.mkdir()
    (suite / "__init__.py").write_text("")
    shutil.copy(HERE / "conftest.py", suite / "conftest.py")
    skip = 'pytest.importorskip("no_such_module_here")'
    body = f"{skip}\n\n\ndef test_it():\n    pass\n" if where == "module" else f"\n\ndef test_it():\n    {skip}\n"
    (suite / "test_needs_it.py").write_text("import pytest\n" + body)
    (suite / "test_other.py").write_text("def test_fine():\n    pass\n")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"]
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    run = lambda **extra: subprocess.run(
        argv, cwd=tmp_path, env={**env, **extra}, capture_output=True, text=True, timeout=120
    )
    ci = run(CI="true")
    assert ci.returncode != 0, ci.stdout
    assert "skipped under CI=true" in ci.stdout and "no_such_module_here" in ci.stdout, ci.stdout
    local = run()
    assert local.returncode == 0 and "skipped" in local.stdout, local.stdout
