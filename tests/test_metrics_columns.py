"""``Run.metrics()``'s columnar read path gives the same DataFrame as the event dicts, on a real run's log."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd

import workbench as wb
from workbench.analysis import StepColumns, metrics_frame
from workbench.events import EventReader


def test_columnar_metrics_equal_the_dict_path_on_a_real_log_with_a_torn_and_a_malformed_line(start_run, run_root, tmp_path):
    run = start_run("demo", {"faults": [], "replicas": 2, "min_replicas": 1, "steps": 30, "run_root": str(run_root)})
    assert run.wait(timeout=240)["state"] == "completed"
    copy = tmp_path / "copy"
    shutil.copytree(run.run_dir, copy)
    files = sorted((copy / "events").glob("replica-*.jsonl"))
    with open(files[0], "ab") as f:  # a complete line that is not JSON, then a write in progress
        f.write(b'{"t": 1.0, "kind": "step", "step": \n')
        f.write(b'{"t": 9999999999.0, "kind": "step", "replica": 0, "st')
    reader, columns = EventReader(copy), StepColumns(copy)
    expected = metrics_frame(reader.poll())
    got = columns.frame()
    assert len(got) == sum(1 for p in files for line in p.read_text().splitlines() if '"kind": "step"' in line) - 2
    pd.testing.assert_frame_equal(got, expected)
    assert columns.skipped_lines == reader.skipped_lines == 1
    assert got["t"].max() < 9999999999.0  # the torn line is not read until it is complete

    with open(files[0], "ab") as f:  # the torn line completed, and a diverged loss (NaN, Python's JSON)
        f.write(b'ep": 31, "loss": 1.0, "committed": true}\n')
        f.write(json.dumps({"t": 9999999999.5, "kind": "step", "replica": 0, "attempt": 0, "step": 32,
                            "loss": float("nan"), "committed": False}).encode() + b"\n")
    more = columns.frame()
    pd.testing.assert_frame_equal(more, metrics_frame(EventReader(copy).poll()))
    assert more["step"].iloc[-2:].tolist() == [31, 32] and math.isnan(more["loss"].iloc[-1])
    pd.testing.assert_frame_equal(wb.attach(copy).metrics(), more)
