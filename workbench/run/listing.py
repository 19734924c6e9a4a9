"""The runs under a run root, one row each: what ``workbench ls`` prints.

Each run directory is attached (a :class:`~workbench.run.handle.Run` reads its
record and events) and asked for its ``status()``; a directory that cannot be
read is listed as unreadable rather than ending the listing.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Union

import pandas as pd

from workbench.run import rundir
from workbench.run.handle import attach


def runs_listing(run_root: Union[str, os.PathLike]) -> pd.DataFrame:
    """Every run directory under ``run_root``: state, trainer, steps, faults, age (``workbench ls``)."""
    root = Path(run_root).expanduser()
    rows: list[dict[str, Any]] = []
    now = datetime.datetime.now(datetime.timezone.utc)
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not rundir.is_run_dir(d):
            continue
        try:
            run = attach(d)
            st = run.status()
        except Exception as e:  # a damaged run directory is listed, not fatal
            rows.append({"run_id": d.name, "state": f"unreadable ({type(e).__name__})", "run_dir": str(d)})
            continue
        created = run.record.get("created")
        age = (now - datetime.datetime.fromisoformat(created)).total_seconds() if created else None
        rows.append(
            {
                "run_id": run.id,
                "state": st["state"],
                "trainer": st["trainer"],
                "cluster": st["cluster"],
                "step": st["step"],
                "steps_target": st["steps_target"],
                "faults": st["faults"],
                "restarts": st["restarts"],
                "age_s": age,
                "run_dir": str(run.run_dir),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "run_id",
            "state",
            "trainer",
            "cluster",
            "step",
            "steps_target",
            "faults",
            "restarts",
            "age_s",
            "run_dir",
        ],
    )
