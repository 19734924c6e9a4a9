"""``Run.metrics()``'s columnar read path gives the same DataFrame as the event dicts, on a real run's log."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd

import workbench as wb
from workbench.analysis import StepColumns, metrics_frame
from workbench.events.reader import EventReader


def test_columnar_metrics_equal_the_dict_path_on_a_real_log_with_a_torn_and_a_malformed_line(
    start_run, run_root, tmp_path
):
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
    # the controller indexed every step row before it ended the run; only the two appended lines were parsed
    assert columns.indexed_rows == len(got) > 0
    assert len(got) == sum(1 for p in files for line in p.read_text().splitlines() if '"kind": "step"' in line) - 2
    pd.testing.assert_frame_equal(got, expected)
    assert columns.skipped_lines == reader.skipped_lines == 1
    assert got["t"].max() < 9999999999.0  # the torn line is not read until it is complete

    with open(files[0], "ab") as f:  # the torn line completed, and a diverged loss (NaN, Python's JSON)
        f.write(b'ep": 31, "loss": 1.0, "committed": true}\n')
        f.write(
            json.dumps(
                {
                    "t": 9999999999.5,
                    "kind": "step",
                    "replica": 0,
                    "attempt": 0,
                    "step": 32,
                    "loss": float("nan"),
                    "committed": False,
                }
            ).encode()
            + b"\n"
        )
    more = columns.frame()
    pd.testing.assert_frame_equal(more, metrics_frame(EventReader(copy).poll()))
    assert more["step"].iloc[-2:].tolist() == [31, 32] and math.isnan(more["loss"].iloc[-1])
    pd.testing.assert_frame_equal(wb.attach(copy).metrics(), more)


def test_columnar_metrics_read_incrementally_equal_one_read_of_the_whole_log(tmp_path):
    """A live run is read a poll at a time; fields that only some polls carry keep the dtype one read gives."""
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(tmp_path / "runs", "inc", load_spec("demo", {"faults": []}).to_dict())
    writers = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="inc", replica=r, attempt=0) for r in range(3)]
    columns = StepColumns(run_dir)
    writers[0].emit("step", step=0, loss=3.0, committed=False, participating=True)  # one file, no weights yet
    columns.frame()
    for step in range(1, 60):
        for r, w in enumerate(writers):
            fields = dict(
                step=step,
                loss=3.0 - step / 100,
                committed=step % 13 != 0,
                participating=True,
                participants=3,
                quorum_id=step // 20,
                step_time_s=0.01,
                batch_seed=[0, step, r],
            )
            if step % 10 == 0:
                fields["weights"] = f"{step:016x}"
            if step > 40:
                fields["extra"] = step * 2
            w.emit("heartbeat", step=step)
            w.emit("step", **fields)
        if step % 7 == 0:
            columns.frame()
    got = columns.frame()
    expected = metrics_frame(EventReader(run_dir).poll())
    pd.testing.assert_frame_equal(got, expected)
    assert len(got) == 3 * 59 + 1 and columns.fallback_chunks == 0


def test_columnar_metrics_keep_list_fields_and_time_order_across_files_written_out_of_order(tmp_path):
    """List fields of varying length (ints, floats, bools, empty) and files whose times interleave,
    equal t across files included: the merged columns equal the dict path's frame, poll after poll."""
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(tmp_path / "runs", "lists", load_spec("demo", {"faults": []}).to_dict())
    writers = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="lists", replica=r, attempt=0) for r in range(3)]
    columns = StepColumns(run_dir)
    for step in range(1, 41):
        for r in (2, 0, 1):  # the third file's rows come first in time
            writers[r].emit(
                "step",
                step=step,
                loss=1.0 / step,
                committed=True,
                participating=True,
                batch_seed=[0, step, r],
                ids=list(range(step % 4)),
                scales=[0.5 * step, -0.0],
                flags=[step % 2 == 0],
            )
        if step % 9 == 0:
            got = columns.frame()
            pd.testing.assert_frame_equal(got, metrics_frame(EventReader(run_dir).poll()))
    for w in writers:
        w.close()
    got = columns.frame()
    pd.testing.assert_frame_equal(got, metrics_frame(EventReader(run_dir).poll()))
    assert got["replica"].tolist()[:3] == [2, 0, 1] and got["t"].is_monotonic_increasing
    assert got["ids"].iloc[-1] == [] and got["scales"].iloc[0] == [0.5, -0.0] and got["flags"].iloc[1] == [False]
    assert columns.fallback_chunks == 0


def test_a_reader_starts_from_the_controllers_index_and_ignores_one_it_cannot_trust(tmp_path):
    """``analysis.step_index``: the rows read back equal the dict path's (strings with gaps, a field that
    appears late, lists of any length, a null, a NaN loss), the bytes after the index are parsed, and an
    index that is corrupt or ahead of a file is not used."""
    from workbench.analysis import step_index
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.spec.load import load_spec

    run_dir = rundir.create(tmp_path / "runs", "idx", load_spec("demo", {"faults": []}).to_dict())
    writers = [EventWriter(run_dir, f"replica-{r}.attempt-0", run="idx", replica=r, attempt=0) for r in range(2)]

    def steps(first: int, last: int) -> None:
        for step in range(first, last):
            for r, w in enumerate(writers):
                fields = dict(
                    step=step,
                    loss=float("nan") if step == 17 else 1.0 / step,
                    committed=True,
                    participating=True,
                    batch_seed=[0, step, r],
                    ids=list(range(step % 3)),
                    note=None,
                )
                if step % 5 == 0:
                    fields["weights"] = f"{step:016x}"
                if step > 12:
                    fields["extra"] = step
                w.emit("heartbeat", step=step)
                w.emit("step", **fields)

    steps(1, 20)
    assert step_index.write(StepColumns(run_dir, index=False), run_dir)
    steps(20, 26)
    expected = metrics_frame(EventReader(run_dir).poll())
    columns = StepColumns(run_dir)
    assert columns.indexed_rows == 2 * 19
    pd.testing.assert_frame_equal(columns.frame(), expected)
    assert columns.frame()["note"].isna().all() and columns.frame()["weights"].iloc[-1] == f"{25:016x}"

    index = step_index.path_of(run_dir)
    good = index.read_bytes()
    index.write_bytes(good[: len(good) // 2])  # torn, as a writer that bypassed the rename would leave it
    torn = StepColumns(run_dir)
    assert torn.indexed_rows == 0
    pd.testing.assert_frame_equal(torn.frame(), expected)

    index.write_bytes(good)
    first = run_dir / "events" / "replica-0.attempt-0.jsonl"
    lines = first.read_bytes().splitlines(keepends=True)
    first.write_bytes(b"".join(lines[:10]))  # the file is now shorter than the index says it was
    behind = StepColumns(run_dir)
    assert behind.indexed_rows == 0
    pd.testing.assert_frame_equal(behind.frame(), metrics_frame(EventReader(run_dir).poll()))
