"""The cluster drill on the real local Slurm: what preemption, ``--signal``, requeue and arrays do there.

The dev cluster's ``slurm.conf`` (``workbench/devcluster/config.py``) sets ``KillWait=2``: a job
being ended gets SIGTERM, and SIGKILL at least 2 s later. Everything else the drill reports is
checked against what the probes themselves recorded in the drill directory.
"""

from __future__ import annotations

import json

import pytest

from workbench.cluster.slurm.drill import drill

from .conftest import local_slurm, slurm_prerequisites

pytestmark = [pytest.mark.slurm, pytest.mark.slow, *slurm_prerequisites()]


def test_the_drill_reports_signals_requeue_and_arrays_of_the_local_slurm(tmp_path, run_root):
    with local_slurm(tmp_path / "slurm") as info:
        table = drill(conf=info["env"]["SLURM_CONF"])
    answers = {(r.probe, r.question): r for r in table.itertuples()}
    (drill_dir,) = (run_root / "drills").iterdir()
    probe = {
        name: [json.loads(line) for line in (drill_dir / f"{name}.log").read_text().splitlines()]
        for name in ("preempt", "requeue", "array-0", "array-1", "signal")
    }

    preempt = answers[("preempt", "signals the task gets (scancel, as PreemptMode=CANCEL does)")]
    assert "SIGTERM" in preempt.answer.split(", ")
    assert [r["sig"] for r in probe["preempt"] if r["ev"] == "signal"] == preempt.answer.split(", ")
    assert 2.0 <= answers[("preempt", "seconds from the first signal to the kill")].seconds < 30  # KillWait=2

    starts = [r for r in probe["requeue"] if r["ev"] == "start"]
    assert [s["restart"] for s in starts] == [0, 1] and starts[0]["job"] == starts[1]["job"]
    assert answers[("requeue", "runs again under the same job id")].answer == "yes"
    assert answers[("requeue", "seconds from requeue to running again")].seconds > 0

    assert answers[("array", "task 1 requeued alone, task 0 untouched")].answer == "yes"
    back = [r for r in probe["array-1"] if r["ev"] == "start"]
    assert [r["restart"] for r in back] == [0, 1]
    # Task 0 ran on untouched while task 1 was requeued (the drill's final scancel signals it later).
    assert [r["ev"] for r in probe["array-0"] if r["t"] <= back[1]["t"]] == ["start"]

    signal_row = next(r for (p, q), r in answers.items() if p == "signal" and q.startswith("--signal"))
    assert "SIGUSR2" in signal_row.answer.split(", ") and signal_row.seconds > 0

    requeue_job = starts[0]["job"]
    sacct = answers[("requeue", "sacct records")].answer
    assert sacct.startswith(f"{requeue_job}: REQUEUED"), sacct
