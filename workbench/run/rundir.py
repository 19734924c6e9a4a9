"""The run directory: the only contract between jobs and the notebook.

```
<run_root>/<run-id>/          0700, private to the user
  run.json                     resolved spec, versions, code revision, who/when (written once)
  events/<writer>.jsonl        one append-only file per writing process
  jobs/                        submitit's folder: pickles, stdout/stderr of every job
  checkpoints/                 trainer checkpoints
  lighthouse/                  the lighthouse's log
  controller.log               the run controller's own output
  process-marker               0600: the secret every process of the run carries in its environment
```
Nothing secret goes into ``run.json`` or the events. The process marker
(``workbench.cluster.procs.Marker``) is what a process shows to be signalled
as the run's: the controller is started with it, and everything the run starts
inherits it.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from workbench.paths import CHECKOUT, PACKAGE_DIR

RUN_JSON = "run.json"
_PACKAGES = ("torch", "torchft-nightly", "torchft", "submitit", "pandas", "plotly", "ipywidgets", "torchtitan")


def new_run_id(name: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{secrets.token_hex(3)}"


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def code_revision() -> dict:
    root = CHECKOUT
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", None
    return {"commit": commit or None, "dirty": dirty, "snapshot": source_snapshot()}


def source_snapshot() -> str:
    """sha256 over the workbench package's ``*.py`` files (relative path and bytes, in path order).

    Identifies the code a run used even when the tree has uncommitted edits
    (``dirty``), where the commit alone does not.
    """
    import hashlib

    pkg = PACKAGE_DIR
    h = hashlib.sha256()
    for path in sorted(pkg.rglob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        h.update(str(path.relative_to(pkg)).encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def create(run_root: str | os.PathLike, run_id: str, spec: dict, extra: dict | None = None) -> Path:
    """Create the run directory and write run.json atomically (tmp + rename)."""
    root = Path(run_root).expanduser().resolve()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir = root / run_id
    run_dir.mkdir(mode=0o700)
    for sub in ("events", "jobs", "checkpoints", "lighthouse"):
        (run_dir / sub).mkdir(mode=0o700)
    record = {
        "run_id": run_id,
        "spec": spec,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
        "code": code_revision(),
        **(extra or {}),
    }
    write_json(run_dir / RUN_JSON, record)
    # Late: a job imports this module (``dir_bytes``), and needs nothing of the cluster package.
    from workbench.cluster.procs import Marker

    Marker.create(run_dir)
    return run_dir


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def write_json_text(path: Path, text: str) -> None:
    """Replace a small file atomically (tmp + rename), private to the user."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def dir_bytes(path) -> int:
    """Bytes on disk under ``path`` (a checkpoint's size); files that vanish meanwhile count 0."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def read_record(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / RUN_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{run_dir}: not a run directory (no {RUN_JSON})") from None
    except ValueError as e:
        raise ValueError(f"{path}: unreadable ({e})") from None


def is_run_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / RUN_JSON).is_file()
