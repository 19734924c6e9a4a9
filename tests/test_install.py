"""The install tells the truth: `make demo`/`make test` stop with one line naming what is missing,
and environment.yml installs the set make does. Runs make and the check script for real, in a copy
of the repository's set-up files (nothing is installed: each case stops at its check)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def setup_tree(tmp_path):
    """The files `make` reads, without .venv or .venv-maxtext: a fresh clone's set-up."""
    for name in (
        "Makefile",
        "pyproject.toml",
        "requirements-titan.txt",
        "requirements-browser.txt",
        "requirements-maxtext.txt",
    ):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    return tmp_path


def _bare_path(tmp_path: Path, keep: tuple[str, ...]) -> str:
    """A PATH with only the named commands (links to the real ones): no python3.12, no pyenv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in keep:
        real = shutil.which(cmd)
        assert real, cmd
        (bin_dir / cmd).symlink_to(real)
    return str(bin_dir)


def _make(tree: Path, target: str, env: dict) -> subprocess.CompletedProcess:
    make = shutil.which("make")
    assert make, "GNU make is what the README's two commands assume"
    return subprocess.run(
        [make, "-C", str(tree), target],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("MAXTEXT_PYTHON", "PYTHON")} | env,
    )


@pytest.mark.parametrize("target", ["demo", "test"])
def test_make_without_a_usable_python_stops_with_one_line(setup_tree, target):
    r = _make(setup_tree, target, {"PYTHON": "/nonexistent/python3.11"})
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines() if line.startswith(f"make {target}:")]
    assert ours == [
        f"make {target}: needs a Python >= 3.11 as PYTHON (now '/nonexistent/python3.11'); "
        "Debian/Ubuntu: apt-get install python3, or PYTHON=/path/to/python3.11"
    ], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (setup_tree / ".venv").exists()


def test_make_test_without_python312_names_it_before_installing_anything(setup_tree, tmp_path):
    python311 = str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")
    path = _bare_path(tmp_path, ("bash", "dirname", "env", "id"))
    r = _make(setup_tree, "test", {"PYTHON": python311, "PATH": path})
    assert r.returncode != 0
    ours = [line for line in r.stderr.splitlines() if line.startswith("make test:")]
    assert len(ours) == 1 and "MaxText needs a Python >= 3.12" in ours[0] and "pyenv install 3.12.1" in ours[0], (
        r.stderr
    )
    assert not (setup_tree / ".venv").exists() and not (setup_tree / ".venv-maxtext").exists()


def test_environment_yml_installs_what_make_installs():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    makefile = (REPO / "Makefile").read_text()
    browser = (REPO / "scripts" / "setup-browser.sh").read_text()
    # what make installs: the TORCH default, the project with its extras, and the -r files of env and browser-env
    torch = re.search(r"^TORCH\s*\?=\s*(\S+)", makefile, re.M).group(1)
    extras = re.search(r'-e "\.\[(\w+)\]"', makefile).group(1)
    files = set(re.findall(r"-r (requirements-[\w-]+\.txt)", makefile + browser))
    assert torch in pip and f"-e .[{extras}]" in pip
    assert {p.split()[1] for p in pip if p.startswith("-r ")} == files
    assert env["dependencies"][0] == "python=3.11"
