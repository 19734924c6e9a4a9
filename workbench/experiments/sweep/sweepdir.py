"""The sweep directory: what a sweep is on disk, and its record.

```
<run_root>/sweeps/<sweep-id>/
  sweep.json                  base spec (resolved), how the points were made, the point list (written once)
  events/controller.jsonl     the sweep controller: start, submit (point -> run dir), point_error, sweep_end
  events/control-<pid>.jsonl  a kernel or CLI that ended a sweep whose controller was gone
  controller.log              the sweep controller's own output
  process-marker              0600: the secret the sweep controller carries (``workbench.cluster.procs.Marker``)
```

The points' runs are ordinary run directories under the run root (see
``workbench/rundir.py``); the controller's ``submit`` events are the only link
from a point to its run.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from workbench.cluster.procs import Marker
from workbench.errors import SpecError
from workbench.run import rundir
from workbench.spec.models import Spec

SWEEP_JSON = "sweep.json"
SWEEPS_DIR = "sweeps"


def create(
    base: Spec,
    points: list[dict],
    max_parallel: int,
    *,
    grid: Optional[Mapping[str, Sequence[Any]]] = None,
    random: Optional[Mapping[str, Sequence[Any]]] = None,
    n: Optional[int] = None,
    seed: int = 0,
    lock: Optional[str] = None,
    lock_turn_s: float = 0.0,
) -> Path:
    """Create ``<run_root>/sweeps/<sweep-id>/`` for ``base`` and write ``sweep.json`` once, atomically.

    ``grid``/``random``/``n``/``seed`` record how ``points`` were made (neither
    given: a list of points). The swept keys keep the user's order (no key sorting).
    """
    sweep_id = rundir.new_run_id(base.name)
    root = Path(base.run_root).expanduser().resolve() / SWEEPS_DIR
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    sweep_dir = root / sweep_id
    sweep_dir.mkdir(mode=0o700)
    (sweep_dir / "events").mkdir(mode=0o700)
    record = {
        "sweep_id": sweep_id,
        "base": base.to_dict(),
        "method": "grid" if grid is not None else "random" if random is not None else "points",
        "grid": {k: list(v) for k, v in grid.items()} if grid is not None else None,
        "random": {k: list(v) for k, v in random.items()} if random is not None else None,
        "n": n,
        "seed": seed if random is not None else None,
        "points": points,
        "max_parallel": max_parallel,
        "lock": lock,
        "lock_turn_s": lock_turn_s,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "code": rundir.code_revision(),
    }
    rundir.write_json_text(sweep_dir / SWEEP_JSON, json.dumps(record, indent=2) + "\n")
    Marker.create(sweep_dir)
    return sweep_dir


def read_record(sweep_dir: Union[str, os.PathLike]) -> dict:
    path = Path(sweep_dir) / SWEEP_JSON
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"sweep_dir: {str(sweep_dir)!r} is not a sweep directory (no {SWEEP_JSON})") from None


def is_sweep_dir(path: Union[str, os.PathLike]) -> bool:
    return (Path(path) / SWEEP_JSON).is_file()


def list_sweeps(run_root: Union[str, os.PathLike]) -> list[Path]:
    root = Path(run_root).expanduser() / SWEEPS_DIR
    return sorted(p for p in root.iterdir() if is_sweep_dir(p)) if root.is_dir() else []
